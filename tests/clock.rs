//! Invariant 4, database time only: workers whose clocks are wrong by ten minutes, ahead and
//! behind (libfaketime, Debian's `faketime`), next to a worker and a database that keep the
//! right time. Every staleness, death and due-time judgement is PostgreSQL's `now()`, so a
//! skewed pod neither takes a healthy job, nor misses a dead worker, nor runs a delayed job
//! early.

mod common;

use common::{release_and_expect, wait_for, ChildWorker, RecordingApp, TestEnv};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Debian's libfaketime (package `libfaketime`, pulled in by `faketime`), preloaded into the
/// skewed processes: no wrapper process, so a kill reaches the worker itself.
const LIBFAKETIME: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
];
/// How wrong the skewed clocks are.
const SKEW_MINUTES: i64 = 10;

/// Fast liveness: dead after 4 s. Jobs are judged stale after the 5 min default, well inside
/// the skew, so a pod judging by its own clock would see every running job as stale and
/// every other worker as dead (or, behind, never).
fn queue_toml(url: &str) -> String {
    format!(
        "heartbeat_every = \"300ms\"\ndead_after = \"4s\"\nreap_every = \"200ms\"\n\
         sweep_every = \"300ms\"\nbroker_lost_after = \"2s\"\n\
         [queues.work]\nconcurrency = 10\nmax_attempts = 3\n\
         handler = {{ kind = \"http\", url = \"{url}\" }}\n"
    )
}

/// The environment that sets a process's wall clock `minutes` off with libfaketime (`lib`):
/// a fixed offset on the wall clock only (a monotonic clock set back ten minutes would start
/// below zero on a freshly booted machine).
fn skew_env(lib: &str, minutes: i64) -> Vec<(&'static str, String)> {
    vec![
        ("LD_PRELOAD", lib.to_string()),
        ("FAKETIME", format!("{minutes:+}m")),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_string()),
    ]
}

/// Debian's libfaketime, or `None` when the package is missing outside CI (the test then
/// returns, having said SKIPPED); in CI a missing package fails the test, as every missing
/// tool does (`common::tools::require_tool`).
fn libfaketime() -> Option<&'static str> {
    common::tools::require_tool(
        "faketime",
        Path::new("/usr/bin/faketime"),
        "apt-get install -y faketime (as root; bash scripts/ensure-servers.sh --faketime does it)",
    )?;
    let lib = LIBFAKETIME.iter().copied().find(|p| Path::new(p).exists());
    Some(lib.unwrap_or_else(|| {
        panic!(
            "faketime is installed but its library is not where it is looked for: {LIBFAKETIME:?}"
        )
    }))
}

fn log_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(common::testkit::unique_name(name))
}

/// Starts a worker whose wall clock is `minutes` off, and checks from its own log that it is:
/// the timestamps it writes must be off by that much (so the test cannot pass with a clock
/// that was never skewed).
async fn skewed_worker(
    env: &TestEnv,
    lib: &str,
    hostname: &str,
    minutes: i64,
) -> (ChildWorker, PathBuf) {
    let log = log_path(hostname);
    let mut envs = skew_env(lib, minutes);
    envs.push(("RUST_LOG", "info".to_string()));
    let envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let w = ChildWorker::spawn_with_env(&env.config, hostname, &log, &envs);
    let mut seen = None;
    let logged = wait_for(Duration::from_secs(20), || {
        let found = first_log_time(&log);
        if found.is_some() {
            seen = found;
        }
        async move { found.is_some() }
    })
    .await;
    assert!(
        logged,
        "{hostname} wrote no timestamped log line to {log:?}"
    );
    let off = seen.unwrap() - chrono::Utc::now();
    let want = chrono::Duration::minutes(minutes);
    assert!(
        (off - want).num_seconds().abs() <= 30,
        "{hostname}'s clock is off by {off}, not by {want}: libfaketime did not take"
    );
    (w, log)
}

/// The timestamp that starts the first line of the worker's log, if one has been written
/// (ANSI colours stripped).
fn first_log_time(log: &Path) -> Option<chrono::DateTime<chrono::Utc>> {
    let text = std::fs::read_to_string(log).ok()?;
    let mut plain = String::new();
    let mut in_escape = false;
    for c in text.lines().next()?.chars() {
        match c {
            '\u{1b}' => in_escape = true,
            'm' if in_escape => in_escape = false,
            _ if in_escape => {}
            _ => plain.push(c),
        }
    }
    let first = plain.split_whitespace().next()?;
    chrono::DateTime::parse_from_rfc3339(first)
        .ok()
        .map(|t| t.with_timezone(&chrono::Utc))
}

