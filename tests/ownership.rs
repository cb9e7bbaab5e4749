//! Who may take a job from whom: each test tries one way a live owner could lose a job it is
//! running (or a dead one keep it), against real servers and real worker processes.
//!
//! - pods serving different queues judge each other's jobs and workers by the owner's own
//!   thresholds, not their own;
//! - start-up reconciliation takes jobs only from incarnations proven gone (a different boot
//!   id is no proof), and a killed process not yet reaped (a zombie) is gone;
//! - one slow heartbeat, or healthy beats at the smallest allowed `dead_after`, never fence
//!   a worker off;
//! - progress reports count for the attempt that sent them, not for a later one;
//! - a job given back after a self-fence still counts its attempt;
//! - a worker declared dead claims nothing until it has registered again.

mod common;

use common::evidence::assert_jobs_kept_after_reconciliation;
use common::{outcomes, stat, wait_for, ChildWorker, RecordingApp, TestEnv};
use jobwarden::handler::{from_fn, JobError};
use serde_json::json;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn rust_queue(name: &str, extra: &str) -> String {
    format!("[queues.{name}]\nhandler = {{ kind = \"rust\", name = \"h\" }}\n{extra}")
}

/// A handler that runs `ms` milliseconds (payload `{"ms": N}`), stopping early when cancelled.
fn sleeper() -> Arc<dyn jobwarden::Handler> {
    from_fn(|job| async move {
        let ms = job.payload["ms"].as_u64().unwrap_or(0);
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(ms)) => Ok(None),
            _ = job.cancel.cancelled() => Err(JobError::retry("stopped")),
        }
    })
}

