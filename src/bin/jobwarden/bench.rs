//! `jobwarden bench`: pushes no-op jobs through a real worker against real servers and prints
//! throughput, publish-to-handler-start latency percentiles, peak RSS and recovery times
//! (`bench_recovery`).
//!
//! Each run uses its own schema, stream and subject prefix (dropped afterwards), so it can
//! point at a shared PostgreSQL and nats-server. Phases, for the in-process Rust handler and
//! then the HTTP handler (a local no-op app):
//! 1. throughput: publish N jobs first, start the worker, time until all are completed;
//! 2. latency: with the worker idle and waiting, publish jobs at a steady rate; each payload
//!    carries its publish time, the handler records `start - publish`.
//!
//! The throughput phase also reports what each job cost PostgreSQL ([`PgCost`]): WAL bytes,
//! transactions, rows inserted and updated (and how many updates were HOT) per table, read
//! from the server's own counters around the phase.

use anyhow::{Context, Result};
use jobwarden::broker::Broker;
use jobwarden::config::{Config, HandlerConfig, QueueConfig};
use jobwarden::handler::{from_fn, Handler};
use jobwarden::store::Store;
use jobwarden::worker::{Stats, Worker};
use serde_json::json;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio_util::sync::CancellationToken;

#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// Jobs in the throughput phase.
    #[arg(long, default_value_t = 50_000)]
    pub jobs: usize,
    /// Jobs in the latency phase.
    #[arg(long, default_value_t = 2_000)]
    pub latency_jobs: usize,
    /// Publish rate in the latency phase (jobs per second).
    #[arg(long, default_value_t = 500)]
    pub rate: u64,
    /// Handler slots of the bench queue.
    #[arg(long, default_value_t = 512)]
    pub concurrency: usize,
    /// Skip the HTTP handler phases.
    #[arg(long)]
    pub no_http: bool,
    /// Skip the recovery phase (kill -9 of worker processes; about 30 s).
    #[arg(long)]
    pub no_recovery: bool,
    /// Start throwaway nats-server and PostgreSQL instead of the configured ones.
    #[arg(long)]
    pub throwaway: bool,
    /// A cluster-wide cap on the bench queue (to measure what flow control costs).
    #[arg(long)]
    pub global_concurrency: Option<u32>,
    /// A cluster-wide rate limit on the bench queue, e.g. 1000000/1s.
    #[arg(long)]
    pub rate_limit: Option<String>,
}

fn now_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_micros() as i64
}

/// Peak resident set size of this process (VmHWM), in MiB.
pub fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}

/// p-th percentile (0–100) of sorted samples.
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

pub async fn run(args: BenchArgs, config_path: Option<&Path>) -> Result<()> {
    let mut base = Config::load_connections(config_path)?;
    let _servers = if args.throwaway {
        let nats = crate::testkit::NatsServer::start()?;
        let pg = crate::testkit::PgCluster::start()?;
        base.nats.url = nats.url();
        base.database.url = pg.url();
        Some((nats, pg))
    } else {
        None
    };
    println!(
        "jobwarden bench: {} cores, PostgreSQL {}, NATS {}",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        jobwarden::config::redact_url(&base.database.url),
        jobwarden::config::redact_url(&base.nats.url)
    );
    let mut kinds = vec!["rust"];
    if !args.no_http {
        kinds.push("http");
    }
    for kind in kinds {
        let latencies = Arc::new(Mutex::new(Vec::<u64>::new()));
        let app = if kind == "http" {
            Some(NoopApp::start(latencies.clone()).await?)
        } else {
            None
        };
        let handler = app
            .as_ref()
            .map(|a| HandlerConfig::Http { url: a.url.clone() });
        let through = phase(
            &base,
            &args,
            handler.clone(),
            Phase::Throughput,
            latencies.clone(),
        )
        .await?;
        let lat = phase(&base, &args, handler, Phase::Latency, latencies).await?;
        println!(
            "{kind:>4} handler: {:>8.0} jobs/s ({} jobs in {:.2}s) | publish→start latency p50 {:.2} ms, p95 {:.2} ms, p99 {:.2} ms, max {:.2} ms ({} jobs at {}/s)",
            through.jobs as f64 / through.elapsed.as_secs_f64(),
            through.jobs,
            through.elapsed.as_secs_f64(),
            percentile(&lat.latencies_us, 50.0) as f64 / 1000.0,
            percentile(&lat.latencies_us, 95.0) as f64 / 1000.0,
            percentile(&lat.latencies_us, 99.0) as f64 / 1000.0,
            lat.latencies_us.last().copied().unwrap_or(0) as f64 / 1000.0,
            lat.jobs,
            args.rate,
        );
        if let Some(cost) = &through.cost {
            // Not "<kind> handler:": scripts read the throughput from that line.
            println!("{kind:>4} costs {}", cost.per_job(through.jobs));
        }
    }
    println!(
        "peak RSS (worker + bench publisher, one process): {:.1} MiB",
        peak_rss_mib()
    );
    if !args.no_recovery {
        crate::bench_recovery::run(&base).await?;
    }
    Ok(())
}

