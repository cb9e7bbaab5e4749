//! Ownership and recovery against real servers and real worker processes: kill -9,
//! SIGSTOP, SIGTERM, hung handlers, a purged stream, server restarts, a poison job.
//! Recovery times are printed (the benchmark owns performance); the assertions are about
//! what happened: who ran what, how often, and why it was taken back.

mod common;

use common::evidence::assert_jobs_kept_after_reconciliation;
use common::{
    completions, outcomes, release_and_expect, stat, wait_for, ChildWorker, RecordingApp, TestEnv,
};
use jobwarden::handler::{from_fn, JobError, Progress};
use nix::sys::signal::Signal;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A queue handled over HTTP by `url`, plus worker settings.
fn http_queue(url: &str, worker: &str) -> String {
    format!(
        "{worker}\n[queues.work]\nconcurrency = 10\nmax_attempts = 3\n\
         handler = {{ kind = \"http\", url = \"{url}\" }}\n"
    )
}

/// Fast liveness settings so tests do not wait for the 15 s default.
const FAST: &str = "heartbeat_every = \"300ms\"\ndead_after = \"2s\"\nreap_every = \"200ms\"\n\
                    sweep_every = \"500ms\"\nbroker_lost_after = \"2s\"\n";

fn with_worker(extra: &str) -> String {
    // TestEnv already opens [worker]; these keys are appended to it.
    extra.to_string()
}

#[tokio::test]
async fn a_worker_killed_and_restarted_under_the_same_hostname_gets_its_jobs_back_at_once() {
    let app = RecordingApp::start().await;
    let env = TestEnv::new(&http_queue(&app.url, "")).await;
    let mut pod = ChildWorker::spawn(&env.config, "pod-0");
    let ids = env.publish_held("restart", 5).await;
    assert!(wait_for(Duration::from_secs(20), || async { app.start_count() == 5 }).await);
    pod.kill9();
    let restarted = Instant::now();
    let _pod_again = ChildWorker::spawn(&env.config, "pod-0");
    assert!(
        wait_for(Duration::from_secs(10), || async {
            ids.iter()
                .all(|id| app.starts_of(id).iter().any(|s| s.attempt == 2))
        })
        .await,
        "jobs did not run again after the restart"
    );
    let took = ids
        .iter()
        .map(|id| {
            app.starts_of(id)
                .iter()
                .find(|s| s.attempt == 2)
                .unwrap()
                .at
                - restarted
        })
        .max()
        .unwrap();
    println!("restart with the same hostname: all 5 jobs running again {took:?} after the new process started");
    // Taken back by start-up reconciliation (dead_after is the 15 s default here, so the
    // reaper cannot have done it), and the crash cost an attempt.
    release_and_expect(&env, &app, &ids, &["restarted", "completed"]).await;
    for id in &ids {
        assert_eq!(env.store.job_get(id).await.unwrap().unwrap().attempts, 2);
    }
}

#[tokio::test]
async fn live_workers_on_one_host_never_take_each_others_jobs() {
    let app = RecordingApp::start().await;
    let env = TestEnv::new(&http_queue(&app.url, "")).await;
    let _a = ChildWorker::spawn(&env.config, "laptop");
    let ids = env.publish_held("mine", 3).await;
    assert!(wait_for(Duration::from_secs(20), || async { app.start_count() == 3 }).await);
    let owner = app.starts.lock().unwrap()[0].worker.clone();
    // A second and third worker start on the same hostname while the first is busy.
    let (_b, b_ops) = ChildWorker::spawn_with_ops(&env.config, "laptop");
    let (_c, c_ops) = ChildWorker::spawn_with_ops(&env.config, "laptop");
    assert_jobs_kept_after_reconciliation(&env, &owner, &[("second", b_ops), ("third", c_ops)])
        .await;
    assert_eq!(app.start_count(), 3, "a live worker's jobs were taken");
    app.release();
    assert!(env.wait_count("completed", 3, 10).await);
    for id in &ids {
        assert_eq!(outcomes(&env.store, id).await, vec!["completed"]);
        assert_eq!(app.starts_of(id).len(), 1, "{id} ran twice");
    }
}

#[tokio::test]
async fn a_worker_killed_for_good_has_its_jobs_run_elsewhere_with_default_settings() {
    let app = RecordingApp::start().await;
    let env = TestEnv::new(&http_queue(&app.url, "")).await;
    let mut a = ChildWorker::spawn(&env.config, "pod-a");
    let ids = env.publish_held("orphan", 4).await;
    assert!(wait_for(Duration::from_secs(20), || async { app.start_count() == 4 }).await);
    let _b = ChildWorker::spawn(&env.config, "pod-b");
    tokio::time::sleep(Duration::from_millis(500)).await;
    a.kill9();
    let died = Instant::now();
    assert!(
        wait_for(Duration::from_secs(40), || async {
            ids.iter().all(|id| app.starts_of(id).len() == 2)
        })
        .await,
        "jobs of the dead worker were not recovered"
    );
    let mut took: Vec<Duration> = ids
        .iter()
        .map(|id| app.starts_of(id)[1].at - died)
        .collect();
    took.sort();
    println!(
        "worker killed for good (defaults: beat 5s, dead after 15s): recovered after p50 {:?}, max {:?}",
        took[took.len() / 2],
        took.last().unwrap()
    );
    for id in &ids {
        let starts = app.starts_of(id);
        assert!(starts[0].worker.starts_with("pod-a-"), "{starts:?}");
        assert!(starts[1].worker.starts_with("pod-b-"), "{starts:?}");
    }
    release_and_expect(&env, &app, &ids, &["owner_dead", "completed"]).await;
}