#[tokio::test]
async fn a_pod_judges_another_queues_jobs_by_the_owners_stale_after_not_its_own() {
    let env = TestEnv::new(&format!(
        "{}{}",
        rust_queue("slow", "stale_after = \"30s\"\n"),
        rust_queue("other", "")
    ))
    .await;
    // Pod A serves `slow`, whose jobs may go 30 s without a report.
    let mut a = env.config.clone();
    a.queues.remove("other");
    // Pod B serves only `other`, with a short stale_after and a fast sweep.
    let mut b = env.config.clone();
    b.queues.remove("slow");
    b.worker.stale_after = Duration::from_secs(1);
    b.worker.heartbeat_every = Duration::from_millis(300);
    b.worker.sweep_every = Duration::from_millis(200);
    let wa = env.worker_with(a, &[("h", sleeper())]).await;
    let wb = env.worker_with(b, &[("h", sleeper())]).await;
    env.publish_raw("slow", r#"{"id":"slow-1","payload":{"ms":3000}}"#)
        .await;
    assert!(env.wait_status("slow-1", "completed", 20).await);
    assert_eq!(outcomes(&env.store, "slow-1").await, vec!["completed"]);
    assert_eq!(
        stat(&wb.stats.reclaimed_stale),
        0,
        "pod B reclaimed A's job"
    );
    wa.shutdown().await;
    wb.shutdown().await;
}

#[tokio::test]
async fn a_pod_judges_another_worker_by_that_workers_dead_after_not_its_own() {
    let env = TestEnv::new(&format!(
        "{}{}",
        rust_queue("work", ""),
        rust_queue("other", "")
    ))
    .await;
    // Pod A beats every 2 s and declares itself dead after 6 s (a rollout lengthened them).
    let mut a = env.config.clone();
    a.queues.remove("other");
    a.worker.heartbeat_every = Duration::from_secs(2);
    a.worker.dead_after = Duration::from_secs(6);
    // Pod B still runs the old, short settings, and reaps often.
    let mut b = env.config.clone();
    b.queues.remove("work");
    b.worker.heartbeat_every = Duration::from_millis(200);
    b.worker.dead_after = Duration::from_secs(1);
    b.worker.reap_every = Duration::from_millis(100);
    let wa = env.worker_with(a, &[("h", sleeper())]).await;
    let wb = env.worker_with(b, &[("h", sleeper())]).await;
    env.publish_raw("work", r#"{"id":"long-1","payload":{"ms":4500}}"#)
        .await;
    assert!(env.wait_status("long-1", "completed", 20).await);
    assert_eq!(outcomes(&env.store, "long-1").await, vec!["completed"]);
    assert_eq!(stat(&wb.stats.reclaimed_owner_dead), 0);
    let c = env.store.raw().await.unwrap();
    let stopped: Option<String> = c
        .query_one("SELECT stop_reason FROM workers WHERE id = $1", &[&wa.id])
        .await
        .unwrap()
        .get(0);
    assert_eq!(stopped, None, "pod B declared the live pod A dead");
    wa.shutdown().await;
    wb.shutdown().await;
}

fn http_queue(url: &str) -> String {
    format!(
        "[queues.work]\nconcurrency = 10\nmax_attempts = 5\n\
         handler = {{ kind = \"http\", url = \"{url}\" }}\n"
    )
}

#[tokio::test]
async fn a_live_process_sharing_the_hostname_on_another_node_keeps_its_jobs() {
    let app = RecordingApp::start().await;
    let env = TestEnv::new(&http_queue(&app.url)).await;
    let _a = ChildWorker::spawn(&env.config, "shared");
    let ids = env.publish_held("node1", 3).await;
    assert!(wait_for(Duration::from_secs(20), || async { app.start_count() == 3 }).await);
    let owner = app.starts.lock().unwrap()[0].worker.clone();
    // The first process now looks as if it ran on another node (another boot id), like a
    // force-deleted StatefulSet pod still running on a partitioned node. It is alive: its
    // heartbeat is fresh. Its pid and start time mean nothing on this node: no process here
    // has that start time, so only the boot id keeps the new process from judging it gone.
    let c = env.store.raw().await.unwrap();
    c.execute(
        "UPDATE workers SET boot_id = 'another-node-boot-id', proc_start = proc_start + 1 \
         WHERE hostname = 'shared'",
        &[],
    )
    .await
    .unwrap();
    let (_b, b_ops) = ChildWorker::spawn_with_ops(&env.config, "shared");
    assert_jobs_kept_after_reconciliation(&env, &owner, &[("new", b_ops)]).await;
    assert_eq!(
        app.start_count(),
        3,
        "the new process took the jobs of a live one"
    );
    app.release();
    assert!(env.wait_count("completed", 3, 10).await);
    for id in &ids {
        assert_eq!(outcomes(&env.store, id).await, vec!["completed"], "{id}");
    }
}

#[tokio::test]
async fn a_killed_worker_not_yet_reaped_is_recovered_by_its_restart_at_once() {
    let app = RecordingApp::start().await;
    let env = TestEnv::new(&http_queue(&app.url)).await;
    let mut a = ChildWorker::spawn(&env.config, "pod-z");
    let ids = env.publish_held("zombie", 4).await;
    assert!(wait_for(Duration::from_secs(20), || async { app.start_count() == 4 }).await);
    // kill -9 from a shell: the process is gone, but nobody has waited for it yet.
    a.kill9_leaving_zombie();
    let restarted = Instant::now();
    let _b = ChildWorker::spawn(&env.config, "pod-z");
    // dead_after is the 15 s default: only start-up reconciliation can be this quick.
    let again = wait_for(Duration::from_secs(5), || async {
        ids.iter()
            .all(|id| app.starts_of(id).iter().any(|s| s.attempt == 2))
    })
    .await;
    assert!(
        again,
        "jobs of a killed (zombie) incarnation were not taken back at start-up"
    );
    println!(
        "zombie incarnation: jobs running again {:?} after the restart",
        restarted.elapsed()
    );
    app.release();
    assert!(env.wait_count("completed", 4, 10).await);
    for id in &ids {
        assert_eq!(
            outcomes(&env.store, id).await,
            vec!["restarted", "completed"]
        );
    }
    drop(a);
}

/// A worker whose handler runs job `id` until the test sets `done`; returns once the job
/// runs, with `done` and the count of starts.
async fn run_gated(
    env: &TestEnv,
    id: &str,
) -> (jobwarden::RunningWorker, Arc<AtomicBool>, Arc<AtomicU32>) {
    let (done, starts) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU32::new(0)),
    );
    let w = env
        .worker(&[("h", gated(done.clone(), starts.clone()))])
        .await;
    env.publish_raw("work", format!(r#"{{"id":"{id}","payload":{{}}}}"#))
        .await;
    assert!(env.wait_status(id, "processing", 10).await);
    (w, done, starts)
}

/// Runs until the test lets it finish; stops early only when cancelled.
fn gated(done: Arc<AtomicBool>, starts: Arc<AtomicU32>) -> Arc<dyn jobwarden::Handler> {
    from_fn(move |job| {
        let (done, starts) = (done.clone(), starts.clone());
        async move {
            starts.fetch_add(1, Ordering::SeqCst);
            while !done.load(Ordering::SeqCst) {
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                    _ = job.cancel.cancelled() => return Err(JobError::retry("stopped")),
                }
            }
            Ok(None)
        }
    })
}

#[tokio::test]
async fn a_three_second_lock_on_the_workers_table_fences_no_one() {
    // Default liveness settings: beat every 5 s, dead after 15 s.
    let env = TestEnv::new(&rust_queue("work", "")).await;
    let (w, done, starts) = run_gated(&env, "steady").await;
    // Catch a beat, then hold the workers table locked across the next one.
    assert!(env.wait_for_beat(&w.id, 8).await);
    let seen = Instant::now();
    tokio::time::sleep(Duration::from_millis(4800)).await;
    let mut locker = env.store.raw().await.unwrap();
    let tx = locker.transaction().await.unwrap();
    tx.batch_execute("LOCK TABLE workers IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    tx.commit().await.unwrap();
    // Past the moment a fence would have fired (two beats after the one seen).
    let until = seen + Duration::from_secs(12);
    tokio::time::sleep(until.saturating_duration_since(Instant::now())).await;
    done.store(true, Ordering::SeqCst);
    assert!(env.wait_status("steady", "completed", 10).await);
    assert_eq!(
        stat(&w.stats.self_fenced),
        0,
        "a slow beat fenced the worker"
    );
    assert_eq!(starts.load(Ordering::SeqCst), 1);
    assert_eq!(outcomes(&env.store, "steady").await, vec!["completed"]);
    w.shutdown().await;
}

#[tokio::test]
async fn healthy_beats_at_the_smallest_allowed_dead_after_never_fence() {
    let env = TestEnv::new(&format!(
        "heartbeat_every = \"1s\"\ndead_after = \"2s\"\n{}",
        rust_queue("work", "")
    ))
    .await;
    let (w, done, starts) = run_gated(&env, "healthy").await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    done.store(true, Ordering::SeqCst);
    assert!(env.wait_status("healthy", "completed", 10).await);
    assert_eq!(
        stat(&w.stats.self_fenced),
        0,
        "healthy beats fenced the worker"
    );
    assert_eq!(starts.load(Ordering::SeqCst), 1);
    w.shutdown().await;
}

#[tokio::test]
async fn progress_from_a_stopped_attempt_does_not_keep_a_hung_new_attempt_alive() {
    use axum::routing::post;
    let reporter_conflicts = Arc::new(AtomicU32::new(0));
    let attempts = Arc::new(AtomicU32::new(0));
    let (rc, at) = (reporter_conflicts.clone(), attempts.clone());
    // Attempt 1 starts a reporter that keeps posting progress to its own progress URL, then
    // fails. Attempt 2 hangs without a word. Attempt 3 succeeds.
    let app = axum::Router::new().route(
        "/jobs",
        post(move |body: axum::body::Bytes| {
            let (rc, at) = (rc.clone(), at.clone());
            async move {
                let job: serde_json::Value = serde_json::from_slice(&body).unwrap();
                at.fetch_add(1, Ordering::SeqCst);
                match job["attempt"].as_u64().unwrap() {
                    1 => {
                        let url = job["progress_url"].as_str().unwrap().to_string();
                        tokio::spawn(async move {
                            let http = reqwest::Client::new();
                            loop {
                                if let Ok(r) = http
                                    .post(&url)
                                    .json(&json!({"stage": "zombie"}))
                                    .send()
                                    .await
                                {
                                    if r.status() == 409 || r.status() == 404 {
                                        rc.fetch_add(1, Ordering::SeqCst);
                                    }
                                }
                                tokio::time::sleep(Duration::from_millis(100)).await;
                            }
                        });
                        axum::http::StatusCode::INTERNAL_SERVER_ERROR
                    }
                    2 => {
                        std::future::pending::<()>().await;
                        axum::http::StatusCode::OK
                    }
                    _ => axum::http::StatusCode::OK,
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/jobs", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let env = TestEnv::new(&format!(
        "heartbeat_every = \"200ms\"\nstale_after = \"1s\"\nsweep_every = \"200ms\"\n\
         [queues.work]\nmax_attempts = 5\nbackoff = {{ kind = \"fixed\", base = \"100ms\" }}\n\
         handler = {{ kind = \"http\", url = \"{url}\" }}\n"
    ))
    .await;
    let w = env.worker(&[]).await;
    env.publish_raw("work", r#"{"id":"haunted","payload":{}}"#)
        .await;
    let completed = env.wait_status("haunted", "completed", 20).await;
    let o = outcomes(&env.store, "haunted").await;
    assert!(
        completed,
        "the hung attempt was kept alive by the old attempt's reports: {o:?}, attempts seen {}",
        attempts.load(Ordering::SeqCst)
    );
    assert_eq!(o, vec!["retry", "stale", "completed"]);
    assert!(
        reporter_conflicts.load(Ordering::SeqCst) > 0,
        "the old attempt's reports were accepted"
    );
    w.shutdown().await;
}

#[tokio::test]
async fn a_job_given_back_after_a_self_fence_still_counts_its_attempt() {
    let pg = common::testkit::PgCluster::start().unwrap();
    // The reaper is out of the way (the test is about the self-fence alone).
    let env = TestEnv::with_database(
        &pg.url(),
        &format!(
            "heartbeat_every = \"1s\"\ndead_after = \"6s\"\nreap_every = \"1h\"\n{}",
            rust_queue("work", "max_attempts = 1\n")
        ),
    )
    .await;
    let (w, done, starts) = run_gated(&env, "fenced").await;
    // Stall PostgreSQL right after a beat, long enough for the worker to fence itself off
    // but not so long that it would be declared dead.
    assert!(env.wait_for_beat(&w.id, 5).await);
    pg.pause().unwrap();
    tokio::time::sleep(Duration::from_millis(5300)).await;
    pg.resume().unwrap();
    assert!(
        wait_for(Duration::from_secs(15), || async {
            stat(&w.stats.self_fenced) >= 1
                && env.status_of("fenced").await.as_deref() == Some("dead")
        })
        .await,
        "status {:?}, self_fenced {}, starts {}",
        env.status_of("fenced").await,
        stat(&w.stats.self_fenced),
        starts.load(Ordering::SeqCst)
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        starts.load(Ordering::SeqCst),
        1,
        "a job with max_attempts = 1 ran twice"
    );
    let job = env.store.job_get("fenced").await.unwrap().unwrap();
    assert_eq!(job.attempts, 1);
    assert_eq!(outcomes(&env.store, "fenced").await, vec!["self_fenced"]);
    done.store(true, Ordering::SeqCst);
    w.shutdown().await;
}

#[tokio::test]
async fn a_worker_declared_dead_claims_nothing_until_it_registered_again() {
    // Beats are rare, so the worker learns it was declared dead late.
    let env = TestEnv::new(&format!(
        "heartbeat_every = \"5s\"\ndead_after = \"30s\"\n{}",
        rust_queue("work", "")
    ))
    .await;
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    let h = from_fn(move |job| {
        let r = r.clone();
        async move {
            r.fetch_add(1, Ordering::SeqCst);
            // Long enough for any reaper to see a job held by a stopped owner.
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(3000)) => Ok(None),
                _ = job.cancel.cancelled() => Err(JobError::retry("stopped")),
            }
        }
    });
    let w = env.worker(&[("h", h)]).await;
    // Another pod's reaper declared this worker dead (say, after a long pause).
    let c = env.store.raw().await.unwrap();
    c.execute(
        "UPDATE workers SET stopped_at = now(), stop_reason = 'owner_dead' WHERE id = $1",
        &[&w.id],
    )
    .await
    .unwrap();
    env.publish_raw("work", r#"{"id":"after-death","payload":{}}"#)
        .await;
    assert!(env.wait_status("after-death", "completed", 30).await);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the job ran more than once");
    assert_eq!(outcomes(&env.store, "after-death").await, vec!["completed"]);
    let job = env.store.job_get("after-death").await.unwrap().unwrap();
    assert_eq!(job.attempts, 1);
    w.shutdown().await;
}

#[tokio::test]
async fn a_claim_that_lands_after_the_self_fence_is_given_back_not_run() {
    let env = TestEnv::new(&format!(
        "heartbeat_every = \"1s\"\ndead_after = \"6s\"\nreap_every = \"1h\"\n{}",
        rust_queue("work", "")
    ))
    .await;
    let starts: Arc<std::sync::Mutex<Vec<Instant>>> = Arc::default();
    let s = starts.clone();
    let h = from_fn(move |_job| {
        let s = s.clone();
        async move {
            s.lock().unwrap().push(Instant::now());
            Ok(None)
        }
    });
    let w = env.worker(&[("h", h)]).await;
    // Right after a beat: the next beats wait on a lock of the workers table, and the claim
    // of the job published now waits on a lock of the jobs table.
    assert!(env.wait_for_beat(&w.id, 5).await);
    let beat_seen = Instant::now();
    let mut c2 = env.store.raw().await.unwrap();
    let workers_lock = c2.transaction().await.unwrap();
    workers_lock
        .batch_execute("LOCK TABLE workers IN SHARE MODE")
        .await
        .unwrap();
    let mut c1 = env.store.raw().await.unwrap();
    let jobs_lock = c1.transaction().await.unwrap();
    jobs_lock
        .batch_execute("LOCK TABLE jobs IN SHARE MODE")
        .await
        .unwrap();
    env.publish_raw("work", r#"{"id":"late-claim","payload":{}}"#)
        .await;
    // The worker fences itself off 4 s (dead_after − dead_after/3) after its last beat; the
    // claim commits after that, then the beats resume.
    tokio::time::sleep(
        (beat_seen + Duration::from_millis(4700)).saturating_duration_since(Instant::now()),
    )
    .await;
    assert!(
        stat(&w.stats.self_fenced) >= 1,
        "the worker did not fence itself off"
    );
    jobs_lock.commit().await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let unfenced_from = Instant::now();
    workers_lock.commit().await.unwrap();
    assert!(env.wait_status("late-claim", "completed", 20).await);
    let starts = starts.lock().unwrap().clone();
    assert_eq!(starts.len(), 1, "the job ran {} times", starts.len());
    assert!(
        starts[0] >= unfenced_from,
        "the job ran while its worker was fenced off ({:?} before the beats resumed)",
        unfenced_from - starts[0]
    );
    // Given back at least once (a redelivery of the message may have been claimed in a
    // second statement that also landed after the fence, and was given back too: seen in a
    // loaded suite run), then completed once.
    let o = outcomes(&env.store, "late-claim").await;
    let (last, before) = o.split_last().expect("outcomes");
    assert_eq!(last, "completed", "{o:?}");
    assert!(
        !before.is_empty() && before.iter().all(|x| x == "released"),
        "{o:?}"
    );
    let job = env.store.job_get("late-claim").await.unwrap().unwrap();
    assert_eq!(job.attempts, 1, "the given-back claims counted an attempt");
    w.shutdown().await;
}

#[tokio::test]
async fn a_job_taken_back_keeps_no_deadline_an_older_versions_claim_could_inherit() {
    let env = TestEnv::new(&rust_queue("work", "")).await;
    let c = env.store.raw().await.unwrap();
    let answer = env
        .claim_as("new-1-00000000", "inherit", Duration::from_millis(300))
        .await;
    assert!(answer.alive);
    // Its owner hangs: the stale sweep takes it back.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let swept = env
        .store
        .job_reclaim_stale(10, Duration::from_secs(3600))
        .await
        .unwrap();
    assert_eq!(swept.len(), 1);
    // A worker of a version before schema 3 claims it in a rolling upgrade: it sets status,
    // owner and last activity, and knows nothing of stale_at.
    c.execute(
        "UPDATE jobs SET status = 'processing', worker_id = 'old-1-00000000', lease = lease + 1,
                attempts = attempts + 1, last_activity_at = now(), started_at = now()
         WHERE id = 'inherit'",
        &[],
    )
    .await
    .unwrap();
    // Judged by its fresh activity (the fallback), not by the deadline of the attempt before.
    let swept = env
        .store
        .job_reclaim_stale(10, Duration::from_secs(3600))
        .await
        .unwrap();
    assert!(
        swept.is_empty(),
        "an older version's fresh claim was swept by a deadline left from the attempt before"
    );
    assert_eq!(
        env.status_of("inherit").await.as_deref(),
        Some("processing")
    );
}
