//! The core loop against real servers: publish → claim → run → settle, nothing lost, nothing
//! doubled.

mod common;

use common::{completions, stat, wait_for, TestEnv};
use jobwarden::handler::{from_fn, JobError, Progress};
use jobwarden::store::Claim;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const RUST_QUEUE: &str = r#"
[queues.work]
concurrency = 32
max_attempts = 3
backoff = { kind = "fixed", base = "50ms" }
handler = { kind = "rust", name = "h" }
"#;

type Runs = Arc<Mutex<HashMap<String, u32>>>;

/// A handler that counts how often it ran each job id.
fn counting() -> (Arc<dyn jobwarden::Handler>, Runs) {
    let runs = Arc::new(Mutex::new(HashMap::<String, u32>::new()));
    let r = runs.clone();
    let h = from_fn(move |job| {
        let r = r.clone();
        async move {
            *r.lock().unwrap().entry(job.id.clone()).or_default() += 1;
            Ok(Some(json!({"echo": job.payload})))
        }
    });
    (h, runs)
}

#[tokio::test]
async fn thousand_plain_messages_all_complete_exactly_once() {
    let env = TestEnv::new(RUST_QUEUE).await;
    let (h, runs) = counting();
    let worker = env.worker(&[("h", h)]).await;
    // A plain producer: JSON objects, no envelope, no id, no headers.
    let mut acks = Vec::new();
    for i in 0..1000 {
        let body = serde_json::to_vec(&json!({"n": i})).unwrap();
        acks.push(
            env.broker
                .js
                .publish("jobs.work", body.into())
                .await
                .unwrap(),
        );
    }
    for a in acks {
        a.await.unwrap();
    }
    assert!(
        wait_for(Duration::from_secs(60), || async {
            env.count("completed").await == 1000
        })
        .await,
        "completed: {}",
        env.count("completed").await
    );
    env.wait_consumer_drained("work").await;
    let runs = runs.lock().unwrap().clone();
    assert_eq!(runs.len(), 1000, "distinct jobs run");
    assert!(runs.values().all(|&n| n == 1), "a job ran twice: {runs:?}");
    // Every payload arrived: the derived ids map to the 1000 distinct payloads.
    let c = env.store.raw().await.unwrap();
    let distinct: i64 = c
        .query_one("SELECT count(DISTINCT payload->'n') FROM jobs", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(distinct, 1000);
    let results: i64 = c
        .query_one(
            "SELECT count(*) FROM jobs WHERE result->'echo'->'n' = payload->'n'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(results, 1000, "results stored");
    assert_eq!(stat(&worker.stats.completed), 1000);
    worker.shutdown().await;
}

#[tokio::test]
async fn same_job_id_published_twice_runs_once() {
    // Every copy below is stored by JetStream (each publish ack says "not a duplicate"), so
    // only jobwarden's claim stands between a copy and a second run: the stream's duplicate
    // window is cut to 1 s and the copies that reuse a Nats-Msg-Id come after it.
    let env = TestEnv::new(RUST_QUEUE).await;
    completions::record_completions(&env).await;
    let window = Duration::from_secs(1);
    let mut stream = env.broker.stream().await.unwrap();
    let mut sc = stream.info().await.unwrap().config.clone();
    sc.duplicate_window = window;
    env.broker.js.update_stream(sc).await.unwrap();
    let mut config = env.config.clone();
    config.nats.duplicate_window = window;
    // Counts runs; holds the first run of dup-2 until released.
    let runs: Runs = Arc::default();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let (r, g) = (runs.clone(), gate.clone());
    let h = from_fn(move |job| {
        let (r, g) = (r.clone(), g.clone());
        async move {
            *r.lock().unwrap().entry(job.id.clone()).or_default() += 1;
            if job.id == "dup-2" {
                g.acquire().await.unwrap().forget();
            }
            Ok(None)
        }
    });
    let worker = env.worker_with(config, &[("h", h)]).await;
    let stored = |ack: async_nats::jetstream::publish::PublishAck, what: &str| {
        assert!(
            !ack.duplicate,
            "JetStream dropped {what} as a duplicate: the test needs it stored"
        );
    };
    // A body id, no Nats-Msg-Id: both copies stored, back to back.
    let body = br#"{"id":"dup-1","payload":{"x":1}}"#.to_vec();
    let publish_body = || async {
        env.broker
            .js
            .publish("jobs.work", body.clone().into())
            .await
            .unwrap()
            .await
            .unwrap()
    };
    stored(publish_body().await, "dup-1's first copy");
    stored(publish_body().await, "dup-1's second copy");
    // A Nats-Msg-Id without a body id names the job too. Its second copy comes while the
    // first runs (held), past the duplicate window.
    let publish_header = || async {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(async_nats::header::NATS_MESSAGE_ID, "dup-2");
        env.broker
            .js
            .publish_with_headers("jobs.work", headers, br#"{"y":2}"#.to_vec().into())
            .await
            .unwrap()
            .await
            .unwrap()
    };
    stored(publish_header().await, "dup-2's first copy");
    assert!(
        wait_for(Duration::from_secs(20), || async {
            runs.lock().unwrap().contains_key("dup-2")
        })
        .await,
        "dup-2 never started"
    );
    tokio::time::sleep(window + Duration::from_millis(500)).await;
    stored(publish_header().await, "dup-2's copy sent while it runs");
    // That copy is acked and dropped while the first still runs: one message unacked (the
    // running one), none waiting.
    let absorbed = wait_for(Duration::from_secs(10), || async {
        env.consumer_backlog("work").await == (0, 1)
    })
    .await;
    assert!(
        absorbed,
        "the copy of dup-2 sent while it ran was not dropped: consumer (pending, unacked) = \
         {:?}, runs {:?}",
        env.consumer_backlog("work").await,
        runs.lock().unwrap()
    );
    // Released for good: a run that should not happen still ends, and is counted.
    gate.add_permits(1000);
    assert!(
        wait_for(Duration::from_secs(20), || async {
            env.status_of("dup-1").await.as_deref() == Some("completed")
                && env.status_of("dup-2").await.as_deref() == Some("completed")
        })
        .await,
        "dup-1 and dup-2 did not complete"
    );
    // After completion, another copy of each arrives: acked and dropped, not run.
    tokio::time::sleep(window + Duration::from_millis(500)).await;
    stored(publish_body().await, "dup-1's copy after completion");
    stored(publish_header().await, "dup-2's copy after completion");
    env.wait_consumer_drained("work").await;
    let recorded = completions::completions(&env).await;
    let ids = ["dup-1".to_string(), "dup-2".to_string()];
    let not_once = completions::not_completed_once(&recorded, &ids);
    assert!(
        not_once.is_empty(),
        "not completed exactly once at the source: {not_once:#?}"
    );
    let runs = runs.lock().unwrap().clone();
    assert_eq!(
        (runs.get("dup-1"), runs.get("dup-2")),
        (Some(&1), Some(&1)),
        "each job was to run once whatever copies of its message came; runs: {runs:?}"
    );
    assert_eq!(env.count("completed").await, 2);
    // Three copies found their job taken (dup-1's second may also have been dropped in the
    // same claim group as its first: it counts the same).
    assert!(
        stat(&worker.stats.dropped) >= 4,
        "dropped {}",
        stat(&worker.stats.dropped)
    );
    worker.shutdown().await;
}

#[tokio::test]
async fn a_group_of_new_and_existing_jobs_is_claimed_together_each_once() {
    // The claim inserts new jobs with one statement and claims ids that exist with another:
    // a group mixing both must run each job once, with its own payload.
    let env = TestEnv::new(RUST_QUEUE).await;
    // Before any worker: jobs enqueued through the client (their rows exist, queued, and
    // their messages are published) and plain messages (no row yet), interleaved, so the
    // first pulls bring both kinds together. Plus a second message for an enqueued job.
    for i in 0..40 {
        if i % 2 == 0 {
            env.enqueue_id("work", &format!("old-{i}"), json!({ "n": i }))
                .await
                .unwrap();
        } else {
            env.publish_raw(
                "work",
                format!(r#"{{"id":"new-{i}","payload":{{"n":{i}}}}}"#),
            )
            .await;
        }
    }
    env.publish_raw("work", r#"{"id":"old-0","payload":{"n":0}}"#)
        .await;
    let seen = Arc::new(Mutex::new(HashMap::<String, Vec<i64>>::new()));
    let s = seen.clone();
    let h = from_fn(move |job| {
        s.lock()
            .unwrap()
            .entry(job.id.clone())
            .or_default()
            .push(job.payload["n"].as_i64().unwrap_or(-1));
        async { Ok(None) }
    });
    let worker = env.worker(&[("h", h)]).await;
    assert!(env.wait_count("completed", 40, 20).await);
    env.wait_consumer_drained("work").await;
    worker.shutdown().await;
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 40, "{seen:?}");
    for (id, ns) in &seen {
        let n: i64 = id.split('-').nth(1).unwrap().parse().unwrap();
        assert_eq!(ns, &vec![n], "{id} ran with {ns:?}");
    }
    assert_eq!(
        env.scalar("SELECT count(*) FROM job_attempts WHERE outcome = 'completed'")
            .await,
        40
    );
    assert_eq!(
        env.scalar("SELECT count(*) FROM jobs WHERE status <> 'completed' OR attempts <> 1")
            .await,
        0
    );
}

#[tokio::test]
async fn the_fast_claim_of_a_group_holding_an_existing_id_inserts_none_of_it() {
    // The insert has no ON CONFLICT: one id that exists fails the whole statement, and the
    // store answers "none inserted" (the producer then claims the group with the full claim).
    let env = TestEnv::new(RUST_QUEUE).await;
    let other = env
        .claim_as("w-other", "taken", Duration::from_secs(60))
        .await;
    assert_eq!(other.claims.len(), 1);
    let got = env
        .claim_new_as("w-me", &["fresh-1", "taken", "fresh-2"])
        .await;
    assert!(got.iter().all(Option::is_none), "{got:?}");
    assert_eq!(
        env.scalar("SELECT count(*) FROM jobs WHERE id LIKE 'fresh-%'")
            .await,
        0
    );
    assert_eq!(
        env.scalar("SELECT count(*) FROM jobs WHERE id = 'taken' AND worker_id = 'w-other'")
            .await,
        1
    );
    // Without it, the same insert claims them all, in input order.
    let got = env.claim_new_as("w-me", &["fresh-1", "fresh-2"]).await;
    assert!(
        got.iter()
            .all(|c| matches!(c, Some(Claim::Claimed { attempt: 1, .. }))),
        "{got:?}"
    );
    assert_eq!(
        env.scalar(
            "SELECT count(*) FROM jobs WHERE id LIKE 'fresh-%' AND worker_id = 'w-me' \
             AND status = 'processing'"
        )
        .await,
        2
    );
}

#[tokio::test]
async fn a_group_of_completions_is_settled_as_the_general_settle_would_and_stays_fenced() {
    // A group of plain completions goes to job_settle_completed.sql; a group holding anything
    // else to job_settle.sql. Both must leave a completed job's row the same way, and both
    // must refuse an attempt whose lease moved on.
    use jobwarden::job::JobStatus;
    use jobwarden::store::SettleInput;
    let env = TestEnv::new(RUST_QUEUE).await;
    let ids = ["plain-1", "plain-2", "general-1", "general-2", "fenced"];
    let got = env.claim_new_as("w-me", &ids).await;
    assert!(got.iter().all(Option::is_some), "{got:?}");
    let done = |id: &str, lease: i64, result: Option<Value>| SettleInput {
        id: id.into(),
        lease,
        status: JobStatus::Completed,
        delay: Duration::ZERO,
        retry: Duration::ZERO,
        error: None,
        result,
        outcome: "completed",
        refund: false,
        trace: None,
    };
    let store = &env.store;
    // Plain completions only: the completions' statement. "fenced" carries a stale lease.
    let plain = [
        done("plain-1", 1, Some(json!({"pages": 3}))),
        done("plain-2", 1, None),
        done("fenced", 7, None),
    ];
    assert!(plain.iter().all(SettleInput::is_plain_completion));
    let settled = store.job_settle("w-me", &plain).await.unwrap();
    assert_eq!(settled, vec![true, true, false]);
    // A completion beside a retry: the general statement.
    let retry = SettleInput {
        status: JobStatus::Scheduled,
        delay: Duration::from_secs(60),
        error: Some("boom".into()),
        outcome: "retry",
        ..done("general-2", 1, None)
    };
    assert!(!retry.is_plain_completion());
    let general = [done("general-1", 1, Some(json!({"pages": 3}))), retry];
    let settled = store.job_settle("w-me", &general).await.unwrap();
    assert_eq!(settled, vec![true, true]);
    let env_ref = &env;
    let row = |id: &'static str| async move {
        let c = env_ref.store.raw().await.unwrap();
        let r = c
            .query_one(
                "SELECT status, attempts, lease, worker_id, result::text, last_error,
                        completed_at IS NOT NULL AND completed_at <= now(), stale_at IS NULL,
                        chain_pending, scheduled_at <= now()
                 FROM jobs WHERE id = $1",
                &[&id],
            )
            .await
            .unwrap();
        (
            r.get::<_, String>(0),
            r.get::<_, i32>(1),
            r.get::<_, i64>(2),
            r.get::<_, Option<String>>(3),
            r.get::<_, Option<String>>(4),
            r.get::<_, Option<String>>(5),
            r.get::<_, bool>(6),
            r.get::<_, bool>(7),
            r.get::<_, bool>(8),
            r.get::<_, bool>(9),
        )
    };
    let (plain_1, general_1) = (row("plain-1").await, row("general-1").await);
    assert_eq!(plain_1, general_1);
    assert_eq!(plain_1.0, "completed");
    assert_eq!(plain_1.4.as_deref(), Some(r#"{"pages": 3}"#));
    assert!(plain_1.6 && plain_1.7 && !plain_1.8, "{plain_1:?}");
    assert_eq!(row("plain-2").await.4, None);
    // The stale lease changed nothing, and left a late result in the attempt log.
    let fenced = row("fenced").await;
    assert_eq!(
        (fenced.0.as_str(), fenced.7),
        ("processing", false),
        "{fenced:?}"
    );
    assert_eq!(
        env.scalar("SELECT count(*) FROM job_attempt_log WHERE job_id = 'fenced'")
            .await,
        1
    );
    assert_eq!(row("general-2").await.0, "scheduled");
}

#[tokio::test]
async fn jobs_that_end_a_moment_apart_settle_in_groups_spaced_apart_each_once() {
    // Jobs published a millisecond apart end a millisecond apart. Each settle statement is a
    // commit whose WAL flush the claims queue behind, so a busy completer starts one at most
    // every 5 ms (SETTLE_EVERY) with what ended meanwhile, instead of one per job.
    let env = TestEnv::new(RUST_QUEUE).await;
    let (h, runs) = counting();
    let worker = env.worker(&[("h", h)]).await;
    let n = 150;
    let began = std::time::Instant::now();
    let mut acks = Vec::new();
    for i in 0..n {
        let body = format!(r#"{{"id":"spaced-{i}","payload":{{}}}}"#);
        acks.push(
            env.broker
                .js
                .publish("jobs.work", body.into_bytes().into())
                .await
                .unwrap(),
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    for a in acks {
        a.await.unwrap();
    }
    assert!(
        wait_for(Duration::from_secs(30), || async {
            env.count("completed").await == n
        })
        .await,
        "completed: {}",
        env.count("completed").await
    );
    let elapsed = began.elapsed();
    let groups = stat(&worker.stats.settle_groups);
    // Consecutive statements start at least 5 ms apart, whatever the machine's speed.
    let most = elapsed.as_millis() as u64 / 5 + 1;
    assert!(
        groups <= most,
        "{groups} settle statements for {n} jobs in {elapsed:?}: more than one per 5 ms ({most})"
    );
    env.wait_consumer_drained("work").await;
    let runs = runs.lock().unwrap().clone();
    assert_eq!(runs.len(), n as usize, "distinct jobs run");
    assert!(runs.values().all(|&r| r == 1), "a job ran twice: {runs:?}");
    assert_eq!(stat(&worker.stats.completed), n as u64);
    worker.shutdown().await;
}

#[tokio::test]
async fn fails_twice_then_succeeds_with_three_attempts_recorded() {
    let env = TestEnv::new(RUST_QUEUE).await;
    let h = from_fn(|job| async move {
        if job.attempt < 3 {
            Err(JobError::retry(format!("flaky failure {}", job.attempt)))
        } else {
            Ok(None)
        }
    });
    let worker = env.worker(&[("h", h)]).await;
    env.publish_raw("work", r#"{"id":"flaky","payload":{}}"#)
        .await;
    assert!(env.wait_status("flaky", "completed", 20).await);
    let job = env.store.job_get("flaky").await.unwrap().unwrap();
    assert_eq!(job.attempts, 3);
    assert_eq!(job.last_error.as_deref(), Some("flaky failure 2"));
    let attempts = env.store.job_attempts("flaky").await.unwrap();
    let outcomes: Vec<(i32, &str)> = attempts
        .iter()
        .map(|a| (a.attempt, a.outcome.as_str()))
        .collect();
    assert_eq!(outcomes, vec![(1, "retry"), (2, "retry"), (3, "completed")]);
    assert_eq!(attempts[0].error.as_deref(), Some("flaky failure 1"));
    // The completing attempt is read from the job's row (not logged twice): its owner, lease,
    // start and run time are all there.
    let done = &attempts[2];
    assert_eq!(done.lease, job.lease);
    assert_eq!(done.worker_id, job.worker_id);
    assert!(done.worker_id.is_some(), "{done:?}");
    assert!(
        done.started_at.is_some() && done.duration_ms.is_some_and(|ms| ms >= 0),
        "{done:?}"
    );
    assert!(done.error.is_none(), "{done:?}");
    assert_eq!(
        env.scalar("SELECT count(*) FROM job_attempt_log WHERE job_id = 'flaky'")
            .await,
        2
    );
    env.wait_consumer_drained("work").await;
    worker.shutdown().await;
}

#[tokio::test]
async fn always_failing_job_ends_dead_after_max_attempts() {
    let env = TestEnv::new(RUST_QUEUE).await;
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let h = from_fn(move |job| {
        let c = c.clone();
        async move {
            if job.payload.get("permanent").is_some() {
                return Err(JobError::permanent("550 no such mailbox"));
            }
            c.fetch_add(1, Ordering::SeqCst);
            Err(JobError::retry("smtp 503"))
        }
    });
    let worker = env.worker(&[("h", h)]).await;
    env.publish_raw("work", r#"{"id":"doomed","payload":{}}"#)
        .await;
    assert!(env.wait_status("doomed", "dead", 20).await);
    let job = env.store.job_get("doomed").await.unwrap().unwrap();
    assert_eq!(job.attempts, 3);
    let err = job.last_error.unwrap();
    assert!(
        err.contains("smtp 503") && err.contains("no attempts left"),
        "{err}"
    );
    let attempts = env.store.job_attempts("doomed").await.unwrap();
    assert_eq!(attempts.len(), 3);
    assert_eq!(attempts[2].outcome, "dead");
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    // Permanent errors dead-letter at once.
    env.publish_raw(
        "work",
        r#"{"id":"bad-address","payload":{"permanent":true}}"#,
    )
    .await;
    assert!(env.wait_status("bad-address", "dead", 20).await);
    let job = env.store.job_get("bad-address").await.unwrap().unwrap();
    assert_eq!(
        job.attempts, 1,
        "a permanent error dead-letters on the first attempt"
    );
    assert!(job.last_error.unwrap().contains("550 no such mailbox"));
    env.wait_consumer_drained("work").await;
    worker.shutdown().await;
}

#[tokio::test]
async fn progress_reports_update_the_row_and_fenced_writes_of_a_lost_lease_are_rejected() {
    let env = TestEnv::new(RUST_QUEUE).await;
    let release = Arc::new(tokio::sync::Notify::new());
    let reported = Arc::new(tokio::sync::Notify::new());
    let second_report: Arc<Mutex<Option<bool>>> = Arc::new(Mutex::new(None));
    let (rel, rep, second) = (release.clone(), reported.clone(), second_report.clone());
    let h = from_fn(move |job| {
        let (rel, rep, second) = (rel.clone(), rep.clone(), second.clone());
        async move {
            job.progress(Progress {
                progress: Some(0.4),
                stage: Some("render".into()),
                message: Some("page 2 of 5".into()),
            })
            .await
            .map_err(|e| JobError::retry(e.to_string()))?;
            rep.notify_one();
            rel.notified().await;
            // By now the job was taken away: this report must be refused.
            let r = job
                .progress(Progress {
                    progress: Some(0.9),
                    ..Default::default()
                })
                .await;
            *second.lock().unwrap() = Some(r.is_ok());
            Ok(Some(json!({"late": true})))
        }
    });
    let worker = env.worker(&[("h", h)]).await;
    env.publish_raw("work", r#"{"id":"p1","payload":{}}"#).await;
    tokio::time::timeout(Duration::from_secs(20), reported.notified())
        .await
        .expect("handler reported progress");
    let job = env.store.job_get("p1").await.unwrap().unwrap();
    assert_eq!(job.status, "processing");
    assert_eq!(job.stage.as_deref(), Some("render"));
    assert_eq!(job.progress, Some(0.4));
    assert_eq!(job.message.as_deref(), Some("page 2 of 5"));
    assert!(job.last_activity_at.is_some());
    let first_lease = job.lease;

    // Another worker takes the job over, as a recovery sweep and a re-claim would.
    let c = env.store.raw().await.unwrap();
    c.execute("UPDATE jobs SET status = 'queued' WHERE id = 'p1'", &[])
        .await
        .unwrap();
    // Only a registered worker may claim.
    let answer = env
        .claim_as("thief-1-00000000", "p1", Duration::from_secs(300))
        .await;
    assert!(answer.alive);
    assert!(matches!(answer.claims[0], Claim::Claimed { lease, .. } if lease == first_lease + 1));

    release.notify_one();
    assert!(
        wait_for(Duration::from_secs(10), || async {
            second_report.lock().unwrap().is_some()
        })
        .await
    );
    assert_eq!(
        *second_report.lock().unwrap(),
        Some(false),
        "late progress accepted"
    );
    assert!(
        wait_for(Duration::from_secs(10), || async {
            stat(&worker.stats.lost_ownership) >= 1
        })
        .await
    );
    // The new owner's claim stands: the old owner completed nothing.
    let job = env.store.job_get("p1").await.unwrap().unwrap();
    assert_eq!(job.status, "processing");
    assert_eq!(job.worker_id.as_deref(), Some("thief-1-00000000"));
    assert_eq!(job.result, None);
    assert_eq!(stat(&worker.stats.completed), 0);
    // Its late result is on record (job_settle_late.sql), under the old lease.
    assert_eq!(
        env.scalar(&format!(
            "SELECT count(*) FROM job_attempts WHERE job_id = 'p1' AND lease = {first_lease} \
             AND outcome = 'lost_ownership' AND error LIKE 'late result (%'"
        ))
        .await,
        1
    );
    worker.shutdown().await;
}

#[tokio::test]
async fn bad_input_is_recorded_and_good_jobs_keep_flowing() {
    let env = TestEnv::new(RUST_QUEUE).await;
    let mut config = env.config.clone();
    config.worker.max_payload_bytes = 2048;
    let (h, runs) = counting();
    let worker = env.worker_with(config, &[("h", h)]).await;
    let long_id = "x".repeat(300);
    let bad: Vec<(Vec<u8>, &str)> = vec![
        (b"this is not json".to_vec(), "not valid JSON"),
        (b"[1,2,3]".to_vec(), "not an object"),
        (
            br#"{"payload":{},"priority":"urgent"}"#.to_vec(),
            "`priority` must be a whole number",
        ),
        (
            br#"{"payload":{},"max_attempts":0}"#.to_vec(),
            "`max_attempts` is invalid",
        ),
        (
            format!(r#"{{"big":"{}"}}"#, "a".repeat(4000)).into_bytes(),
            "over the limit of 2048 bytes",
        ),
        (br#"{"text":"nul \u0000 inside"}"#.to_vec(), "NUL"),
        (
            format!(r#"{{"id":"{long_id}","payload":{{}}}}"#).into_bytes(),
            "the limit is 200",
        ),
        (vec![0xff, 0xfe, 0x00, 0x01], "not valid JSON"),
    ];
    for (i, (body, _)) in bad.iter().enumerate() {
        env.publish_raw("work", format!(r#"{{"id":"good-{i}","payload":{{}}}}"#))
            .await;
        env.publish_raw("work", body.clone()).await;
    }
    env.publish_raw("work", r#"{"id":"good-last","payload":{}}"#)
        .await;
    assert!(
        wait_for(Duration::from_secs(20), || async {
            env.count("completed").await == bad.len() as i64 + 1
                && env.count("dead").await == bad.len() as i64
        })
        .await,
        "completed {} dead {}",
        env.count("completed").await,
        env.count("dead").await
    );
    env.wait_consumer_drained("work").await;
    let c = env.store.raw().await.unwrap();
    let rows = c
        .query(
            "SELECT last_error, payload FROM jobs WHERE status = 'dead' ORDER BY id",
            &[],
        )
        .await
        .unwrap();
    let errors: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    for (_, expected) in &bad {
        assert!(
            errors.iter().any(|e| e.contains(expected)),
            "no dead job says {expected:?}: {errors:#?}"
        );
    }
    // Each dead job keeps what could be kept of the body.
    for r in &rows {
        let p: Value = r.get(1);
        assert!(p.get("body_bytes").is_some(), "{p}");
    }
    assert_eq!(stat(&worker.stats.invalid), bad.len() as u64);
    assert_eq!(runs.lock().unwrap().len(), bad.len() + 1);
    worker.shutdown().await;
}

/// A message that cannot even become a dead job (the insert fails) is kept in
/// `poison_messages`, acked, logged and counted as invalid like any other, and the queue goes
/// on.
#[tokio::test]
async fn a_message_that_cannot_become_a_dead_job_is_kept_as_poison_and_counted() {
    let env = TestEnv::new(RUST_QUEUE).await;
    // The database refuses dead rows (as a full disk or a broken constraint would).
    env.store
        .raw()
        .await
        .unwrap()
        .batch_execute(
            "CREATE FUNCTION refuse_dead() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN RAISE EXCEPTION 'no dead rows today'; END $$;
             CREATE TRIGGER refuse_dead BEFORE INSERT ON jobs FOR EACH ROW
             WHEN (NEW.status = 'dead') EXECUTE FUNCTION refuse_dead();",
        )
        .await
        .unwrap();
    let (h, runs) = counting();
    let worker = env.worker(&[("h", h)]).await;
    env.publish_raw("work", "this is not json").await;
    env.publish_raw("work", r#"{"id":"good-1","payload":{}}"#)
        .await;
    assert!(env.wait_status("good-1", "completed", 10).await);
    env.wait_consumer_drained("work").await;
    let c = env.store.raw().await.unwrap();
    let rows = c
        .query("SELECT subject, reason, body FROM poison_messages", &[])
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
    assert!(rows[0].get::<_, String>(0).ends_with(".work"));
    assert!(
        rows[0].get::<_, String>(1).contains("not valid JSON"),
        "{}",
        rows[0].get::<_, String>(1)
    );
    assert_eq!(rows[0].get::<_, Vec<u8>>(2), b"this is not json");
    assert_eq!(env.count("dead").await, 0);
    assert_eq!(
        stat(&worker.stats.invalid),
        1,
        "counted as an invalid message"
    );
    assert_eq!(runs.lock().unwrap().len(), 1);
    worker.shutdown().await;
}

#[tokio::test]
async fn every_statement_prepares_against_the_migrated_schema_and_migrate_is_idempotent() {
    let env = TestEnv::new(RUST_QUEUE).await;
    let c = env.store.raw().await.unwrap();
    let schema = env.store.schema();
    for (name, sql) in jobwarden::store::ALL_SQL {
        c.prepare(&jobwarden::store::in_schema(sql, schema))
            .await
            .unwrap_or_else(|e| panic!("{name}.sql does not prepare: {e}"));
    }
    drop(c);
    // Two pods migrating at once: the advisory lock serialises them, neither fails.
    let (a, b) = tokio::join!(env.store.migrate(), env.store.migrate());
    assert_eq!(a.unwrap() + b.unwrap(), 0);
    // The latest version is the highest of the files (versions may be numbered with gaps:
    // parallel work reserves its numbers).
    let latest = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations"))
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            name.strip_prefix('V')?
                .split("__")
                .next()?
                .parse::<i64>()
                .ok()
        })
        .max()
        .unwrap();
    assert_eq!(env.store.schema_version().await.unwrap() as i64, latest);
}

/// A worker opens the connections it claims and settles on, and prepares those statements on
/// them, before it pulls its first message: the first jobs after a start do not wait for a
/// backend to start or a statement to be parsed (measured: a fresh worker's first claims took
/// up to 9 ms cold, up to 2.5 ms warmed).
#[tokio::test]
async fn a_started_worker_has_its_claim_and_settle_statements_ready_on_every_connection() {
    let env = TestEnv::new(RUST_QUEUE).await;
    // A pool no larger than what the worker warms: every connection it holds must be ready.
    let mut config = env.config.clone();
    config.database.pool_size = 3;
    let (h, _) = counting();
    let worker = env.worker_with(config, &[("h", h)]).await;
    let hot: Vec<String> = jobwarden::store::HOT_SQL
        .iter()
        .map(|s| s.to_string())
        .collect();
    // Each of the three connections (taken at once: the worker's background tasks may hold
    // one a moment) holds each hot statement exactly once, by its backend.
    let per_connection = || async {
        let clients = futures::future::try_join_all((0..3).map(|_| worker.store.raw()))
            .await
            .unwrap();
        let mut out = std::collections::BTreeMap::new();
        for c in &clients {
            let r = c
                .query_one(
                    "SELECT pg_backend_pid(), count(*) FROM pg_prepared_statements \
                     WHERE statement = ANY($1)",
                    &[&hot],
                )
                .await
                .unwrap();
            out.insert(r.get::<_, i32>(0), r.get::<_, i64>(1));
        }
        out
    };
    let before = per_connection().await;
    assert_eq!(before.len(), 3, "{before:?}");
    for (pid, prepared) in &before {
        assert_eq!(
            *prepared,
            hot.len() as i64,
            "connection {pid} has {prepared} of the {} hot statements prepared",
            hot.len()
        );
    }
    // A job's claim and settle use those statements: none is prepared again under another
    // name (which would leave the warm-up's unused).
    env.publish_raw("work", r#"{"id":"warm-1","payload":{}}"#)
        .await;
    assert!(env.wait_status("warm-1", "completed", 10).await);
    assert_eq!(per_connection().await, before);
    worker.shutdown().await;
}

/// The warm-up waits for no lock: a worker starting while someone holds a lock on `jobs` that
/// an insert conflicts with starts anyway (within the warm-up's 5 s), and runs jobs once the
/// lock goes.
#[tokio::test]
async fn a_worker_starts_while_the_jobs_table_is_locked_and_runs_jobs_once_it_is_free() {
    let env = TestEnv::new(RUST_QUEUE).await;
    let mut locker = env.store.raw().await.unwrap();
    let tx = locker.transaction().await.unwrap();
    tx.batch_execute("LOCK TABLE jobs IN SHARE MODE")
        .await
        .unwrap();
    let (h, runs) = counting();
    let started = tokio::time::timeout(
        Duration::from_secs(15),
        env.worker_with(env.config.clone(), &[("h", h)]),
    )
    .await;
    tx.rollback().await.unwrap();
    let worker = started.expect("the worker's start waited for the lock on jobs");
    env.publish_raw("work", r#"{"id":"after-lock","payload":{}}"#)
        .await;
    assert!(env.wait_status("after-lock", "completed", 20).await);
    assert_eq!(runs.lock().unwrap()["after-lock"], 1);
    worker.shutdown().await;
}

/// The plan PostgreSQL picks for `sql` on this connection, as `EXPLAIN` prints it.
async fn explain(c: &tokio_postgres::Client, sql: &str) -> String {
    c.query(&format!("EXPLAIN {sql}"), &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get::<_, String>(0))
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test]
async fn job_ids_compare_byte_by_byte_in_every_column_and_joins_between_them_keep_their_indexes() {
    let env = TestEnv::new(RUST_QUEUE).await;
    let c = env.store.raw().await.unwrap();
    let collations = c
        .query(
            "SELECT c.relname || '.' || a.attname, coll.collname
             FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
             JOIN pg_collation coll ON coll.oid = a.attcollation
             WHERE c.relnamespace = current_schema()::regnamespace
               AND (c.relname, a.attname) IN (('jobs', 'id'), ('job_attempt_log', 'job_id'),
                                              ('job_deps', 'parent'), ('job_deps', 'child'))
             ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get::<_, String>(0), r.get::<_, String>(1)))
        .collect::<Vec<_>>();
    let c_collated = |col: &str| (col.to_string(), "C".to_string());
    assert_eq!(
        collations,
        vec![
            c_collated("job_attempt_log.job_id"),
            c_collated("job_deps.child"),
            c_collated("job_deps.parent"),
            c_collated("jobs.id"),
        ]
    );
    c.batch_execute(
        "INSERT INTO jobs (id, queue, payload, status, max_attempts, worker_id, lease, attempts,
                           started_at, completed_at)
         SELECT 'order-' || g, 'work', '{}', 'completed', 3, 'w', 1, 1, now(), now()
         FROM generate_series(1, 5000) g;
         INSERT INTO job_attempt_log (job_id, lease, attempt, worker_id, started_at, outcome, queue)
         SELECT 'order-' || g, 1, 1, 'w', now(), 'retry', 'work' FROM generate_series(1, 5000) g;
         INSERT INTO job_deps (parent, child)
         SELECT 'order-' || g, 'order-' || (g + 1) FROM generate_series(1, 4999) g;
         ANALYZE jobs; ANALYZE job_attempt_log; ANALYZE job_deps;",
    )
    .await
    .unwrap();
    let plan = |sql: &'static str| explain(&c, sql);
    // The view's two halves, each by its index.
    let attempts = plan("SELECT * FROM job_attempts WHERE job_id = 'order-7'").await;
    assert!(attempts.contains("jobs_pkey"), "{attempts}");
    assert!(attempts.contains("job_attempt_log_job"), "{attempts}");
    // A join from the log to the jobs, and from a dependency to its child.
    let joined = plan(
        "SELECT j.status FROM job_attempt_log a JOIN jobs j ON j.id = a.job_id
         WHERE a.job_id = 'order-7'",
    )
    .await;
    assert!(joined.contains("jobs_pkey"), "{joined}");
    let children = plan(
        "SELECT j.status FROM job_deps d JOIN jobs j ON j.id = d.child WHERE d.parent = 'order-7'",
    )
    .await;
    assert!(children.contains("jobs_pkey"), "{children}");
    // Byte order also lets a prefix search use the primary key (not so under a locale).
    let prefix = plan("SELECT id FROM jobs WHERE id LIKE 'order-1%'").await;
    assert!(prefix.contains("Index Cond"), "{prefix}");
    let found: i64 = c
        .query_one("SELECT count(*) FROM jobs WHERE id LIKE 'order-49%'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(found, 111); // 49, 490–499, 4900–4999
                            // The views over the changed columns answer as before.
    let (attempts, stats): (i64, i64) = {
        let r = c
            .query_one(
                "SELECT (SELECT count(*) FROM job_attempts WHERE job_id = 'order-7'),
                        (SELECT completed_24h FROM job_stats WHERE queue = 'work')",
                &[],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!((attempts, stats), (2, 5000));
}

#[tokio::test]
async fn operator_queries_plan_with_postgres_defaults_and_the_workers_own_statements_do_not() {
    let env = TestEnv::new(RUST_QUEUE).await;
    let show = |c: deadpool_postgres::Object| async move {
        let mut out = Vec::new();
        for setting in ["enable_seqscan", "enable_nestloop", "search_path"] {
            let v: String = c
                .query_one(&format!("SHOW {setting}"), &[])
                .await
                .unwrap()
                .get(0);
            out.push(v);
        }
        out
    };
    let schema = env.store.schema().to_string();
    assert_eq!(
        show(env.store.raw().await.unwrap()).await,
        ["off", "off", schema.as_str()]
    );
    assert_eq!(
        show(env.store.ops().await.unwrap()).await,
        ["on", "on", schema.as_str()]
    );
    // A whole-table report on the operator connection (the demo's counts by status) reads
    // the table once, as the planner likes, and answers.
    let plan = explain(
        &env.store.ops().await.unwrap(),
        jobwarden::store::sql::JOB_COUNTS,
    )
    .await;
    assert!(plan.contains("Seq Scan on jobs"), "{plan}");
    assert!(env.store.job_stats().await.unwrap().is_empty());
}

/// Every statement the worker runs per job or per sweep reads `jobs` through an index, with
/// the plan PostgreSQL caches for it (generic), whatever the table's statistics say: checked
/// on a table analyzed while empty and then grown fast (a new installation under load, before
/// autovacuum catches up), holding mostly finished history. The statements are the worker's
/// own (`ALL_SQL`), not hand-written look-alikes, and the index each must use is named.
#[tokio::test]
async fn the_workers_own_statements_read_jobs_through_their_indexes_with_generic_plans() {
    let env = TestEnv::new(RUST_QUEUE).await;
    let c = env.store.raw().await.unwrap();
    c.batch_execute(
        "ANALYZE jobs;
         INSERT INTO jobs (id, queue, payload, status, max_attempts, worker_id, lease,
                           last_activity_at, stale_at, scheduled_at)
         SELECT 'j' || g, 'work', '{}',
                CASE WHEN g % 100 = 0 THEN 'processing'
                     WHEN g % 100 = 1 THEN 'scheduled' ELSE 'completed' END,
                3, CASE WHEN g % 100 = 0 THEN 'w' END, 1, now(),
                now() + interval '5 minutes', now() + interval '1 minute'
         FROM generate_series(1, 30000) g;
         SET plan_cache_mode = force_generic_plan;",
    )
    .await
    .unwrap();
    // (statement, arguments, the index it must read jobs through)
    let statements = [
        (
            "job_claim",
            "('w', 300000, '{j1}', '{work}', '{\"{}\"}', '{5}', '{3}', '{NULL}', '{NULL}', '{NULL}', '{NULL}', '{NULL}', '{NULL}', '{NULL}', NULL, '{NULL}', '{NULL}', '{NULL}')",
            "jobs_pkey",
        ),
        (
            "job_settle",
            "('w', '{j1}', '{1}', '{completed}', '{0}', '{NULL}', '{NULL}', '{completed}', '{0}', '{0}', '{NULL}')",
            "jobs_pkey",
        ),
        ("job_settle_completed", "('w', '{j1}', '{1}', '{NULL}', '{NULL}')", "jobs_pkey"),
        ("job_progress", "('j1', 'w', 1, NULL, NULL, NULL, 300000)", "jobs_pkey"),
        ("job_reclaim_stale", "(500, 300000)", "jobs_processing_stale"),
        ("job_reclaim_dead_owners", "(500)", "jobs_processing_stale"),
        ("job_reclaim_owners", "('{w}', 'restarted')", "jobs_processing_stale"),
        ("jobs_owned", "('w')", "jobs_processing_stale"),
        ("job_due_lock", "(500)", "jobs_scheduled_due"),
        ("job_expire_due", "(500)", "jobs_expiring"),
    ];
    for (name, args, index) in statements {
        let sql = jobwarden::store::ALL_SQL
            .iter()
            .find(|(n, _)| *n == name)
            .unwrap_or_else(|| panic!("{name} is not one of the worker's statements"))
            .1;
        c.batch_execute(&format!("PREPARE {name} AS {sql}"))
            .await
            .unwrap();
        let plan = explain(&c, &format!("EXECUTE {name}{args}")).await;
        assert!(
            !plan.contains("Seq Scan on jobs"),
            "{name} scans jobs:\n{plan}"
        );
        assert!(
            plan.contains(index),
            "{name} does not read jobs through {index}:\n{plan}"
        );
    }
}

#[tokio::test]
async fn an_id_that_belongs_to_another_queue_is_rejected_not_run() {
    let env = TestEnv::new(
        "[queues.email]\nhandler = { kind = \"rust\", name = \"h\" }\n\
         [queues.pdf]\nhandler = { kind = \"rust\", name = \"h\" }\n",
    )
    .await;
    let (h, runs) = counting();
    let worker = env.worker(&[("h", h)]).await;
    env.publish_raw("email", r#"{"id":"shared","payload":{"kind":"email"}}"#)
        .await;
    assert!(env.wait_status("shared", "completed", 10).await);
    env.publish_raw("pdf", r#"{"id":"shared","payload":{"kind":"pdf"}}"#)
        .await;
    assert!(env.wait_count("dead", 1, 10).await);
    let c = env.store.raw().await.unwrap();
    let row = c
        .query_one(
            "SELECT queue, last_error FROM jobs WHERE status = 'dead'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "pdf");
    assert!(row
        .get::<_, String>(1)
        .contains("belongs to a job of queue email"));
    assert_eq!(runs.lock().unwrap().get("shared"), Some(&1));
    env.wait_consumer_drained("pdf").await;
    worker.shutdown().await;
}

#[tokio::test]
async fn the_trace_context_reaches_every_attempt() {
    let env = TestEnv::new(RUST_QUEUE).await;
    let seen = Arc::new(Mutex::new(Vec::<(u32, Option<String>)>::new()));
    let s = seen.clone();
    let h = from_fn(move |job| {
        let s = s.clone();
        async move {
            s.lock()
                .unwrap()
                .push((job.attempt, job.traceparent.clone()));
            if job.attempt == 1 {
                Err(JobError::retry("once more"))
            } else {
                Ok(None)
            }
        }
    });
    let worker = env.worker(&[("h", h)]).await;
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("traceparent", tp);
    env.broker
        .js
        .publish_with_headers(
            "jobs.work",
            headers,
            br#"{"id":"traced","payload":{}}"#.to_vec().into(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    assert!(env.wait_status("traced", "completed", 10).await);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        vec![(1, Some(tp.to_string())), (2, Some(tp.to_string()))]
    );
    worker.shutdown().await;
}
