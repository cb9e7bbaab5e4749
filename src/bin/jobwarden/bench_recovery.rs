//! The recovery part of `jobwarden bench`: how long jobs wait after their worker process is
//! killed with `kill -9`, measured with real worker processes (`jobwarden run` children) and
//! the default liveness settings:
//! - restart: the worker comes back under the same hostname (a pod restart) — start-up
//!   reconciliation;
//! - gone: it never comes back and another worker takes over — the heartbeat reaper.

use anyhow::{Context, Result};
use jobwarden::config::{Config, HandlerConfig, QueueConfig};
use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Jobs in flight when the worker is killed.
const JOBS: usize = 20;

/// First and second start of each job, as the application saw them.
type Starts = Arc<Mutex<HashMap<String, Vec<Instant>>>>;

pub async fn run(base: &Config) -> Result<()> {
    let starts: Starts = Arc::new(Mutex::new(HashMap::new()));
    let url = hold_app(starts.clone()).await?;
    for scenario in ["restart", "gone"] {
        starts.lock().unwrap().clear();
        let took = scenario_run(base, &url, &starts, scenario).await?;
        let mut t = took.clone();
        t.sort();
        println!(
            "recovery after kill -9 ({scenario}): {JOBS} in-flight jobs running again after p50 {:.2}s, max {:.2}s{}",
            t[t.len() / 2].as_secs_f64(),
            t.last().map(|d| d.as_secs_f64()).unwrap_or(0.0),
            if scenario == "restart" {
                " (from the new process's start; same hostname)"
            } else {
                " (from the kill; another worker takes over; defaults: beat 5s, dead after 15s)"
            }
        );
    }
    Ok(())
}

async fn scenario_run(
    base: &Config,
    url: &str,
    starts: &Starts,
    scenario: &str,
) -> Result<Vec<Duration>> {
    let policy = QueueConfig {
        concurrency: JOBS,
        handler: Some(HandlerConfig::Http { url: url.into() }),
        ..QueueConfig::default()
    };
    let (config, store, broker) = crate::bench::provisioned(base, "benchr", "r", policy).await?;
    let name = config.database.schema.clone();
    let path = std::env::temp_dir().join(format!("{name}.toml"));
    std::fs::write(&path, config.to_redacted_toml())?;
    let spawn = |host: &str| -> Result<Child> {
        Command::new(std::env::current_exe()?)
            .args(["--config", path.to_str().expect("utf-8"), "run"])
            .env("JOBWARDEN_WORKER__HOSTNAME", host)
            .env("RUST_LOG", "error")
            .stdin(Stdio::null())
            .spawn()
            .context("starting a worker process")
    };
    let mut a = spawn("bench-a")?;
    for i in 0..JOBS {
        let body = format!(r#"{{"id":"r-{i}","payload":{{}}}}"#);
        broker
            .js
            .publish(broker.subject("r"), body.into())
            .await?
            .await?;
    }
    wait(starts, 1, Duration::from_secs(30)).await?;
    let mut others = Vec::new();
    if scenario == "gone" {
        others.push(spawn("bench-b")?);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(a.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    let _ = a.wait();
    let from = Instant::now();
    if scenario == "restart" {
        others.push(spawn("bench-a")?);
    }
    wait(starts, 2, Duration::from_secs(60)).await?;
    let took: Vec<Duration> = starts
        .lock()
        .unwrap()
        .values()
        .map(|v| v[1].saturating_duration_since(from))
        .collect();
    for mut c in others {
        let _ = c.kill();
        let _ = c.wait();
    }
    let _ = std::fs::remove_file(&path);
    let _ = broker.js.delete_stream(&config.nats.stream).await;
    store.drop_schema().await?;
    Ok(took)
}

/// Waits until every job has started `n` times.
async fn wait(starts: &Starts, n: usize, limit: Duration) -> Result<()> {
    let begin = Instant::now();
    loop {
        {
            let s = starts.lock().unwrap();
            if s.len() == JOBS && s.values().all(|v| v.len() >= n) {
                return Ok(());
            }
        }
        if begin.elapsed() > limit {
            anyhow::bail!("jobs did not start {n} time(s) within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// An application that records each start and never answers (the job stays in flight).
async fn hold_app(starts: Starts) -> Result<String> {
    let app = axum::Router::new().route(
        "/jobs",
        axum::routing::post(move |body: axum::body::Bytes| {
            let starts = starts.clone();
            async move {
                let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                if let Some(id) = v["id"].as_str() {
                    starts
                        .lock()
                        .unwrap()
                        .entry(id.to_string())
                        .or_default()
                        .push(Instant::now());
                }
                std::future::pending::<()>().await;
                axum::http::StatusCode::OK
            }
        }),
    );
    // The server task runs for the rest of the bench.
    Ok(crate::bench::serve_local(app).await?.0)
}
