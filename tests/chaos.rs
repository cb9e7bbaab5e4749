//! The chaos run: several `jobwarden run` processes against a nats-server and a PostgreSQL
//! this test owns, a known set of jobs, and faults every few seconds — kill -9 and restart,
//! SIGSTOP past the dead threshold then SIGCONT, SIGTERM, nats-server restart, PostgreSQL
//! `pg_ctl -m immediate` restart. Then quiet, drain, and a checker that fails on any lost
//! job, any job left non-terminal, or any double completion.
//!
//! The suite runs a reduced version (`CHAOS_SECONDS`, default 40 s of faults). The long run:
//! `CHAOS_SECONDS=600 cargo test --release --test chaos -- --nocapture`.

mod common;

use common::{ChildWorker, RecordingApp, TestEnv};
use jobwarden::client::{Client, ClientError, EnqueueOptions};
use nix::sys::signal::Signal;
use rand::Rng;
use serde_json::json;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

const WORKERS: usize = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos() {
    let fault_secs: u64 = std::env::var("CHAOS_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40);
    let app = RecordingApp::start().await;
    let pg = jobwarden::testkit::PgCluster::start().unwrap();
    let mut env = TestEnv::with_database(
        &pg.url(),
        &format!(
            "heartbeat_every = \"500ms\"\ndead_after = \"3s\"\nreap_every = \"500ms\"\n\
             sweep_every = \"1s\"\nbroker_lost_after = \"3s\"\nstale_after = \"20s\"\n\
             shutdown_grace = \"2s\"\n\
             [queues.work]\nconcurrency = 8\nmax_attempts = 25\ntimeout = \"10s\"\n\
             backoff = {{ kind = \"fixed\", base = \"100ms\" }}\n\
             handler = {{ kind = \"http\", url = \"{}\" }}\n",
            app.url
        ),
    )
    .await;
    let mut workers: Vec<Option<ChildWorker>> = (0..WORKERS)
        .map(|i| Some(ChildWorker::spawn(&env.config, &format!("w{i}"))))
        .collect();
    let client = Client::new(env.store.clone(), env.broker.clone());
    let mut rng = rand::rng();
    let mut submitted: HashSet<String> = HashSet::new();
    let mut faults: BTreeMap<&str, u32> = BTreeMap::new();
    let mut fault_log: Vec<(Instant, String)> = Vec::new();
    let started = Instant::now();
    let mut next_fault = started + Duration::from_secs(2);
    let mut n = 0u64;
    let mut stopped: Option<(usize, Instant)> = None;

    while started.elapsed() < Duration::from_secs(fault_secs) {
        // A steady stream of jobs, each stored before it counts as submitted.
        for _ in 0..5 {
            let id = format!("c-{n}");
            n += 1;
            let ms = rng.random_range(10..400);
            match client
                .enqueue(
                    "work",
                    json!({ "ms": ms }),
                    EnqueueOptions {
                        id: Some(id.clone()),
                        ..Default::default()
                    },
                )
                .await
            {
                Ok(_) | Err(ClientError::Publish { .. }) => {
                    submitted.insert(id);
                }
                Err(_) => {} // not stored (PostgreSQL down): never submitted
            }
        }
        if let Some((i, at)) = stopped {
            if at.elapsed() > Duration::from_secs(4) {
                workers[i].as_ref().unwrap().signal(Signal::SIGCONT);
                stopped = None;
            }
        }
        if Instant::now() >= next_fault {
            next_fault = Instant::now() + Duration::from_millis(rng.random_range(2000..4000));
            let i = rng.random_range(0..WORKERS);
            let kind = match rng.random_range(0..6) {
                0 | 1 => {
                    let mut w = workers[i].take().unwrap();
                    w.kill9();
                    tokio::time::sleep(Duration::from_millis(rng.random_range(0..1500))).await;
                    workers[i] = Some(ChildWorker::spawn(&env.config, &format!("w{i}")));
                    "kill -9 + restart"
                }
                2 if stopped.is_none() => {
                    workers[i].as_ref().unwrap().signal(Signal::SIGSTOP);
                    stopped = Some((i, Instant::now()));
                    "SIGSTOP 4s + SIGCONT"
                }
                3 if stopped.map(|(s, _)| s) != Some(i) => {
                    let mut w = workers[i].take().unwrap();
                    w.signal(Signal::SIGTERM);
                    let code = w.wait_exit(Duration::from_secs(15)).await;
                    assert_eq!(code, Some(0), "w{i} did not exit cleanly after SIGTERM");
                    workers[i] = Some(ChildWorker::spawn(&env.config, &format!("w{i}")));
                    "SIGTERM + restart"
                }
                4 => {
                    env.nats.restart().unwrap();
                    "nats-server restart"
                }
                _ => {
                    pg.restart_immediate().unwrap();
                    "PostgreSQL restart (immediate)"
                }
            };
            *faults.entry(kind).or_default() += 1;
            fault_log.push((Instant::now(), kind.to_string()));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if let Some((i, _)) = stopped {
        workers[i].as_ref().unwrap().signal(Signal::SIGCONT);
    }
    let quiet = Instant::now();

    // Drain: every submitted job must reach a final state.
    let drained = common::wait_for(Duration::from_secs(120), || async {
        let Ok(c) = env.store.raw().await else {
            return false;
        };
        let open: i64 = c
            .query_one(
                "SELECT count(*) FROM jobs WHERE status NOT IN ('completed', 'dead', 'cancelled')",
                &[],
            )
            .await
            .map(|r| r.get(0))
            .unwrap_or(1);
        open == 0
    })
    .await;
    let drain_time = quiet.elapsed();

    // ---- the checker ----
    let c = env.store.raw().await.unwrap();
    let rows = c
        .query("SELECT id, status, attempts FROM jobs", &[])
        .await
        .unwrap();
    let status: HashMap<String, String> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    let completed = status.values().filter(|s| *s == "completed").count();
    let dead: Vec<&String> = status
        .iter()
        .filter(|(_, s)| *s == "dead")
        .map(|(id, _)| id)
        .collect();
    let lost: Vec<&String> = submitted
        .iter()
        .filter(|id| !status.contains_key(*id))
        .collect();
    let stuck: Vec<(&String, &String)> = status
        .iter()
        .filter(|(_, s)| !matches!(s.as_str(), "completed" | "dead" | "cancelled"))
        .collect();
    let double: Vec<(String, i64)> = c
        .query(
            "SELECT job_id, count(*) FROM job_attempts WHERE outcome = 'completed'
             GROUP BY 1 HAVING count(*) > 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let reasons: Vec<(String, i64)> = c
        .query(
            "SELECT outcome, count(*) FROM job_attempts GROUP BY 1 ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let starts = app.starts.lock().unwrap().clone();
    let mut per_job: HashMap<&str, Vec<&common::Start>> = HashMap::new();
    for s in &starts {
        per_job.entry(s.id.as_str()).or_default().push(s);
    }
    let mut histogram: BTreeMap<usize, usize> = BTreeMap::new();
    let mut gaps: Vec<Duration> = Vec::new();
    for v in per_job.values() {
        *histogram.entry(v.len()).or_default() += 1;
        for w in v.windows(2) {
            gaps.push(w[1].at - w[0].at);
        }
    }
    gaps.sort();
    let pct = |p: f64| -> Duration {
        if gaps.is_empty() {
            Duration::ZERO
        } else {
            gaps[((gaps.len() - 1) as f64 * p).round() as usize]
        }
    };
    println!("== chaos report ({fault_secs}s of faults, {WORKERS} workers) ==");
    println!("faults injected:       {faults:?}");
    println!("submitted:             {}", submitted.len());
    println!("completed:             {completed}");
    println!("dead:                  {}", dead.len());
    println!("lost:                  {}", lost.len());
    println!("stuck (non-terminal):  {}", stuck.len());
    println!("double completions:    {}", double.len());
    println!("executions per job:    {histogram:?}  (count → jobs)");
    println!("attempt outcomes:      {reasons:?}");
    println!(
        "re-execution delay:    p50 {:?} p99 {:?} max {:?} ({} re-executions; from one start of a job to its next)",
        pct(0.5),
        pct(0.99),
        gaps.last().copied().unwrap_or_default(),
        gaps.len()
    );
    println!("drain after faults:    {drain_time:?}");

    assert!(
        drained,
        "jobs still open 120 s after the faults stopped: {stuck:?}"
    );
    assert!(lost.is_empty(), "lost jobs: {lost:?}");
    assert!(stuck.is_empty(), "stuck jobs: {stuck:?}");
    assert!(double.is_empty(), "double completions: {double:?}");
    assert!(
        dead.is_empty(),
        "jobs dead-lettered (25 attempts should be plenty): {dead:?}"
    );
    assert!(
        submitted.len() > 100,
        "too few jobs submitted: {}",
        submitted.len()
    );
    drop(workers);
}
