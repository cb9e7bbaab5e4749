//! `jobwarden bench --prune N`: what retention costs the hot path. N finished jobs older
//! than their keep are seeded (one `INSERT … SELECT generate_series`); then a worker runs a
//! steady stream of no-op jobs at `--rate`'s first rate (500/s by default) twice: with
//! retention on (the pruner deletes the N jobs meanwhile, with the default batch and pause)
//! and with it off (the same N rows present, nothing deleted). Prints publish→start p50/p99
//! of both, and how long the prune of N took.

use crate::bench::{percentile, provisioned, BenchArgs};
use anyhow::Result;
use jobwarden::config::{Config, HandlerConfig, QueueConfig};
use jobwarden::handler::{from_fn, Handler};
use jobwarden::worker::Worker;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Longest stream of the run without pruning (at the rate: one minute).
const OFF_SECONDS: u64 = 60;

struct Run {
    latencies_us: Vec<u64>,
    jobs: usize,
    /// From the worker's start to the last seeded job gone (retention on).
    prune: Option<Duration>,
}

pub async fn run(base: &Config, args: &BenchArgs, n: u64) -> Result<()> {
    let rate = args.rate.first().copied().unwrap_or(500);
    println!("prune bench: {n} finished jobs older than their keep, a stream of {rate} jobs/s");
    let on = one(base, args, n, rate, None).await?;
    let off_jobs = on.jobs.min((rate * OFF_SECONDS) as usize);
    let off = one(base, args, n, rate, Some(off_jobs)).await?;
    let line = |what: &str, r: &Run| {
        println!(
            "{what}: publish→start p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms ({} jobs at {rate}/s)",
            percentile(&r.latencies_us, 50.0) as f64 / 1000.0,
            percentile(&r.latencies_us, 99.0) as f64 / 1000.0,
            r.latencies_us.last().copied().unwrap_or(0) as f64 / 1000.0,
            r.jobs
        );
    };
    line("retention on (pruning)", &on);
    line("retention off         ", &off);
    if let Some(d) = on.prune {
        println!(
            "pruned {n} jobs in {:.1}s ({:.0} jobs/s, from the worker's start; first round after retention.every)",
            d.as_secs_f64(),
            n as f64 / d.as_secs_f64()
        );
    }
    Ok(())
}

/// One run: retention on when `jobs` is None (the stream lasts until the prune is done),
/// off otherwise (a stream of `jobs`).
async fn one(
    base: &Config,
    args: &BenchArgs,
    n: u64,
    rate: u64,
    jobs: Option<usize>,
) -> Result<Run> {
    let queue = QueueConfig {
        concurrency: args.concurrency,
        handler: Some(HandlerConfig::Rust {
            name: "noop".into(),
        }),
        ..QueueConfig::default()
    };
    let (mut config, store, broker) = provisioned(base, "benchprune", "bench", queue).await?;
    config.worker.hostname = Some("bench".into());
    config.retention.enabled = jobs.is_none();
    config.retention.every = Duration::from_secs(1);
    let c = store.raw().await?;
    let seeded = Instant::now();
    c.execute(
        "INSERT INTO jobs (id, queue, payload, status, max_attempts, attempts, completed_at,
                           started_at, created_at, updated_at)
         SELECT 'old-' || g, 'bench', '{}', 'completed', 5, 1,
                now() - interval '8 days' - g * interval '1 millisecond',
                now() - interval '8 days' - g * interval '1 millisecond',
                now() - interval '8 days', now() - interval '8 days'
         FROM generate_series(1, $1::int8) g",
        &[&(n as i64)],
    )
    .await?;
    c.batch_execute("VACUUM ANALYZE jobs").await?;
    println!(
        "seeded {n} finished jobs in {:.1}s (retention {})",
        seeded.elapsed().as_secs_f64(),
        if jobs.is_none() { "on" } else { "off" }
    );
    let latencies = Arc::new(Mutex::new(Vec::new()));
    let l = latencies.clone();
    let noop: Arc<dyn Handler> = from_fn(move |job| {
        if let Some(t) = job.payload.get("t").and_then(|t| t.as_i64()) {
            let now = crate::bench::now_micros();
            l.lock().unwrap().push((now - t).max(0) as u64);
        }
        async { Ok(None) }
    });
    let worker = Worker::new(config.clone())
        .rust_handler("noop", noop)
        .start(CancellationToken::new())
        .await?;
    let started = Instant::now();
    let subject = broker.subject("bench");
    let mut published = 0;
    let mut prune = None;
    loop {
        crate::bench::publish(&broker, &subject, rate as usize, Some(rate)).await?;
        published += rate as usize;
        match jobs {
            Some(j) if published >= j => break,
            Some(_) => {}
            None => {
                let left: bool = c
                    .query_one(
                        "SELECT EXISTS (SELECT 1 FROM jobs WHERE status = 'completed'
                                        AND completed_at < now() - interval '7 days')",
                        &[],
                    )
                    .await?
                    .get(0);
                if !left {
                    prune = Some(started.elapsed());
                    break;
                }
            }
        }
    }
    crate::bench::wait_completed(&worker.stats, published as u64, Duration::from_secs(600)).await?;
    worker.shutdown().await;
    drop(c);
    let _ = broker.js.delete_stream(&config.nats.stream).await;
    store.drop_schema().await?;
    let mut l = latencies.lock().unwrap().clone();
    l.sort_unstable();
    Ok(Run {
        latencies_us: l,
        jobs: published,
        prune,
    })
}