/// A worker ten minutes ahead runs its reaper and stale sweep every few hundred
/// milliseconds next to a healthy worker whose jobs are running: by its own clock that
/// worker stopped beating ten minutes ago and its jobs went stale; by the database's it is
/// alive. It takes nothing.
#[tokio::test]
async fn a_worker_ten_minutes_ahead_takes_no_job_from_a_live_worker() {
    let Some(lib) = libfaketime() else { return };
    let app = RecordingApp::start().await;
    let env = TestEnv::new(&queue_toml(&app.url)).await;
    let _n = ChildWorker::spawn(&env.config, "pod-n");
    let ids = env.publish_held("held", 3).await;
    assert!(wait_for(Duration::from_secs(20), || async { app.start_count() == 3 }).await);
    let (_s, _log) = skewed_worker(&env, lib, "pod-ahead", SKEW_MINUTES).await;
    // Its reaper and sweep run: wait for it to register and beat, then for twenty reaps and
    // ten sweeps.
    assert!(
        wait_for(Duration::from_secs(20), || async {
            env.scalar(
                "SELECT count(*) FROM workers WHERE hostname = 'pod-ahead' AND stopped_at IS NULL",
            )
            .await
                == 1
        })
        .await,
        "the skewed worker did not register"
    );
    tokio::time::sleep(Duration::from_secs(4)).await;
    for id in &ids {
        let starts = app.starts_of(id);
        assert_eq!(
            starts.len(),
            1,
            "{id} was taken from its live owner by a worker whose clock runs ahead: {starts:?}"
        );
        assert!(starts[0].worker.starts_with("pod-n-"), "{starts:?}");
    }
    assert_eq!(
        env.scalar("SELECT count(*) FROM workers WHERE stopped_at IS NOT NULL")
            .await,
        0,
        "a live worker was declared dead"
    );
    release_and_expect(&env, &app, &ids, &["completed"]).await;
}

/// A worker ten minutes behind is the only one left when a worker is killed: by its own
/// clock the dead worker's last beat lies ten minutes in the future; by the database's it is
/// older than `dead_after`, and the jobs run again. A job enqueued by a CLI ten minutes
/// behind with `--delay 4s` starts four seconds after it was enqueued, not at once.
#[tokio::test]
async fn a_worker_and_a_producer_ten_minutes_behind_still_reap_the_dead_and_wait_out_delays() {
    let Some(lib) = libfaketime() else { return };
    let app = RecordingApp::start().await;
    let env = TestEnv::new(&queue_toml(&app.url)).await;
    let mut n = ChildWorker::spawn(&env.config, "pod-n");
    let ids = env.publish_held("orphan", 3).await;
    assert!(wait_for(Duration::from_secs(20), || async { app.start_count() == 3 }).await);
    let (_s, _log) = skewed_worker(&env, lib, "pod-behind", -SKEW_MINUTES).await;
    n.kill9();
    let killed = Instant::now();
    assert!(
        wait_for(Duration::from_secs(15), || async {
            ids.iter().all(|id| app.starts_of(id).len() == 2)
        })
        .await,
        "the dead worker's jobs were not taken back by the worker whose clock runs behind"
    );
    let took = ids
        .iter()
        .map(|id| app.starts_of(id)[1].at - killed)
        .max()
        .unwrap();
    println!("a worker ten minutes behind recovered a dead worker's jobs {took:?} after the kill (dead_after 4s)");
    release_and_expect(&env, &app, &ids, &["owner_dead", "completed"]).await;

    // A producer whose clock runs behind enqueues a delayed job.
    let sent = Instant::now();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_jobwarden"))
        .args(["enqueue", "work", "{}", "--id", "later", "--delay", "4s"])
        .env("JOBWARDEN_DATABASE__URL", common::test_database_url())
        .env("JOBWARDEN_DATABASE__SCHEMA", &env.config.database.schema)
        .env("JOBWARDEN_NATS__URL", env.nats.url())
        .envs(skew_env(lib, -SKEW_MINUTES))
        .output()
        .expect("run jobwarden enqueue under faketime");
    assert!(out.status.success(), "{}", common::text(&out));
    assert!(
        wait_for(Duration::from_secs(15), || async {
            !app.starts_of("later").is_empty()
        })
        .await,
        "the delayed job never started"
    );
    let waited = app.starts_of("later")[0].at - sent;
    println!("delayed 4s by a producer ten minutes behind: started after {waited:?}");
    assert!(
        waited >= Duration::from_millis(3500),
        "a job delayed 4s by a producer whose clock runs behind started after {waited:?}"
    );
}