#[derive(PartialEq, Clone, Copy)]
enum Phase {
    Throughput,
    Latency,
}

struct PhaseResult {
    jobs: usize,
    elapsed: Duration,
    latencies_us: Vec<u64>,
    cost: Option<PgCost>,
}

/// What a phase cost PostgreSQL, from its own counters (`pg_current_wal_lsn()`,
/// `pg_stat_database`, `pg_stat_user_tables` of the phase's schema). The database counters
/// include anything else running on that database meanwhile.
#[derive(Debug, Default, Clone)]
pub struct PgCost {
    pub wal_bytes: i64,
    pub commits: i64,
    /// Per table of the schema: (table, inserted, updated, HOT-updated, deleted).
    pub tables: Vec<(String, i64, i64, i64, i64)>,
}

impl PgCost {
    async fn before(store: &Store) -> Result<(String, i64)> {
        let c = store.raw().await?;
        let r = c
            .query_one(
                "SELECT pg_current_wal_lsn()::text, xact_commit FROM pg_stat_database \
                 WHERE datname = current_database()",
                &[],
            )
            .await?;
        Ok((r.get(0), r.get(1)))
    }

    /// After the phase's connections closed (each flushes its counters as it ends).
    async fn after(store: &Store, before: (String, i64)) -> Result<PgCost> {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let c = store.raw().await?;
        c.batch_execute("SELECT pg_stat_clear_snapshot()").await?;
        let r = c
            .query_one(
                "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::text::pg_lsn)::int8, \
                 xact_commit FROM pg_stat_database WHERE datname = current_database()",
                &[&before.0],
            )
            .await?;
        let tables = c
            .query(
                "SELECT relname::text, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del \
                 FROM pg_stat_user_tables WHERE schemaname = current_schema() \
                   AND n_tup_ins + n_tup_upd + n_tup_del > 0 ORDER BY relname",
                &[],
            )
            .await?
            .into_iter()
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
            .collect();
        Ok(PgCost {
            wal_bytes: r.get(0),
            commits: r.get::<_, i64>(1) - before.1,
            tables,
        })
    }

    /// One line: "per job: 1.9 kB WAL, 0.05 commits; jobs +1.00 ins 1.00 upd (0 % HOT); …".
    pub fn per_job(&self, jobs: usize) -> String {
        let n = jobs.max(1) as f64;
        let mut parts = vec![format!(
            "{:.0} B WAL, {:.3} commits",
            self.wal_bytes as f64 / n,
            self.commits as f64 / n
        )];
        for (t, ins, upd, hot, del) in &self.tables {
            // Migrations and the worker's own row: not per-job costs.
            if ((ins + upd + del) as f64) < n / 100.0 {
                continue;
            }
            let mut p = format!("{t}: {:.2} ins", *ins as f64 / n);
            if *upd > 0 {
                p.push_str(&format!(
                    " {:.2} upd ({:.0} % HOT)",
                    *upd as f64 / n,
                    100.0 * *hot as f64 / *upd as f64
                ));
            }
            if *del > 0 {
                p.push_str(&format!(" {:.2} del", *del as f64 / n));
            }
            parts.push(p);
        }
        format!("per job: {}", parts.join("; "))
    }
}

