//! `jobwarden demo`: the product in one command. Starts a throwaway nats-server and
//! PostgreSQL (unless told to use running ones), a small demo application, and several
//! `jobwarden run` worker processes; publishes a mixed workload the way producers do (plain
//! NATS publishes to `jobs.<queue>`), shows progress while it drains, and prints the final
//! per-queue counts and why the dead jobs died. Midway it kills one worker with `kill -9`
//! and starts it again under the same hostname: its jobs are taken back and run again.
//!
//! Queues (modelled on the seed workload):
//! - `email` (http): the app "sends" in 20–60 ms; 10 % answer 503 and are retried.
//! - `webhooks` (http): 30 % answer 503; a job aimed at a dead endpoint fails every time
//!   and is dead-lettered after 5 attempts.
//! - `pdf` (exec): a shell script reports stages on stdout; a corrupt document exits 65
//!   (permanent) and is dead-lettered at once.
//! - `images` (http): reports progress three times through the sidecar's local API.

use crate::testkit::{NatsServer, PgCluster};
use anyhow::{Context, Result};
use jobwarden::redact;
use jobwarden::store::Store;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug, Clone)]
pub struct DemoArgs {
    /// Worker processes to start.
    #[arg(long, default_value_t = 3)]
    pub workers: usize,
    /// Jobs to publish.
    #[arg(long, default_value_t = 600)]
    pub jobs: usize,
    /// Use this PostgreSQL instead of starting a throwaway one.
    #[arg(long)]
    pub database_url: Option<String>,
    /// Use this nats-server (with JetStream) instead of starting a throwaway one.
    #[arg(long)]
    pub nats_url: Option<String>,
    /// Keep the workers and the dashboard running after the summary, until Ctrl-C.
    #[arg(long)]
    pub hold: bool,
}

const PDF_SCRIPT: &str = r#"payload=$(cat)
echo '{"stage":"layout","progress":0.2}'
sleep 0.05
echo '{"stage":"render","progress":0.6}'
sleep 0.1
case "$payload" in *'"corrupt":true'*) echo "corrupt input: cannot parse document" >&2; exit 65;; esac
echo '{"stage":"upload","progress":0.9}'
echo '{"result":{"pages":3}}'"#;

