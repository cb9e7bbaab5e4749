//! `jobwarden bench --history N`: how long the operator's answers take on a table holding N
//! finished jobs (98 % completed, 1 % dead, 1 % cancelled, over 90 days, in 20 queues, with
//! an attempt-log row of a retry for every hundredth), 10,000 unfinished ones, and the rollup
//! caught up: `jobwarden stats` (the `job_stats` view), the dashboard's overview and its
//! 24-hour charts, the `/metrics` queue depths and `dlq list`, each run 20 times (median and
//! slowest).
//!
//! Rows go in by `INSERT … SELECT generate_series` in steps of a million (progress printed);
//! 10,000,000 take several minutes and about 4 GB of disk. The schema is dropped afterwards.

use super::bench::provisioned;
use anyhow::Result;
use jobwarden::config::{Config, HandlerConfig, QueueConfig};
use jobwarden::store::Store;
use std::future::Future;
use std::time::{Duration, Instant};

const STEP: usize = 1_000_000;
const RUNS: usize = 20;

pub async fn run(base: &Config, n: usize) -> Result<()> {
    let queue = QueueConfig {
        handler: Some(HandlerConfig::Rust {
            name: "noop".into(),
        }),
        ..QueueConfig::default()
    };
    let (config, store, broker) = provisioned(base, "bench_history", "work", queue).await?;
    let result = measure(&store, n).await;
    let _ = broker.js.delete_stream(&config.nats.stream).await;
    store.drop_schema().await?;
    result
}

async fn measure(store: &Store, n: usize) -> Result<()> {
    let c = store.raw().await?;
    let seeding = Instant::now();
    let mut done = 0;
    while done < n {
        let upto = (done + STEP).min(n);
        c.execute(
            "INSERT INTO jobs (id, queue, payload, status, attempts, max_attempts, last_error,
                               scheduled_at, started_at, completed_at, updated_at, result)
             SELECT 'h-' || g, 'q' || (g % 20), '{\"to\": \"someone@example.com\"}'::jsonb,
                    CASE WHEN g % 100 = 0 THEN 'dead' WHEN g % 100 = 1 THEN 'cancelled'
                         ELSE 'completed' END,
                    1, 5, CASE WHEN g % 100 = 0 THEN 'endpoint returned 503' END,
                    t - interval '2 seconds', t - interval '40 ms', t, t, '{\"ok\": true}'
             FROM generate_series($1::int8, $2::int8) g,
                  LATERAL (SELECT now() - interval '90 days' * (1 - g::float8 / $3) AS t) x",
            &[&(done as i64 + 1), &(upto as i64), &(n as f64)],
        )
        .await?;
        c.execute(
            "INSERT INTO job_attempt_log (job_id, lease, attempt, worker_id, started_at,
                                          finished_at, outcome, error, queue)
             SELECT id, 1, 1, 'w', started_at - interval '1 second',
                    started_at - interval '960 ms', 'retry', 'endpoint returned 503', queue
             FROM jobs WHERE id IN (SELECT 'h-' || g FROM generate_series($1::int8, $2::int8, 100) g)",
            &[&(done as i64 + 1), &(upto as i64)],
        )
        .await?;
        done = upto;
        println!(
            "history: {done} finished jobs in the table ({:.0}s)",
            seeding.elapsed().as_secs_f64()
        );
    }
    c.batch_execute(
        "INSERT INTO jobs (id, queue, payload, status, max_attempts, scheduled_at, updated_at)
         SELECT 'live-' || g, 'q' || (g % 20), '{}'::jsonb,
                (ARRAY['queued', 'scheduled', 'processing'])[1 + g % 3], 5,
                now() + interval '1 hour', now()
         FROM generate_series(1, 10000) g",
    )
    .await?;
    // As autovacuum would leave them (each its own statement: VACUUM runs outside a
    // transaction block).
    for table in ["jobs", "job_attempt_log"] {
        c.batch_execute(&format!("VACUUM ANALYZE {table}")).await?;
    }
    let catching = Instant::now();
    let mut steps = 0;
    while !store.rollup_step().await?.caught_up {
        steps += 1;
    }
    println!(
        "history: seeded in {:.0}s; the rollup caught up on its first day in {:.1}s ({steps} steps)",
        seeding.elapsed().as_secs_f64() - catching.elapsed().as_secs_f64(),
        catching.elapsed().as_secs_f64()
    );
    timed("stats (job_stats)", || async {
        store.job_stats().await.map(|_| ())
    })
    .await?;
    timed("dashboard overview", || async {
        store.dashboard_overview("", 50).await.map(|_| ())
    })
    .await?;
    let day_ago = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs_f64()
        - 86_400.0;
    timed("dashboard charts, 24 h", || async {
        store.rollup_series(true, day_ago, "", 50).await.map(|_| ())
    })
    .await?;
    timed("/metrics queue depths", || async {
        store.depth().await.map(|_| ())
    })
    .await?;
    timed("dlq list", || async {
        store.dead_list(None, 50).await.map(|_| ())
    })
    .await?;
    Ok(())
}

/// Runs `f` [`RUNS`] times and prints the median and the slowest.
async fn timed<F, Fut>(what: &str, f: F) -> Result<()>
where
    F: Fn() -> Fut,
    Fut: Future<Output = jobwarden::store::Result<()>>,
{
    let mut times: Vec<Duration> = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let t = Instant::now();
        f().await?;
        times.push(t.elapsed());
    }
    times.sort();
    println!(
        "history: {what:<24} median {:>7.1} ms, slowest {:>7.1} ms ({RUNS} runs)",
        times[RUNS / 2].as_secs_f64() * 1000.0,
        times[RUNS - 1].as_secs_f64() * 1000.0
    );
    Ok(())
}