async fn phase(
    base: &Config,
    args: &BenchArgs,
    http: Option<HandlerConfig>,
    phase: Phase,
    latencies: Arc<Mutex<Vec<u64>>>,
) -> Result<PhaseResult> {
    latencies.lock().unwrap().clear();
    let name = crate::testkit::unique_name("bench");
    let mut config = base.clone();
    config.database.schema = name.clone();
    config.nats.stream = name.to_uppercase();
    config.nats.subject_prefix = name.clone();
    config.worker.api_listen = "127.0.0.1:0".into();
    config.worker.ops_listen = "127.0.0.1:0".into();
    config.worker.hostname = Some("bench".into());
    let queue = QueueConfig {
        concurrency: args.concurrency,
        handler: Some(http.unwrap_or(HandlerConfig::Rust {
            name: "noop".into(),
        })),
        global_concurrency: args.global_concurrency,
        rate_limit: args.rate_limit.clone(),
        ..QueueConfig::default()
    };
    config.queues.insert("bench".into(), queue);
    config.validate()?;

    let lat = latencies.clone();
    let noop: Arc<dyn Handler> = from_fn(move |job| {
        let lat = lat.clone();
        async move {
            if let Some(t) = job.payload.get("t").and_then(|t| t.as_i64()) {
                lat.lock().unwrap().push((now_micros() - t).max(0) as u64);
            }
            Ok(None)
        }
    });
    let n = if phase == Phase::Throughput {
        args.jobs
    } else {
        args.latency_jobs
    };
    // Provision first so messages published before the worker starts are kept.
    let store = Store::connect(&config.database).await?;
    store.migrate().await?;
    let broker = Broker::connect(&config.nats).await?;
    broker.provision_stream().await?;
    broker
        .provision_consumer(&jobwarden::broker::Lane::bare("bench"))
        .await?;
    let subject = broker.subject("bench");

    let cancel = CancellationToken::new();
    let result = if phase == Phase::Throughput {
        publish(&broker, &subject, n, None).await?;
        let counters = PgCost::before(&store).await?;
        let started = Instant::now();
        let worker = Worker::new(config.clone())
            .rust_handler("noop", noop)
            .start(cancel.clone())
            .await?;
        wait_completed(&worker.stats, n as u64, Duration::from_secs(600)).await?;
        let elapsed = started.elapsed();
        worker.shutdown().await;
        PhaseResult {
            jobs: n,
            elapsed,
            latencies_us: vec![],
            cost: PgCost::after(&store, counters).await.ok(),
        }
    } else {
        let worker = Worker::new(config.clone())
            .rust_handler("noop", noop)
            .start(cancel.clone())
            .await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let started = Instant::now();
        publish(&broker, &subject, n, Some(args.rate)).await?;
        wait_completed(&worker.stats, n as u64, Duration::from_secs(600)).await?;
        let elapsed = started.elapsed();
        worker.shutdown().await;
        let mut l = latencies.lock().unwrap().clone();
        l.sort_unstable();
        PhaseResult {
            jobs: n,
            elapsed,
            latencies_us: l,
            cost: None,
        }
    };
    let _ = broker.js.delete_stream(&config.nats.stream).await;
    store.drop_schema().await?;
    Ok(result)
}

/// Publishes `n` plain-object jobs carrying their publish time; paced at `rate`/s if given.
async fn publish(broker: &Broker, subject: &str, n: usize, rate: Option<u64>) -> Result<()> {
    let started = Instant::now();
    let mut acks = Vec::with_capacity(1024);
    for i in 0..n {
        if let Some(r) = rate {
            let due = started + Duration::from_secs_f64(i as f64 / r as f64);
            tokio::time::sleep_until(due.into()).await;
        }
        let body = serde_json::to_vec(&json!({"t": now_micros(), "i": i}))?;
        acks.push(
            broker
                .js
                .publish(subject.to_string(), body.into())
                .await
                .context("publish")?,
        );
        if acks.len() >= 1000 || rate.is_some() {
            for a in acks.drain(..) {
                a.await.context("publish ack")?;
            }
        }
    }
    for a in acks {
        a.await.context("publish ack")?;
    }
    Ok(())
}

async fn wait_completed(stats: &Stats, n: u64, limit: Duration) -> Result<()> {
    let started = Instant::now();
    while Stats::get(&stats.completed) < n {
        if started.elapsed() > limit {
            anyhow::bail!(
                "only {} of {n} jobs completed within {limit:?}",
                Stats::get(&stats.completed)
            );
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(())
}

/// A local no-op application for the HTTP handler: records the job's publish-to-start latency
/// and answers 200.
struct NoopApp {
    url: String,
    _task: tokio::task::JoinHandle<()>,
}

impl NoopApp {
    async fn start(latencies: Arc<Mutex<Vec<u64>>>) -> Result<NoopApp> {
        let app = axum::Router::new().route(
            "/jobs",
            axum::routing::post(move |body: axum::body::Bytes| {
                let latencies = latencies.clone();
                async move {
                    let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                    if let Some(t) = v["payload"]["t"].as_i64() {
                        latencies
                            .lock()
                            .unwrap()
                            .push((now_micros() - t).max(0) as u64);
                    }
                    axum::http::StatusCode::OK
                }
            }),
        );
        let (url, task) = serve_local(app).await?;
        Ok(NoopApp { url, _task: task })
    }
}

/// Serves a local application (with a `POST /jobs` route) on a free loopback port; returns
/// the handler URL and the server task.
pub async fn serve_local(app: axum::Router) -> Result<(String, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((format!("http://{addr}/jobs"), task))
}

#[cfg(test)]
mod tests {
    #[test]
    fn percentiles() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(super::percentile(&v, 50.0), 51);
        assert_eq!(super::percentile(&v, 99.0), 99);
        assert_eq!(super::percentile(&v, 100.0), 100);
        assert_eq!(super::percentile(&[], 50.0), 0);
    }
}