// Long on purpose: the demo is a script told in order (start, publish, kill, restart, report).
#[allow(clippy::too_many_lines)]
pub async fn run(args: DemoArgs) -> Result<()> {
    let started = Instant::now();
    let nats = match &args.nats_url {
        Some(_) => None,
        None => Some(NatsServer::start().context("starting a throwaway nats-server")?),
    };
    let pg = match &args.database_url {
        Some(_) => None,
        None => Some(PgCluster::start().context("starting a throwaway PostgreSQL")?),
    };
    let nats_url = args
        .nats_url
        .clone()
        .unwrap_or_else(|| nats.as_ref().expect("started").url());
    let db_url = args
        .database_url
        .clone()
        .unwrap_or_else(|| pg.as_ref().expect("started").url());
    println!("== jobwarden demo ==");
    println!(
        "nats-server {} ({}), PostgreSQL {} ({})",
        redact::url(&nats_url),
        if nats.is_some() { "throwaway" } else { "given" },
        redact::url(&db_url),
        if pg.is_some() { "throwaway" } else { "given" }
    );

    let app = demo_app().await?;
    let schema = crate::testkit::unique_name("demo");
    let dir = std::env::temp_dir().join(&schema);
    std::fs::create_dir_all(&dir)?;
    let config_path = dir.join("jobwarden.toml");
    std::fs::write(&config_path, demo_config(&db_url, &nats_url, &schema, &app))?;
    println!("configuration: {}", config_path.display());

    // Migrate and provision once up front, so jobs published before the workers are up wait.
    let config = jobwarden::config::Config::load(Some(&config_path))?;
    let store = Store::connect(&config.database).await?;
    store.migrate().await?;
    let broker = jobwarden::broker::Broker::connect(&config.nats).await?;
    broker.provision_stream().await?;
    for q in config.queues.keys() {
        broker
            .provision_consumer(&jobwarden::broker::Lane::bare(q))
            .await?;
    }

    let exe = std::env::current_exe()?;
    // demo-0 serves the dashboard, with an admin token so retry and discard can be tried.
    let dashboard = format!("127.0.0.1:{}", crate::testkit::free_port());
    let token = format!("{:032x}", rand::random::<u128>());
    let spawn = |i: usize| -> Result<Child> {
        let mut cmd = Command::new(&exe);
        cmd.args(["--config", config_path.to_str().expect("utf-8 path"), "run"])
            .env("JOBWARDEN_WORKER__HOSTNAME", format!("demo-{i}"))
            .env("RUST_LOG", "error")
            .stdin(Stdio::null());
        if i == 0 {
            cmd.env("JOBWARDEN_DASHBOARD__LISTEN", &dashboard)
                .env("JOBWARDEN_DASHBOARD__ADMIN_TOKEN", &token);
        }
        cmd.spawn().context("starting a worker process")
    };
    let mut workers: Vec<Child> = (0..args.workers).map(spawn).collect::<Result<_>>()?;
    println!(
        "started {} workers (demo-0 … demo-{})",
        args.workers,
        args.workers - 1
    );
    println!(
        "dashboard: http://{dashboard}/  (served by demo-0; admin token {token}; open it to watch the queues drain{})",
        if args.hold { "" } else { ", or run with --hold to keep it up after the summary" }
    );

    // Publish like a producer in any language would: plain JSON to jobs.<queue>.
    let mut acks = Vec::new();
    for i in 0..args.jobs {
        let (queue, body) = match i % 4 {
            0 => (
                "email",
                json!({"to": format!("user{i}@example.com"), "template": "welcome"}),
            ),
            1 => (
                "webhooks",
                json!({"url": if i % 97 == 1 { "https://dead.example.com/hook".to_string() } else { format!("https://hooks.example.com/{i}") }, "event": "order.paid"}),
            ),
            2 => ("pdf", json!({"doc": i, "corrupt": i % 50 == 2})),
            _ => (
                "images",
                json!({"image": format!("img-{i}.png"), "sizes": [64, 256, 1024]}),
            ),
        };
        let body = serde_json::to_vec(&body)?;
        acks.push(
            broker
                .js
                .publish(broker.subject(queue), body.into())
                .await?,
        );
    }
    for a in acks {
        a.await?;
    }
    println!(
        "published {} jobs to email, webhooks, pdf, images",
        args.jobs
    );

    let total = args.jobs as i64;
    let mut last = String::new();
    let mut crashed = false;
    loop {
        // Once work is flowing, crash a worker the hard way and start it again.
        let victim = 1;
        let mine = if !crashed && args.workers > 1 {
            let running = store.job_list(None, Some("processing"), None, 1000).await?;
            running
                .iter()
                .filter(|j| {
                    j.worker_id
                        .as_deref()
                        .unwrap_or("")
                        .starts_with(&format!("demo-{victim}-"))
                })
                .count()
        } else {
            0
        };
        if mine >= 3 {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(workers[victim].id() as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            let _ = workers[victim].wait();
            // How many it held is read from the attempts table at the end: the count above is
            // a moment old, and the worker claimed and finished jobs until the signal landed.
            println!("[{:>5.1}s] CRASH: kill -9 demo-{victim} while it runs jobs; restarting it under the same hostname",
                     started.elapsed().as_secs_f64());
            workers[victim] = spawn(victim)?;
            crashed = true;
        }
        let counts = store.job_counts().await?;
        let terminal: i64 = counts
            .iter()
            .filter(|(_, s, _)| matches!(s.as_str(), "completed" | "dead" | "cancelled"))
            .map(|(_, _, n)| n)
            .sum();
        let line = summary_line(&counts);
        if line != last {
            println!("[{:>5.1}s] {line}", started.elapsed().as_secs_f64());
            if let Some(sample) = running_sample(&store).await? {
                println!("         running: {sample}");
            }
            last = line;
        }
        if terminal >= total {
            break;
        }
        if started.elapsed() > Duration::from_secs(300) {
            anyhow::bail!("the demo did not finish in 5 minutes: {last}");
        }
        tokio::time::sleep(Duration::from_millis(if crashed { 500 } else { 100 })).await;
    }
    if crashed {
        let c = store.raw().await?;
        let row = c
            .query_one(
                "SELECT count(*) FILTER (WHERE outcome = 'restarted' AND worker_id LIKE 'demo-1-%'), \
                        count(*) FILTER (WHERE outcome = 'adopted') \
                 FROM job_attempts",
                &[],
            )
            .await?;
        let (taken_back, adopted): (i64, i64) = (row.get(0), row.get(1));
        println!("the {taken_back} jobs demo-1 held when it was killed were taken back at its restart (outcome `restarted`) and run again;");
        println!("messages a worker had received but not yet claimed are adopted from the stream within seconds (outcome `adopted`,");
        println!("{adopted} here), not after ack_wait (10 min)");
    }

    println!("\nfinal counts per queue:");
    print_table(&store.job_counts().await?);
    println!("\njobwarden stats (the job_stats view):");
    print!(
        "{}",
        jobwarden::view::format_stats(&store.job_stats().await?)
    );
    println!("\nwhy attempts ended (job_attempts.outcome):");
    let c = store.raw().await?;
    for r in c
        .query(
            "SELECT outcome, count(*) FROM job_attempts GROUP BY 1 ORDER BY 2 DESC",
            &[],
        )
        .await?
    {
        println!("  {:<16} {}", r.get::<_, String>(0), r.get::<_, i64>(1));
    }
    drop(c);
    println!("\ndead jobs and why (the 5 most recent):");
    for j in store.dead_list(None, 5).await? {
        println!(
            "  {:<12} {:<9} attempts {}/{}  {}",
            j.id,
            j.queue,
            j.attempts,
            j.max_attempts,
            j.last_error.unwrap_or_default()
        );
    }
    if args.hold {
        println!(
            "\nthe workers and the dashboard (http://{dashboard}/) keep running; Ctrl-C stops them"
        );
        tokio::signal::ctrl_c().await?;
    }
    for w in &mut workers {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(w.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    for w in &mut workers {
        let _ = w.wait();
    }
    println!(
        "\nall {total} jobs reached a final state in {:.1}s; workers stopped.",
        started.elapsed().as_secs_f64()
    );
    if args.database_url.is_some() {
        println!("the demo's tables are in schema {schema}; inspect them with SQL, e.g.:");
        println!("  SELECT queue, status, count(*) FROM {schema}.jobs GROUP BY 1, 2;");
        println!("  SELECT id, attempts, last_error FROM {schema}.jobs WHERE status = 'dead';");
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn demo_config(db: &str, nats: &str, schema: &str, app: &str) -> String {
    format!(
        r#"[database]
url = "{db}"
schema = "{schema}"

[nats]
url = "{nats}"
stream = "{stream}"

[worker]
api_listen = "127.0.0.1:0"
ops_listen = "127.0.0.1:0"
migrate = false
stale_after = "20s"
sweep_every = "5s"
# A message a killed worker had fetched but not claimed is adopted after this long.
adopt_after = "1s"

[queues.email]
concurrency = 8
max_attempts = 3
backoff = {{ kind = "exponential", base = "200ms" }}
handler = {{ kind = "http", url = "{app}/email" }}

[queues.webhooks]
concurrency = 8
max_attempts = 5
backoff = {{ kind = "exponential", base = "100ms" }}
handler = {{ kind = "http", url = "{app}/webhooks" }}

[queues.pdf]
concurrency = 4
max_attempts = 2
timeout = "30s"
backoff = {{ kind = "fixed", base = "300ms" }}
handler = {{ kind = "exec", command = ["sh", "-c", {script}] }}

[queues.images]
concurrency = 4
max_attempts = 3
handler = {{ kind = "http", url = "{app}/images" }}
"#,
        stream = schema.to_uppercase(),
        script = serde_json::to_string(PDF_SCRIPT).expect("string"),
    )
}

/// The application the workers hand jobs to.
async fn demo_app() -> Result<String> {
    use axum::http::StatusCode;
    use axum::routing::post;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let app = axum::Router::new()
        .route(
            "/email",
            post(|body: axum::body::Bytes| async move {
                let job: Value = serde_json::from_slice(&body).unwrap_or_default();
                tokio::time::sleep(Duration::from_millis(20 + rand::random::<u64>() % 40)).await;
                if job["attempt"] == json!(1) && rand::random::<f64>() < 0.1 {
                    return (StatusCode::SERVICE_UNAVAILABLE, "smtp 421 try later".to_string());
                }
                (StatusCode::OK, json!({"message_id": format!("<{}@demo>", job["id"].as_str().unwrap_or(""))}).to_string())
            }),
        )
        .route(
            "/webhooks",
            post(|body: axum::body::Bytes| async move {
                let job: Value = serde_json::from_slice(&body).unwrap_or_default();
                let dead = job["payload"]["url"].as_str().unwrap_or("").contains("dead");
                if dead || rand::random::<f64>() < 0.3 {
                    return (StatusCode::SERVICE_UNAVAILABLE, "endpoint returned 503".to_string());
                }
                (StatusCode::OK, String::new())
            }),
        )
        .route(
            "/images",
            post(|body: axum::body::Bytes| async move {
                let job: Value = serde_json::from_slice(&body).unwrap_or_default();
                let url = job["progress_url"].as_str().unwrap_or("").to_string();
                let client = reqwest::Client::new();
                for (i, size) in [64, 256, 1024].iter().enumerate() {
                    tokio::time::sleep(Duration::from_millis(60)).await;
                    let _ = client
                        .post(&url)
                        .json(&json!({"progress": (i + 1) as f32 / 3.0, "stage": format!("resize {size}px")}))
                        .send()
                        .await;
                }
                (StatusCode::OK, json!({"sizes": 3}).to_string())
            }),
        );
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(format!("http://{addr}"))
}

fn summary_line(counts: &[(String, String, i64)]) -> String {
    let mut by_status: BTreeMap<&str, i64> = BTreeMap::new();
    for (_, s, n) in counts {
        *by_status.entry(s.as_str()).or_default() += n;
    }
    ["queued", "scheduled", "processing", "completed", "dead"]
        .iter()
        .map(|s| format!("{s} {}", by_status.get(s).copied().unwrap_or(0)))
        .collect::<Vec<_>>()
        .join(" · ")
}

async fn running_sample(store: &Store) -> Result<Option<String>> {
    let rows = store.job_list(None, Some("processing"), None, 20).await?;
    Ok(rows.into_iter().find(|j| j.stage.is_some()).map(|j| {
        format!(
            "{} ({}) on {}: {} {:.0}%",
            j.id,
            j.queue,
            j.worker_id.unwrap_or_default(),
            j.stage.unwrap_or_default(),
            j.progress.unwrap_or(0.0) * 100.0
        )
    }))
}

fn print_table(counts: &[(String, String, i64)]) {
    let statuses = ["queued", "scheduled", "processing", "completed", "dead"];
    print!("  {:<10}", "queue");
    for s in statuses {
        print!(" {s:>10}");
    }
    println!();
    let mut queues: BTreeMap<&str, BTreeMap<&str, i64>> = BTreeMap::new();
    for (q, s, n) in counts {
        queues.entry(q.as_str()).or_default().insert(s.as_str(), *n);
    }
    for (q, m) in queues {
        print!("  {q:<10}");
        for s in statuses {
            print!(" {:>10}", m.get(s).copied().unwrap_or(0));
        }
        println!();
    }
}