#[tokio::test]
async fn a_sigstopped_worker_loses_its_jobs_and_completes_nothing_after_sigcont() {
    let app = RecordingApp::start().await;
    let env = TestEnv::new(&http_queue(&app.url, &with_worker(FAST))).await;
    completions::record_completions(&env).await;
    let a = ChildWorker::spawn(&env.config, "pod-a");
    let ids = env.publish_held("paused", 3).await;
    assert!(wait_for(Duration::from_secs(20), || async { app.start_count() == 3 }).await);
    let _b = ChildWorker::spawn(&env.config, "pod-b");
    a.signal(Signal::SIGSTOP);
    assert!(
        wait_for(Duration::from_secs(20), || async {
            ids.iter().all(|id| app.starts_of(id).len() == 2)
        })
        .await,
        "paused worker's jobs were not reclaimed"
    );
    // B finishes them; A's held requests are answered too, but A is still stopped: each job's
    // handler reaches its end twice, and A holds a finished run of each when it wakes.
    app.release();
    assert!(env.wait_count("completed", 3, 10).await);
    let ended_twice = wait_for(Duration::from_secs(5), || async {
        let answered = app.answered.lock().unwrap();
        ids.iter()
            .all(|id| answered.iter().filter(|(a, _, _)| a == id).count() == 2)
    })
    .await;
    assert!(
        ended_twice,
        "not every job's handler reached its end for both workers: {:?}",
        app.answered.lock().unwrap()
    );
    a.signal(Signal::SIGCONT);
    // A wakes up: declared dead, its attempts are stopped and settle nothing. (Whether it
    // reads its application's late answers before it notices is a race; a late success it
    // does read is recorded as `lost_ownership`, never as a second completion.)
    let a_id: String = {
        let c = env.store.raw().await.unwrap();
        c.query_one(
            "SELECT id FROM workers WHERE hostname = 'pod-a' ORDER BY started_at LIMIT 1",
            &[],
        )
        .await
        .unwrap()
        .get(0)
    };
    assert!(
        wait_for(Duration::from_secs(15), || async {
            let c = env.store.raw().await.unwrap();
            let beat_again: i64 = c
                .query_one(
                    "SELECT count(*) FROM workers WHERE id = $1 AND stopped_at IS NULL",
                    &[&a_id],
                )
                .await
                .unwrap()
                .get(0);
            beat_again == 1
        })
        .await,
        "the paused worker did not register again after SIGCONT"
    );
    // A second for a late settle of A's to land, if the fences let one through.
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Completions counted at the source (job_attempts shows at most one per job whatever
    // happened): exactly one each, B's, settling B's own run.
    let recorded = completions::completions(&env).await;
    for id in &ids {
        let done = recorded.get(id).map_or(&[][..], Vec::as_slice);
        assert!(
            done.len() == 1
                && done[0]
                    .worker_id
                    .as_deref()
                    .is_some_and(|w| w.starts_with("pod-b-"))
                && done[0].settled_its_own_run(),
            "{id} must be completed once, by pod-b, settling its own run; completions: {done:#?}"
        );
        let o = outcomes(&env.store, id).await;
        assert!(o.contains(&"owner_dead".to_string()), "{id}: {o:?}");
        // A republished message may land in the paused worker's still-open pull request:
        // broker-loss repair (or adoption) brings it back.
        assert!(
            o.iter().all(|x| matches!(
                x.as_str(),
                "owner_dead" | "completed" | "lost_ownership" | "broker_lost" | "adopted"
            )),
            "{id}: {o:?}"
        );
        let job = env.store.job_get(id).await.unwrap().unwrap();
        assert_eq!(job.status, "completed");
        assert!(job.worker_id.unwrap().starts_with("pod-b-"));
    }
}

#[tokio::test]
async fn a_hung_handler_is_reclaimed_but_a_slow_healthy_one_never_is() {
    let env = TestEnv::new(
        "heartbeat_every = \"200ms\"\nstale_after = \"1s\"\nsweep_every = \"200ms\"\n\
         [queues.work]\nconcurrency = 4\nhandler = { kind = \"rust\", name = \"h\" }\n",
    )
    .await;
    let hung_stopped = Arc::new(AtomicBool::new(false));
    let hs = hung_stopped.clone();
    let h = from_fn(move |job| {
        let hs = hs.clone();
        async move {
            match (job.id.as_str(), job.attempt) {
                ("hung", 1) => {
                    // Never reports, never returns: only recovery can save this job. The
                    // guard notices when the worker stops (drops) this attempt.
                    struct Stopped(Arc<AtomicBool>);
                    impl Drop for Stopped {
                        fn drop(&mut self) {
                            self.0.store(true, Ordering::SeqCst);
                        }
                    }
                    let _guard = Stopped(hs);
                    std::future::pending::<()>().await;
                    Ok(None)
                }
                ("healthy", _) => {
                    // Runs 5 × stale_after, reporting every 300 ms.
                    for i in 0..17 {
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        job.progress(Progress {
                            progress: Some(i as f32 / 17.0),
                            ..Default::default()
                        })
                        .await
                        .map_err(|e| JobError::retry(e.to_string()))?;
                    }
                    Ok(None)
                }
                _ => Ok(None),
            }
        }
    });
    let worker = env.worker(&[("h", h)]).await;
    env.publish_raw("work", r#"{"id":"hung","payload":{}}"#)
        .await;
    env.publish_raw("work", r#"{"id":"healthy","payload":{}}"#)
        .await;
    assert!(
        wait_for(Duration::from_secs(20), || async {
            env.status_of("hung").await.as_deref() == Some("completed")
                && env.status_of("healthy").await.as_deref() == Some("completed")
        })
        .await
    );
    assert_eq!(
        outcomes(&env.store, "hung").await,
        vec!["stale", "completed"]
    );
    assert_eq!(outcomes(&env.store, "healthy").await, vec!["completed"]);
    assert_eq!(
        env.store
            .job_get("healthy")
            .await
            .unwrap()
            .unwrap()
            .attempts,
        1
    );
    assert!(
        hung_stopped.load(Ordering::SeqCst),
        "the hung attempt was not stopped"
    );
    assert!(stat(&worker.stats.reclaimed_stale) >= 1);
    worker.shutdown().await;
}

#[tokio::test]
async fn jobs_whose_messages_were_purged_still_complete() {
    let env = TestEnv::new(
        "sweep_every = \"300ms\"\nbroker_lost_after = \"1s\"\n\
         [queues.work]\nconcurrency = 50\nhandler = { kind = \"rust\", name = \"h\" }\n",
    )
    .await;
    for i in 0..500 {
        env.enqueue_id("work", &format!("purged-{i}"), json!({"n": i}))
            .await
            .unwrap();
    }
    env.broker.stream().await.unwrap().purge().await.unwrap();
    assert_eq!(env.consumer_backlog("work").await.0, 0, "stream purged");
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    let h = from_fn(move |_job| {
        let r = r.clone();
        async move {
            r.fetch_add(1, Ordering::SeqCst);
            Ok(None)
        }
    });
    let worker = env.worker(&[("h", h)]).await;
    assert!(
        wait_for(Duration::from_secs(30), || async {
            env.count("completed").await == 500
        })
        .await,
        "completed {}",
        env.count("completed").await
    );
    assert_eq!(runs.load(Ordering::SeqCst), 500, "each job ran once");
    assert_eq!(
        outcomes(&env.store, "purged-7").await,
        vec!["broker_lost", "completed"]
    );
    assert_eq!(stat(&worker.stats.republished_broker_lost), 500);
    worker.shutdown().await;
}

#[tokio::test]
async fn sigterm_finishes_short_jobs_releases_long_ones_and_exits_cleanly() {
    let app = RecordingApp::start().await;
    let env = TestEnv::new(&http_queue(&app.url, "shutdown_grace = \"1s\"\n")).await;
    let mut a = ChildWorker::spawn(&env.config, "pod-a");
    let long = env.publish_held("long", 2).await;
    for i in 0..3 {
        env.publish_raw(
            "work",
            format!(r#"{{"id":"short-{i}","payload":{{"ms":300}}}}"#),
        )
        .await;
    }
    assert!(wait_for(Duration::from_secs(20), || async { app.start_count() == 5 }).await);
    let _b = ChildWorker::spawn(&env.config, "pod-b");
    tokio::time::sleep(Duration::from_millis(300)).await;
    a.signal(Signal::SIGTERM);
    let termed = Instant::now();
    let code = a.wait_exit(Duration::from_secs(10)).await;
    let exited = termed.elapsed();
    assert_eq!(code, Some(0), "exit code after SIGTERM");
    assert!(
        wait_for(Duration::from_secs(10), || async {
            long.iter().all(|id| app.starts_of(id).len() == 2)
        })
        .await
    );
    let restarted: Vec<Duration> = long
        .iter()
        .map(|id| app.starts_of(id)[1].at - termed)
        .collect();
    println!("SIGTERM: process exited after {exited:?} (grace 1s); long jobs started elsewhere after {restarted:?}");
    app.release();
    assert!(env.wait_count("completed", 5, 10).await);
    for i in 0..3 {
        assert_eq!(
            outcomes(&env.store, &format!("short-{i}")).await,
            vec!["completed"]
        );
    }
    for id in &long {
        assert_eq!(
            outcomes(&env.store, id).await,
            vec!["released", "completed"],
            "{id}"
        );
        // A graceful release does not cost an attempt.
        assert_eq!(
            env.store.job_get(id).await.unwrap().unwrap().attempts,
            1,
            "{id}"
        );
        assert!(app.starts_of(id)[1].worker.starts_with("pod-b-"));
    }
    let c = env.store.raw().await.unwrap();
    let stopped: Option<String> = c
        .query_one(
            "SELECT stop_reason FROM workers WHERE hostname = 'pod-a'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(stopped.as_deref(), Some("shutdown"));
}

#[tokio::test]
async fn a_job_that_kills_its_worker_every_time_ends_dead_after_max_attempts() {
    let env = TestEnv::new(
        "[queues.work]\nmax_attempts = 3\n\
         handler = { kind = \"exec\", command = [\"sh\", \"-c\", \"kill -9 $PPID; sleep 5\"] }\n",
    )
    .await;
    env.publish_raw("work", r#"{"id":"poison","payload":{}}"#)
        .await;
    let mut crashes = 0;
    let started = Instant::now();
    while env.status_of("poison").await.as_deref() != Some("dead") {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "never dead-lettered"
        );
        let mut w = ChildWorker::spawn(&env.config, "pod-0");
        if w.wait_exit(Duration::from_secs(10)).await.is_some() {
            crashes += 1;
        } else {
            // The last start found the job dead and kept running: that is the end state.
            drop(w);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    assert_eq!(crashes, 3, "the job killed its worker once per attempt");
    let job = env.store.job_get("poison").await.unwrap().unwrap();
    assert_eq!(job.attempts, 3);
    assert_eq!(outcomes(&env.store, "poison").await, vec!["restarted"; 3]);
    assert!(job.last_error.unwrap().contains("attempt 3 of 3"));
}

// Two runtime threads: a restart blocks the test's thread (block_in_place) while the worker
// runs on, so the faults hit it mid-work rather than while it is frozen with the test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_and_nats_restarts_lose_nothing() {
    let pg = common::testkit::PgCluster::start().unwrap();
    let mut env = TestEnv::with_database(
        &pg.url(),
        "sweep_every = \"500ms\"\nbroker_lost_after = \"2s\"\nheartbeat_every = \"1s\"\n\
         [queues.work]\nconcurrency = 20\nhandler = { kind = \"rust\", name = \"h\" }\n",
    )
    .await;
    completions::record_completions(&env).await;
    let done = Arc::new(Mutex::new(std::collections::HashMap::<String, u32>::new()));
    let d = done.clone();
    // Jobs of 200 ms, about 60 enqueued a second: a dozen run at any time, so the restarts
    // find jobs running, claims and settles in flight.
    let h = from_fn(move |job| {
        let d = d.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            *d.lock().unwrap().entry(job.id.clone()).or_default() += 1;
            Ok(None)
        }
    });
    let worker = env.worker(&[("h", h)]).await;
    let mut submitted = BTreeSet::new();
    // Enqueues that failed otherwise: not promised, but one whose commit went through before
    // its answer was lost exists, and must then complete like any other.
    let mut unsure = BTreeSet::new();
    let started = Instant::now();
    let mut pg_restarted = false;
    let mut nats_restarted = false;
    let mut i = 0;
    while started.elapsed() < Duration::from_secs(6) {
        let id = format!("fault-{i}");
        i += 1;
        match env.enqueue_id("work", &id, json!({})).await {
            // Stored (even if the publish failed): it must complete.
            Ok(_) | Err(jobwarden::client::ClientError::Publish { .. }) => {
                submitted.insert(id);
            }
            Err(_) => {
                unsure.insert(id);
            }
        }
        if !pg_restarted && started.elapsed() > Duration::from_millis(1500) {
            tokio::task::block_in_place(|| pg.restart_immediate().unwrap());
            pg_restarted = true;
        }
        if !nats_restarted && started.elapsed() > Duration::from_millis(3500) {
            tokio::task::block_in_place(|| env.nats.restart().unwrap());
            nats_restarted = true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let n = submitted.len();
    assert!(n > 100, "only {n} jobs submitted");
    // Every job's status, by id (empty while PostgreSQL does not answer).
    let statuses = || async {
        let Ok(c) = env.store.raw().await else {
            return BTreeMap::new();
        };
        c.query("SELECT id, status FROM jobs", &[])
            .await
            .map(|rows| {
                rows.iter()
                    .map(|r| (r.get::<_, String>(0), r.get::<_, String>(1)))
                    .collect::<BTreeMap<_, _>>()
            })
            .unwrap_or_default()
    };
    let all_done = wait_for(Duration::from_secs(60), || async {
        let jobs = statuses().await;
        submitted.iter().all(|id| jobs.contains_key(id)) && jobs.values().all(|s| s == "completed")
    })
    .await;
    let jobs = statuses().await;
    let runs = done.lock().unwrap().clone();
    // Submitted jobs missing or not completed, and any other job not completed.
    let not_completed: Vec<(&String, Option<&String>)> = submitted
        .iter()
        .map(|id| (id, jobs.get(id)))
        .chain(jobs.iter().map(|(id, s)| (id, Some(s))))
        .filter(|(_, s)| s.map(String::as_str) != Some("completed"))
        .collect::<BTreeMap<_, _>>()
        .into_iter()
        .collect();
    if !all_done {
        let backlog = env.consumer_backlog("work").await;
        panic!(
            "{} of {n} submitted jobs did not complete within 60 s (id, status): {:?}; \
             consumer (pending, ack_pending) {backlog:?}",
            not_completed.len(),
            &not_completed[..not_completed.len().min(10)]
        );
    }
    // The same ids, no others: every job that exists was submitted (or its enqueue's answer
    // was lost), and completed exactly once at the source, its handler having run.
    let extra: Vec<&String> = jobs
        .keys()
        .filter(|id| !submitted.contains(*id) && !unsure.contains(*id))
        .collect();
    assert!(extra.is_empty(), "jobs nobody submitted: {extra:?}");
    let recorded = completions::completions(&env).await;
    let not_once = completions::not_completed_once(&recorded, jobs.keys());
    assert!(
        not_once.is_empty(),
        "{} jobs not completed exactly once at the source; the first: {:?}",
        not_once.len(),
        &not_once[..not_once.len().min(5)]
    );
    let never_ran: Vec<&String> = jobs.keys().filter(|id| !runs.contains_key(*id)).collect();
    assert!(
        never_ran.is_empty(),
        "jobs completed without their handler running: {never_ran:?}"
    );
    println!(
        "server restarts: {n} jobs submitted (and {} of {} enqueues that failed were stored), \
         each completed once; {} ran more than once",
        jobs.len() - n,
        unsure.len(),
        runs.values().filter(|&&c| c > 1).count()
    );
    worker.shutdown().await;
}

/// A pull request the server never answers (it hung, then restarted and forgot it) must not
/// stall the queue: the worker gives up on it and pulls again.
#[tokio::test]
async fn a_nats_server_that_hangs_then_restarts_stalls_no_queue() {
    let mut env = TestEnv::new(
        "heartbeat_every = \"1s\"\n\
         [queues.work]\nconcurrency = 4\nhandler = { kind = \"rust\", name = \"h\" }\n",
    )
    .await;
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    let h = from_fn(move |_job| {
        let r = r.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(5)).await;
            r.fetch_add(1, Ordering::SeqCst);
            Ok(None)
        }
    });
    let n: i64 = 400;
    for i in 0..n {
        env.enqueue_id("work", &format!("hang-{i}"), json!({}))
            .await
            .unwrap();
    }
    let worker = env.worker(&[("h", h)]).await;
    assert!(
        wait_for(Duration::from_secs(20), || async {
            runs.load(Ordering::SeqCst) >= 20
        })
        .await,
        "the worker never got going"
    );
    // The queue has a backlog, so pulls are always out: the ones sent while the server is
    // stopped reach its socket and die with it.
    env.nats.pause().unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    env.nats.restart().unwrap();
    let completed = env.wait_count("completed", n, 45).await;
    assert!(
        completed,
        "only {} of {n} jobs completed after the server came back; {} handler runs",
        env.count("completed").await,
        runs.load(Ordering::SeqCst)
    );
    worker.shutdown().await;
}

#[tokio::test]
async fn a_second_signal_exits_at_once() {
    let app = RecordingApp::start().await;
    let env = TestEnv::new(&http_queue(&app.url, "shutdown_grace = \"60s\"\n")).await;
    let mut a = ChildWorker::spawn(&env.config, "pod-a");
    env.publish_held("stubborn", 1).await;
    assert!(wait_for(Duration::from_secs(20), || async { app.start_count() == 1 }).await);
    a.signal(Signal::SIGTERM);
    // The first signal starts a 60 s drain: the process is still there.
    assert_eq!(a.wait_exit(Duration::from_millis(700)).await, None);
    a.signal(Signal::SIGTERM);
    let code = a.wait_exit(Duration::from_secs(5)).await;
    assert_eq!(
        code,
        Some(130),
        "a second signal must end the process at once"
    );
}

#[tokio::test]
async fn a_claim_still_in_flight_at_shutdown_gives_its_jobs_back_and_each_runs_once_later() {
    // The producer keeps up to two claim statements in flight. One whose answer comes after
    // the worker began to stop must not start its jobs, nor lose them: they go back (attempt
    // refunded, message nak'd) and the next worker runs each once.
    let env = TestEnv::new(
        "[queues.work]\nconcurrency = 10\nhandler = { kind = \"rust\", name = \"h\" }\n",
    )
    .await;
    let runs = Arc::new(Mutex::new(Vec::<(u32, String)>::new()));
    let recorder = |w: u32| {
        let runs = runs.clone();
        from_fn(move |job| {
            runs.lock().unwrap().push((w, job.id.clone()));
            async { Ok(None) }
        })
    };
    let first = env.worker(&[("h", recorder(1))]).await;
    // Hold every claim: SHARE mode conflicts with the ROW EXCLUSIVE lock an INSERT takes.
    let mut locker = env.store.raw().await.unwrap();
    let tx = locker.transaction().await.unwrap();
    tx.batch_execute("LOCK TABLE jobs IN SHARE MODE")
        .await
        .unwrap();
    for i in 0..5 {
        env.publish_raw("work", format!(r#"{{"id":"held-{i}","payload":{{}}}}"#))
            .await;
    }
    let blocked = wait_for(Duration::from_secs(10), || async {
        env.scalar(
            "SELECT count(*) FROM pg_locks WHERE relation = 'jobs'::regclass AND NOT granted",
        )
        .await
            >= 1
    })
    .await;
    assert!(blocked, "the claim never reached the lock");
    let stopping = tokio::spawn(first.shutdown());
    tokio::time::sleep(Duration::from_millis(500)).await;
    tx.commit().await.unwrap();
    stopping.await.unwrap();
    assert!(
        runs.lock().unwrap().is_empty(),
        "a job started on the stopping worker: {:?}",
        runs.lock().unwrap()
    );
    assert_eq!(
        env.scalar("SELECT count(*) FROM jobs WHERE status = 'processing'")
            .await,
        0
    );
    let second = env.worker(&[("h", recorder(2))]).await;
    assert!(env.wait_count("completed", 5, 20).await);
    // (Not asserted: that the consumer is drained. A nak sent at the stop may be redelivered
    // into a pull request the stopping worker still had open; that copy waits for ack_wait
    // and is then dropped as done. The released row itself was republished and ran.)
    second.shutdown().await;
    let mut ran: Vec<String> = runs
        .lock()
        .unwrap()
        .iter()
        .map(|(_, id)| id.clone())
        .collect();
    ran.sort();
    let want: Vec<String> = (0..5).map(|i| format!("held-{i}")).collect();
    assert_eq!(ran, want, "each job once, all on the second worker");
    assert!(runs.lock().unwrap().iter().all(|(w, _)| *w == 2));
    // A job given back cost no attempt.
    assert_eq!(
        env.scalar("SELECT count(*) FROM jobs WHERE attempts <> 1")
            .await,
        0
    );
}

/// Invariant 5, the other half: a job that runs three times `ack_wait` (reporting progress,
/// so it is healthy) keeps its message with in-progress acks — JetStream never redelivers it
/// while it runs, and it runs once. (The worker sends one at each progress report and one
/// every third of `ack_wait`; with neither, this test sees the message redelivered.)
#[tokio::test]
async fn a_job_running_past_ack_wait_keeps_its_message_with_in_progress_acks() {
    let env = TestEnv::new(
        "heartbeat_every = \"200ms\"\nstale_after = \"1s\"\nsweep_every = \"200ms\"\n\
         [queues.work]\nconcurrency = 4\nhandler = { kind = \"rust\", name = \"h\" }\n",
    )
    .await;
    // The queue's consumer again, with a 2 s ack_wait.
    let mut cfg = env.config.clone();
    cfg.nats.ack_wait = Duration::from_secs(2);
    cfg.validate().unwrap();
    env.reprovision(&cfg, "work").await;
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    let h = from_fn(move |job| {
        let r = r.clone();
        async move {
            r.fetch_add(1, Ordering::SeqCst);
            // 6 s, three times ack_wait, reporting every 300 ms.
            for _ in 0..20 {
                tokio::time::sleep(Duration::from_millis(300)).await;
                job.progress(Progress::default())
                    .await
                    .map_err(|e| JobError::retry(e.to_string()))?;
            }
            Ok(None)
        }
    });
    let worker = env.worker_with(cfg, &[("h", h)]).await;
    env.publish_raw("work", r#"{"id":"long","payload":{}}"#)
        .await;
    assert!(env.wait_status("long", "completed", 20).await);
    env.wait_consumer_drained("work").await;
    let info = env
        .broker
        .consumer(&jobwarden::broker::Lane::bare("work"))
        .await
        .unwrap()
        .info()
        .await
        .unwrap()
        .clone();
    assert_eq!(
        info.num_redelivered, 0,
        "JetStream redelivered the running job's message"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(outcomes(&env.store, "long").await, vec!["completed"]);
    assert_eq!(
        stat(&worker.stats.dropped),
        0,
        "no copy of its message was dropped"
    );
    worker.shutdown().await;
}

/// Invariant 3 on the settle side: commit, then ack. A job whose handler has finished but
/// whose settle cannot commit yet (another transaction holds its row) keeps its message
/// unacked for as long as the settle waits; the moment the settle commits, the message is
/// acked. (With the ack sent before the settle, the consumer shows nothing unacked while
/// the row is still `processing`, and a crash then would lose the job's ending.)
#[tokio::test]
async fn a_finished_job_whose_settle_has_not_committed_keeps_its_message_unacked() {
    let env = TestEnv::new(
        "[queues.work]\nconcurrency = 4\nhandler = { kind = \"rust\", name = \"h\" }\n",
    )
    .await;
    let started = Arc::new(tokio::sync::Notify::new());
    let finish = Arc::new(tokio::sync::Notify::new());
    let runs = Arc::new(AtomicU32::new(0));
    let (s, f, r) = (started.clone(), finish.clone(), runs.clone());
    let h = from_fn(move |_job| {
        let (s, f, r) = (s.clone(), f.clone(), r.clone());
        async move {
            s.notify_one();
            f.notified().await;
            r.fetch_add(1, Ordering::SeqCst);
            Ok(Some(json!({"done": true})))
        }
    });
    let worker = env.worker(&[("h", h)]).await;
    env.publish_raw("work", r#"{"id":"held-settle","payload":{}}"#)
        .await;
    tokio::time::timeout(Duration::from_secs(20), started.notified())
        .await
        .expect("the job did not start");

    // Another transaction locks the job's row; the handler then finishes.
    let mut locker = env.store.raw().await.unwrap();
    let tx = locker.transaction().await.unwrap();
    tx.execute(
        "SELECT 1 FROM jobs WHERE id = 'held-settle' FOR UPDATE",
        &[],
    )
    .await
    .unwrap();
    finish.notify_one();
    let blocked = waits_on(&env.store, &tx, Duration::from_secs(10)).await;
    assert!(
        blocked,
        "the worker's settle never waited on the locked row"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler finished");

    // For as long as the settle waits, the row is processing and the message unacked.
    for _ in 0..10 {
        assert_eq!(
            env.status_of("held-settle").await.as_deref(),
            Some("processing")
        );
        assert_eq!(
            env.consumer_backlog("work").await,
            (0, 1),
            "the message must stay delivered and unacked while its settle has not committed \
             (pending, ack_pending)"
        );
        tokio::time::sleep(Duration::from_millis(150)).await;
    }

    // The lock goes; the settle commits, and only then is the message acked.
    tx.rollback().await.unwrap();
    assert!(env.wait_status("held-settle", "completed", 10).await);
    env.wait_consumer_drained("work").await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(outcomes(&env.store, "held-settle").await, vec!["completed"]);
    worker.shutdown().await;
}

/// Invariant 8, "this host only": a worker that starts under another host name right after a
/// worker was killed does not take the killed worker's jobs at start-up, even though the
/// killed process is provably gone on this machine — another host's incarnations are judged
/// by their heartbeats alone, so the jobs wait for the reaper (`dead_after`) and are recorded
/// as taken from a dead owner, not as restarted.
#[tokio::test]
async fn a_worker_starting_under_another_host_name_leaves_a_killed_workers_jobs_to_the_reaper() {
    const DEAD_AFTER: Duration = Duration::from_secs(5);
    let app = RecordingApp::start().await;
    let env = TestEnv::new(&http_queue(
        &app.url,
        "heartbeat_every = \"500ms\"\ndead_after = \"5s\"\nreap_every = \"200ms\"\n\
         sweep_every = \"500ms\"\nbroker_lost_after = \"2s\"\n",
    ))
    .await;
    let mut a = ChildWorker::spawn(&env.config, "pod-a");
    let ids = env.publish_held("elsewhere", 3).await;
    assert!(wait_for(Duration::from_secs(20), || async { app.start_count() == 3 }).await);
    a.kill9();
    let killed = Instant::now();
    let _b = ChildWorker::spawn(&env.config, "pod-b");
    assert!(
        wait_for(Duration::from_secs(30), || async {
            ids.iter().all(|id| app.starts_of(id).len() == 2)
        })
        .await,
        "the killed worker's jobs were not recovered"
    );
    for id in &ids {
        let again = &app.starts_of(id)[1];
        assert!(again.worker.starts_with("pod-b-"), "{again:?}");
        // The last beat was at most one heartbeat before the kill.
        let waited = again.at - killed;
        assert!(
            waited >= DEAD_AFTER - Duration::from_millis(500) - Duration::from_millis(300),
            "{id} ran again {waited:?} after the kill, before its owner could be judged dead \
             by its heartbeat ({DEAD_AFTER:?}): another host's start-up took it"
        );
    }
    release_and_expect(&env, &app, &ids, &["owner_dead", "completed"]).await;
}

/// Invariant 1 on the claim's side: a job whose claim has committed but whose answer this
/// worker has not taken in yet (the rest of its group waits on another transaction) is this
/// worker's. The heartbeat gives back jobs the database says it owns and that do not run
/// here; it must not take such a claim for one, however many beats pass, or the job goes
/// back to the queue while the claim's answer — arriving later — still runs it here.
#[tokio::test]
async fn a_committed_claim_whose_answer_is_late_is_not_given_back_by_the_heartbeat() {
    let env = TestEnv::new(&with_worker(
        "heartbeat_every = \"200ms\"\ndead_after = \"10s\"\n\
         [queues.work]\nconcurrency = 4\nhandler = { kind = \"rust\", name = \"h\" }\n",
    ))
    .await;
    let runs: Arc<Mutex<BTreeMap<String, u32>>> = Arc::default();
    let r = runs.clone();
    let h = from_fn(move |job| {
        let r = r.clone();
        async move {
            *r.lock().unwrap().entry(job.id.clone()).or_default() += 1;
            Ok(None)
        }
    });
    // Another transaction inserts the row of `blocker` and holds it uncommitted: the claim of
    // its message waits on it.
    let mut locker = env.store.raw().await.unwrap();
    let tx = hold_blocker(&mut locker).await;
    // Both messages wait in the stream before the worker starts, so they arrive as one
    // group: `fresh` is new (its row is inserted and committed at once), `blocker` carries
    // an idempotency key (its row may exist: the full claim, which waits on the lock).
    publish_fresh_and_blocker(&env).await;
    let worker = env.worker(&[("h", h)]).await;
    let blocked = waits_on(&env.store, &tx, Duration::from_secs(10)).await;
    assert!(blocked, "the claim of `blocker` never waited on the lock");
    assert_eq!(
        env.status_of("fresh").await.as_deref(),
        Some("processing"),
        "the premise: `fresh` is claimed (committed) while its group's answer waits"
    );
    // Ten beats go by with the claim's answer still out.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        outcomes(&env.store, "fresh").await,
        Vec::<String>::new(),
        "a claim still being answered was given back while its worker was about to run it"
    );
    assert_eq!(env.status_of("fresh").await.as_deref(), Some("processing"));

    // The lock goes: the group's answer comes in, and each job runs once, here.
    tx.rollback().await.unwrap();
    assert!(env.wait_status("fresh", "completed", 10).await);
    assert!(env.wait_status("blocker", "completed", 10).await);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        runs.lock().unwrap().clone(),
        BTreeMap::from([("blocker".to_string(), 1), ("fresh".to_string(), 1)])
    );
    assert_eq!(outcomes(&env.store, "fresh").await, vec!["completed"]);
    worker.shutdown().await;
}

/// Whether some session came to wait, within `limit`, on a lock that transaction `tx` holds.
async fn waits_on(
    store: &jobwarden::store::Store,
    tx: &deadpool_postgres::Transaction<'_>,
    limit: Duration,
) -> bool {
    let pid: i32 = tx
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let watcher = store.raw().await.unwrap();
    wait_for(limit, || async {
        watcher
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))",
                &[&pid],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
            >= 1
    })
    .await
}

/// Inserts the row of `blocker` in a transaction it keeps open: the claim of its message
/// waits on it.
async fn hold_blocker(
    locker: &mut deadpool_postgres::Object,
) -> deadpool_postgres::Transaction<'_> {
    let tx = locker.transaction().await.unwrap();
    tx.execute(
        "INSERT INTO jobs (id, queue, payload, status, max_attempts) \
         VALUES ('blocker', 'work', '{}', 'queued', 3)",
        &[],
    )
    .await
    .unwrap();
    tx
}

/// Publishes `fresh` (a new job: its row is inserted and committed at once) and `blocker`
/// (with an idempotency key: the full claim, which waits on `hold_blocker`'s row). Published
/// before the worker starts, they arrive as one group.
async fn publish_fresh_and_blocker(env: &TestEnv) {
    env.publish_raw("work", r#"{"id":"fresh","payload":{}}"#)
        .await;
    env.publish_raw(
        "work",
        r#"{"id":"blocker","idempotency_key":"k-blocker","payload":{}}"#,
    )
    .await;
}

/// A claim answered after its jobs' stale deadline (counted from the statement's start) is
/// given back, not run: meanwhile the stale sweep took `fresh` and it ran again as attempt 2,
/// so running the late answer's attempt too would run one job twice at once (the chaos test
/// saw it after a 3 s database stall).
#[tokio::test]
async fn a_claim_answered_after_its_stale_deadline_is_given_back_not_run() {
    let env = TestEnv::new(&with_worker(
        "heartbeat_every = \"200ms\"\ndead_after = \"10s\"\nsweep_every = \"200ms\"\n\
         [queues.work]\nconcurrency = 4\nstale_after = \"1s\"\n\
         handler = { kind = \"rust\", name = \"h\" }\n",
    ))
    .await;
    let runs: Arc<Mutex<BTreeMap<String, u32>>> = Arc::default();
    let r = runs.clone();
    let h = from_fn(move |job| {
        let r = r.clone();
        async move {
            *r.lock().unwrap().entry(job.id.clone()).or_default() += 1;
            Ok(None)
        }
    });
    let mut locker = env.store.raw().await.unwrap();
    let tx = hold_blocker(&mut locker).await;
    publish_fresh_and_blocker(&env).await;
    let worker = env.worker(&[("h", h)]).await;
    assert!(
        waits_on(&env.store, &tx, Duration::from_secs(10)).await,
        "the claim of `blocker` never waited on the lock"
    );
    // The premise: the stale sweep takes `fresh` from the waiting claim, and its next
    // attempt runs and completes.
    assert!(env.wait_status("fresh", "completed", 15).await);
    assert_eq!(
        outcomes(&env.store, "fresh").await,
        vec!["stale", "completed"]
    );

    // The lock goes: the late answer of attempt 1 comes in, and must not run it.
    tx.rollback().await.unwrap();
    assert!(env.wait_status("blocker", "completed", 10).await);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        runs.lock().unwrap().get("fresh").copied(),
        Some(1),
        "the late claim's attempt ran beside the one the stale sweep made"
    );
    worker.shutdown().await;
}
