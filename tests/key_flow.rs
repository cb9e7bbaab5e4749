//! Per-key flow control (issue 31) against real servers: a keyed queue parks its jobs in
//! PostgreSQL (`job_intake.sql`) and its slots take them (`job_take()`) within each key's
//! limit, in turn order.

mod common;

use common::keyed::*;
use common::TestEnv;
use jobwarden::config::KeyRules;
use jobwarden::store::{ClaimInput, Store};
use serde_json::json;
use std::collections::HashMap;
use std::time::Duration;

/// Each key's row in job_keys, as text (for failure messages).
const JOB_KEYS: &str =
    "SELECT format('%s head=%s/%s last=%s', key, head_priority, head_turn, last_turn) FROM job_keys";

async fn register(env: &TestEnv, worker: &str) {
    env.register_other(worker).await;
}

#[tokio::test]
async fn parked_jobs_are_taken_within_their_keys_limit_by_three_workers_at_once() {
    let env = TestEnv::new("[queues.work]\nhandler = { kind = \"rust\", name = \"h\" }\n").await;
    let rules = KeyRules {
        concurrency: Some(2),
        fair: false,
        ordered: false,
        dead_blocks: false,
        rate: None,
    };
    for w in ["w1", "w2", "w3"] {
        register(&env, w).await;
    }
    // 40 jobs of key a, 40 of b, 10 without a key, interleaved.
    let inputs: Vec<ClaimInput> = (0..90)
        .map(|i| {
            let key = match i % 9 {
                0 => None,
                k if k % 2 == 0 => Some("a"),
                _ => Some("b"),
            };
            keyed_input(&format!("j{i}"), key)
        })
        .collect();
    for (n, chunk) in inputs.chunks(30).enumerate() {
        park(&env.store, "w1", rules, 1 + 30 * n as i64, chunk).await;
    }
    assert_eq!(
        env.scalar("SELECT count(*) FROM jobs WHERE status = 'queued' AND parked")
            .await,
        90
    );
    let mut done = 0;
    let mut rounds = 0;
    while done < 90 {
        rounds += 1;
        assert!(rounds < 200, "the parked jobs were not all taken");
        // Three workers take at once, each wanting more than any key may run.
        let (a, b, c) = tokio::join!(
            take(&env.store, "w1", 5, rules),
            take(&env.store, "w2", 5, rules),
            take(&env.store, "w3", 5, rules)
        );
        let running = running_per_key(&env).await;
        for (key, n) in &running {
            if !key.is_empty() {
                assert!(
                    *n <= 2,
                    "key {key} runs {n} jobs at once (limit 2): {running:?}"
                );
            }
        }
        let taken: Vec<String> = a.into_iter().chain(b).chain(c).collect();
        done += taken.len();
        complete(&env, &taken).await;
    }
    assert_eq!(env.count("completed").await, 90);
    // Nothing parked is left, nor a key row for keys with nothing parked.
    assert_eq!(
        env.scalar("SELECT count(*) FROM job_keys WHERE head_turn IS NOT NULL")
            .await,
        0
    );
}

#[tokio::test]
async fn with_fair_turns_a_key_with_ten_jobs_is_not_held_up_by_one_with_a_thousand() {
    let env = TestEnv::new("[queues.work]\nhandler = { kind = \"rust\", name = \"h\" }\n").await;
    register(&env, "w1").await;
    for fair in [false, true] {
        let rules = KeyRules {
            concurrency: None,
            fair,
            ordered: false,
            dead_blocks: false,
            rate: None,
        };
        let tag = if fair { "fair" } else { "fifo" };
        let big: Vec<ClaimInput> = (0..1000)
            .map(|i| keyed_input(&format!("{tag}-a{i}"), Some("a")))
            .collect();
        for (n, chunk) in big.chunks(100).enumerate() {
            park(&env.store, "w1", rules, 1 + 100 * n as i64, chunk).await;
        }
        // A few of a's run first.
        let first = take(&env.store, "w1", 4, rules).await;
        complete(&env, &first).await;
        let small: Vec<ClaimInput> = (0..10)
            .map(|i| keyed_input(&format!("{tag}-b{i}"), Some("b")))
            .collect();
        park(&env.store, "w1", rules, 5000, &small).await;
        // Four slots, taken again and again: where do b's jobs start?
        let mut order = Vec::new();
        while order.len() < 1010 - first.len() {
            let got = take(&env.store, "w1", 4, rules).await;
            assert!(!got.is_empty(), "nothing taken with jobs parked");
            complete(&env, &got).await;
            order.extend(got);
        }
        let last_b = order
            .iter()
            .rposition(|id| id.contains("-b"))
            .expect("b ran");
        if fair {
            // a and b alternate: b's ten are done within the first twenty-odd starts.
            assert!(last_b < 24, "b's last job started at {last_b}: {order:?}");
        } else {
            // Publish order: b's jobs wait for a's thousand.
            assert!(last_b >= 990, "b's last job started at {last_b}");
        }
    }
}

/// Runs of each job id, as a handler saw them.
type Runs = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

/// A handler that records every run and does what the payload's `kind` says (`flaky` fails
/// its first attempt), taking `ms` milliseconds.
fn recording(ms: u64) -> (std::sync::Arc<dyn jobwarden::Handler>, Runs) {
    let runs: Runs = Default::default();
    let r = runs.clone();
    let h = jobwarden::handler::from_fn(move |job| {
        let r = r.clone();
        async move {
            r.lock().unwrap().push(job.id.clone());
            tokio::time::sleep(Duration::from_millis(ms)).await;
            match job.payload["kind"].as_str() {
                Some("flaky") if job.attempt == 1 => {
                    Err(jobwarden::handler::JobError::retry("try again"))
                }
                _ => Ok(None),
            }
        }
    });
    (h, runs)
}

/// A keyed queue end to end, with jobs that carry no key (they share one turn and no
/// limit): every message is parked, taken, run once (twice for the flaky ones: the retry is
/// parked again), its message acked, and nothing is left parked.
#[tokio::test]
async fn a_keyed_queue_runs_every_job_once_retries_included_and_acks_every_message() {
    let env = TestEnv::new(
        "[queues.work]\nhandler = { kind = \"rust\", name = \"h\" }\nconcurrency = 4\n\
         key_concurrency = 2\nbackoff = { kind = \"fixed\", base = \"10ms\" }\n",
    )
    .await;
    let (h, runs) = recording(2);
    let w = env.worker(&[("h", h)]).await;
    for i in 0..200 {
        let kind = if i % 10 == 0 { "flaky" } else { "ok" };
        env.publish_raw(
            "work",
            json!({"id": format!("j{i}"), "payload": {"kind": kind}}).to_string(),
        )
        .await;
    }
    assert!(
        env.wait_count("completed", 200, 60).await,
        "completed: {}",
        env.count("completed").await
    );
    w.shutdown().await;
    let runs = runs.lock().unwrap().clone();
    let mut per_job: HashMap<String, usize> = HashMap::new();
    for id in runs {
        *per_job.entry(id).or_default() += 1;
    }
    for i in 0..200 {
        let want = if i % 10 == 0 { 2 } else { 1 };
        assert_eq!(per_job.get(&format!("j{i}")), Some(&want), "runs of j{i}");
    }
    env.wait_consumer_drained("work").await;
    assert_eq!(
        env.scalar("SELECT count(*) FROM jobs WHERE parked OR status <> 'completed'")
            .await,
        0
    );
}

fn ordered_rules(dead_blocks: bool) -> KeyRules {
    KeyRules {
        concurrency: Some(1),
        fair: false,
        ordered: true,
        dead_blocks,
        rate: None,
    }
}

/// Ordered keys at the store: three workers take at once, a tenth of the attempts fail and
/// come back (scheduled, then parked again by a later intake, as the scheduler's republish
/// brings them), and each key's jobs complete in publish order, one at a time.
#[tokio::test]
async fn ordered_keys_complete_in_publish_order_with_retries_taken_by_three_workers() {
    let env = TestEnv::new("[queues.work]\nhandler = { kind = \"rust\", name = \"h\" }\n").await;
    let rules = ordered_rules(true);
    for w in ["w1", "w2", "w3"] {
        register(&env, w).await;
    }
    // 5 keys x 20 jobs, interleaved; job ids say their key and place.
    let inputs: Vec<ClaimInput> = (0..100)
        .map(|i| {
            keyed_input(
                &format!("k{}-{:02}", i % 5, i / 5),
                Some(&format!("k{}", i % 5)),
            )
        })
        .collect();
    for (n, chunk) in inputs.chunks(25).enumerate() {
        park(&env.store, "w1", rules, 1 + 25 * n as i64, chunk).await;
    }
    let c = env.store.raw().await.unwrap();
    let mut completed: HashMap<String, Vec<String>> = HashMap::new();
    let mut n_done = 0;
    let mut tries = 0u64;
    let mut republish_seq = 1000;
    while n_done < 100 {
        tries += 1;
        assert!(tries < 2000, "stuck at {n_done} completed");
        let (a, b, w3) = tokio::join!(
            take(&env.store, "w1", 4, rules),
            take(&env.store, "w2", 4, rules),
            take(&env.store, "w3", 4, rules)
        );
        let running = running_per_key(&env).await;
        assert!(running.values().all(|n| *n <= 1), "{running:?}");
        for id in a.into_iter().chain(b).chain(w3) {
            // A tenth of the attempts fail and are retried.
            if (tries + id.len() as u64 + id.as_bytes()[4] as u64).is_multiple_of(10) {
                c.execute(
                    "UPDATE jobs SET status = 'scheduled', scheduled_at = now(), worker_id = NULL \
                     WHERE id = $1",
                    &[&id],
                )
                .await
                .unwrap();
                continue;
            }
            complete(&env, std::slice::from_ref(&id)).await;
            let key = id.split('-').next().unwrap().to_string();
            completed.entry(key).or_default().push(id);
            n_done += 1;
        }
        // The scheduler's republish, and the intake that parks the retries again, a few
        // takes later (the key's later jobs wait meanwhile).
        if !tries.is_multiple_of(3) {
            continue;
        }
        let due: Vec<String> = c
            .query("SELECT id FROM jobs WHERE status = 'scheduled'", &[])
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.get(0))
            .collect();
        if !due.is_empty() {
            // As the scheduler republishes them: from the row, without the key.
            let again: Vec<ClaimInput> = due.iter().map(|id| keyed_input(id, None)).collect();
            park(&env.store, "w2", rules, republish_seq, &again).await;
            republish_seq += again.len() as i64;
        }
    }
    for (key, ids) in &completed {
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(ids, &sorted, "key {key} completed out of order");
        assert_eq!(ids.len(), 20);
    }
}

/// A dead job holds its ordered key's later jobs (ordered_on_dead = "block") until it is
/// skipped; with "skip" they go on at once.
#[tokio::test]
async fn a_dead_job_holds_its_ordered_keys_later_jobs_unless_the_queue_skips() {
    let env = TestEnv::new("[queues.work]\nhandler = { kind = \"rust\", name = \"h\" }\n").await;
    register(&env, "w1").await;
    let c = env.store.raw().await.unwrap();
    for (blocks, tag) in [(true, "block"), (false, "skip")] {
        let rules = ordered_rules(blocks);
        let key = format!("{tag}-key");
        let inputs: Vec<ClaimInput> = (1..=3)
            .map(|i| keyed_input(&format!("{tag}{i}"), Some(&key)))
            .collect();
        park(&env.store, "w1", rules, 1, &inputs).await;
        assert_eq!(
            take(&env.store, "w1", 4, rules).await,
            vec![format!("{tag}1")]
        );
        // Its first job dies.
        c.execute(
            "UPDATE jobs SET status = 'dead', completed_at = now() WHERE id = $1",
            &[&format!("{tag}1")],
        )
        .await
        .unwrap();
        let next = take(&env.store, "w1", 4, rules).await;
        if blocks {
            assert!(
                next.is_empty(),
                "a later job ran past the dead one: {next:?}"
            );
            // Skipped (what `jobwarden keys skip` does): the key goes on.
            c.execute(
                "UPDATE jobs SET status = 'cancelled' WHERE id = $1",
                &[&format!("{tag}1")],
            )
            .await
            .unwrap();
            assert_eq!(
                take(&env.store, "w1", 4, rules).await,
                vec![format!("{tag}2")]
            );
        } else {
            assert_eq!(next, vec![format!("{tag}2")]);
        }
    }
}

/// Start and end of every run, by key, as a handler saw them.
type Spans =
    std::sync::Arc<std::sync::Mutex<Vec<(String, String, std::time::Instant, std::time::Instant)>>>;

/// A handler that records (key, id, start, end) of every run and sleeps the payload's `ms`.
fn spans() -> (std::sync::Arc<dyn jobwarden::Handler>, Spans) {
    let spans: Spans = Default::default();
    let s = spans.clone();
    let h = jobwarden::handler::from_fn(move |job| {
        let s = s.clone();
        async move {
            let start = std::time::Instant::now();
            let ms = job.payload["ms"].as_u64().unwrap_or(1);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            let key = job.payload["key"].as_str().unwrap_or("").to_string();
            s.lock()
                .unwrap()
                .push((key, job.id.clone(), start, std::time::Instant::now()));
            Ok(None)
        }
    });
    (h, spans)
}

/// Publishes `n` envelopes of `key` (ids `<key>-<i>`), payload `{"key", "ms"}`, acks awaited
/// 500 at a time; returns when the last was stored.
async fn publish_keyed(env: &TestEnv, key: &str, n: usize, ms: impl Fn(usize) -> u64) {
    let mut acks = Vec::new();
    for i in 0..n {
        let body = json!({"id": format!("{key}-{i}"), "key": key,
                          "payload": {"key": key, "ms": ms(i)}})
        .to_string();
        acks.push(
            env.broker
                .js
                .publish("jobs.work".to_string(), body.into())
                .await
                .expect("publish"),
        );
        if acks.len() == 500 {
            for a in acks.drain(..) {
                a.await.expect("publish ack");
            }
        }
    }
    for a in acks {
        a.await.expect("publish ack");
    }
}

/// Issue 31's fairness case: 10,000 jobs of key A, then 10 of key B, `fair_by_key`, three
/// workers of four slots: every B job starts within 2 s of its publish.
#[tokio::test]
async fn fair_turns_start_a_small_keys_jobs_at_once_behind_ten_thousand_of_another_key() {
    let env = TestEnv::new(
        "[queues.work]\nhandler = { kind = \"rust\", name = \"h\" }\nconcurrency = 4\n\
         fair_by_key = true\n",
    )
    .await;
    let (h, spans) = spans();
    let mut pods = Vec::new();
    for _ in 0..3 {
        pods.push(env.worker(&[("h", h.clone())]).await);
    }
    publish_keyed(&env, "A", 10_000, |_| 20).await;
    // A's backlog is in: every one of its jobs parked, running or done (a backlog that
    // built up before B came; B's own wait is what is measured).
    assert!(
        common::wait_for(Duration::from_secs(30), || async {
            env.scalar(
                "SELECT count(*) FROM jobs WHERE key = 'A' AND (parked OR status <> 'queued')",
            )
            .await
                == 10_000
        })
        .await
    );
    let published = std::time::Instant::now();
    publish_keyed(&env, "B", 10, |_| 20).await;
    assert!(
        common::wait_for(Duration::from_secs(30), || async {
            spans.lock().unwrap().iter().filter(|s| s.0 == "B").count() == 10
        })
        .await,
        "B's jobs did not all run"
    );
    let spans = spans.lock().unwrap().clone();
    let a_done = spans.iter().filter(|s| s.0 == "A").count();
    let latest_b = spans
        .iter()
        .filter(|s| s.0 == "B")
        .map(|s| s.2.saturating_duration_since(published))
        .max()
        .unwrap();
    println!("B's last job started {latest_b:?} after B's publish; {a_done} of A's 10000 had run by B's last end");
    assert!(latest_b < Duration::from_secs(2), "B waited {latest_b:?}");
    assert!(
        a_done < 9_000,
        "A's backlog was not in the way: the test proves nothing"
    );
    for p in pods {
        p.shutdown().await;
    }
}

/// `key_concurrency = 2` holds across three workers, measured from each run's start and end.
#[tokio::test]
async fn key_concurrency_is_never_exceeded_across_three_workers() {
    let env = TestEnv::new(
        "[queues.work]\nhandler = { kind = \"rust\", name = \"h\" }\nconcurrency = 8\n\
         key_concurrency = 2\n",
    )
    .await;
    let (h, spans) = spans();
    let mut pods = Vec::new();
    for _ in 0..3 {
        pods.push(env.worker(&[("h", h.clone())]).await);
    }
    for k in 0..4 {
        publish_keyed(&env, &format!("k{k}"), 60, |i| 5 + (i as u64 * 7) % 25).await;
    }
    assert!(env.wait_count("completed", 240, 60).await);
    for p in pods {
        p.shutdown().await;
    }
    let spans = spans.lock().unwrap().clone();
    assert_eq!(spans.len(), 240, "every job ran once");
    let mut worst = 0;
    for k in 0..4 {
        let key = format!("k{k}");
        let mine: Vec<_> = spans.iter().filter(|s| s.0 == key).collect();
        for s in &mine {
            // Runs of the key in progress when this one started (itself included).
            let overlapping = mine.iter().filter(|o| o.2 <= s.2 && o.3 > s.2).count();
            worst = worst.max(overlapping);
        }
    }
    println!("most runs of one key at once: {worst}");
    assert!(worst <= 2, "a key ran {worst} jobs at once (limit 2)");
    assert_eq!(worst, 2, "the limit never bound: the test proves nothing");
}

/// Issue 31's order case: three pods (processes), 20 keys x 50 jobs, handler times from 1 to
/// 30 ms and a tenth of the jobs failing their first attempt; one pod is killed (SIGKILL)
/// mid-run. Each key's jobs complete in publish order, and every job completes.
#[tokio::test]
async fn ordered_keys_complete_in_publish_order_across_three_pods_with_one_killed() {
    use common::{ChildWorker, RecordingApp};
    let app = RecordingApp::start().await;
    let env = TestEnv::with_servers(
        &common::test_database_url(),
        "",
        "ack_wait = \"8s\"",
        &format!(
            "heartbeat_every = \"300ms\"\ndead_after = \"2s\"\nreap_every = \"200ms\"\n\
             sweep_every = \"500ms\"\nstale_after = \"5s\"\nadopt_after = \"1s\"\n\
             [queues.work]\nhandler = {{ kind = \"http\", url = \"{}\" }}\nconcurrency = 6\n\
             ordered_by_key = true\nbackoff = {{ kind = \"fixed\", base = \"50ms\" }}\n",
            app.url
        ),
    )
    .await;
    let mut pods: Vec<ChildWorker> = ["pod-a", "pod-b", "pod-c"]
        .iter()
        .map(|h| ChildWorker::spawn(&env.config, h))
        .collect();
    // Interleaved: message i is job i/20 of key i%20.
    let mut acks = Vec::new();
    for i in 0..1000usize {
        let key = format!("k{:02}", i % 20);
        let body = json!({"id": format!("{key}-{:02}", i / 20), "key": key,
                          "payload": {"ms": 1 + (i * 13) % 30, "fail_first": i % 10 == 3}})
        .to_string();
        acks.push(
            env.broker
                .js
                .publish("jobs.work".to_string(), body.into())
                .await
                .unwrap(),
        );
    }
    for a in acks {
        a.await.unwrap();
    }
    assert!(
        common::wait_for(Duration::from_secs(60), || async {
            env.count("completed").await >= 300
        })
        .await
    );
    pods[0].kill9();
    if !env.wait_count("completed", 1000, 120).await {
        let left = env
            .strings(
                "SELECT format('%s %s key=%s parked=%s seq=%s attempts=%s err=%s', id, status, key, \
                 parked, seq, attempts, last_error) FROM jobs WHERE status <> 'completed'",
            )
            .await;
        let keys = env.strings(JOB_KEYS).await;
        println!("job_keys: {keys:#?}");
        let lanes: Vec<String> = {
            let mut out = Vec::new();
            for lane in jobwarden::broker::Lane::all("work") {
                if let Ok(p) = env.broker.stream_position(&lane).await {
                    if p.ack_pending > 0 || p.undelivered > 0 {
                        out.push(format!(
                            "{lane:?}: floor {} pending {} undelivered {} delivered {}",
                            p.ack_floor, p.ack_pending, p.undelivered, p.delivered
                        ));
                    }
                }
            }
            out
        };
        panic!("not completed: {left:#?} lanes: {lanes:#?}");
    }
    let c = env.store.raw().await.unwrap();
    let rows = c
        .query(
            "SELECT key, id FROM jobs ORDER BY key, completed_at, id",
            &[],
        )
        .await
        .unwrap();
    let mut per_key: HashMap<String, Vec<String>> = HashMap::new();
    for r in rows {
        per_key.entry(r.get(0)).or_default().push(r.get(1));
    }
    assert_eq!(per_key.len(), 20);
    for (key, ids) in &per_key {
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(ids, &sorted, "key {key} completed out of publish order");
    }
    let retried = env
        .scalar("SELECT count(*) FROM job_attempt_log WHERE outcome = 'retry'")
        .await;
    let taken_back = env
        .scalar("SELECT count(*) FROM job_attempt_log WHERE outcome IN ('owner_dead', 'stale')")
        .await;
    println!("{retried} retries, {taken_back} jobs taken back from the killed pod");
    // Every fail-first job failed its first attempt, unless that attempt died with the
    // killed pod (then it was taken back instead).
    assert!(
        retried + taken_back >= 100,
        "the transient failures did not happen: {retried} retries, {taken_back} taken back"
    );
    drop(pods);
}

/// A retry of a key's last job, published again from its row without the key (as the
/// scheduler does), is parked under the row's key and taken again: its key's hint is not lost.
#[tokio::test]
async fn a_retry_of_a_keys_last_job_republished_without_the_key_is_taken_again() {
    let env = TestEnv::new("[queues.work]\nhandler = { kind = \"rust\", name = \"h\" }\n").await;
    register(&env, "w1").await;
    for rules in [
        ordered_rules(true),
        KeyRules {
            concurrency: Some(2),
            fair: true,
            ordered: false,
            dead_blocks: false,
            rate: None,
        },
    ] {
        let id = format!("only-{}", rules.ordered);
        park(
            &env.store,
            "w1",
            rules,
            1,
            &[keyed_input(&id, Some("solo"))],
        )
        .await;
        assert_eq!(take(&env.store, "w1", 4, rules).await, vec![id.clone()]);
        // It fails: a retry, due now.
        let c = env.store.raw().await.unwrap();
        c.execute(
            "UPDATE jobs SET status = 'scheduled', scheduled_at = now(), worker_id = NULL WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap();
        // Nothing else of the key is parked meanwhile: a take forgets the key.
        assert!(take(&env.store, "w1", 4, rules).await.is_empty());
        park(&env.store, "w1", rules, 7, &[keyed_input(&id, None)]).await;
        assert_eq!(
            take(&env.store, "w1", 4, rules).await,
            vec![id.clone()],
            "the retry was not taken"
        );
        complete(&env, &[id]).await;
    }
}

/// `key_rate_limit = "5/1s"` across three workers: no key starts more than 5 jobs in any
/// 1 s window (measured from the handler's starts), while the other keys are not held up by
/// the limited key's backlog.
#[tokio::test]
async fn key_rate_limit_holds_in_every_window_while_other_keys_run() {
    let env = TestEnv::new(
        "[queues.work]\nhandler = { kind = \"rust\", name = \"h\" }\nconcurrency = 8\n\
         key_rate_limit = \"5/1s\"\n",
    )
    .await;
    let (h, spans) = spans();
    let mut pods = Vec::new();
    for _ in 0..3 {
        pods.push(env.worker(&[("h", h.clone())]).await);
    }
    let t0 = std::time::Instant::now();
    publish_keyed(&env, "hot", 30, |_| 5).await;
    for k in 0..20 {
        publish_keyed(&env, &format!("cold{k}"), 2, |_| 5).await;
    }
    assert!(env.wait_count("completed", 70, 60).await);
    for p in pods {
        p.shutdown().await;
    }
    let spans = spans.lock().unwrap().clone();
    let hot: Vec<std::time::Instant> = {
        let mut v: Vec<_> = spans.iter().filter(|s| s.0 == "hot").map(|s| s.2).collect();
        v.sort();
        v
    };
    assert_eq!(hot.len(), 30);
    let mut worst = 0;
    for (i, start) in hot.iter().enumerate() {
        let in_window = hot[i..]
            .iter()
            .take_while(|s| s.duration_since(*start) < Duration::from_secs(1))
            .count();
        worst = worst.max(in_window);
    }
    let cold_done = spans
        .iter()
        .filter(|s| s.0.starts_with("cold"))
        .map(|s| s.3.duration_since(t0))
        .max()
        .unwrap();
    let hot_done = hot.last().unwrap().duration_since(t0);
    println!(
        "hot starts (ms): {:?}",
        hot.iter()
            .map(|s| s.duration_since(t0).as_millis())
            .collect::<Vec<_>>()
    );
    println!("most starts of the hot key in 1 s: {worst}; the cold keys done after {cold_done:?}, the hot one after {hot_done:?}");
    assert!(
        worst <= 5,
        "the hot key started {worst} jobs within one second (limit 5)"
    );
    assert_eq!(worst, 5, "the limit never bound: the test proves nothing");
    assert!(
        cold_done < Duration::from_secs(3),
        "the other keys waited: {cold_done:?}"
    );
    assert!(
        hot_done >= Duration::from_secs(5),
        "30 jobs at 5/s took only {hot_done:?}"
    );
}

/// Starts what `inputs` (new jobs, stream sequences from `seq0` on) may start at once as
/// `worker`, up to `start` of them, and parks the rest, as a keyed queue's intake does; returns
/// the ids it started.
async fn intake_new(
    store: &Store,
    worker: &str,
    rules: KeyRules,
    (seq0, start): (i64, usize),
    inputs: &[ClaimInput],
) -> Vec<String> {
    let seqs: Vec<i64> = (0..inputs.len() as i64).map(|i| seq0 + i).collect();
    let fresh = store
        .job_intake_new(worker, STALE, rules, (&seqs, start), inputs)
        .await
        .unwrap();
    let (started, rest): (Vec<_>, Vec<_>) = inputs
        .iter()
        .zip(&fresh)
        .partition(|(_, f)| matches!(f, Some(jobwarden::store::Claim::Claimed { .. })));
    let rest: Vec<ClaimInput> = rest.into_iter().map(|(i, _)| i.clone()).collect();
    if !rest.is_empty() {
        park(store, worker, rules, seq0 + 1000, &rest).await;
    }
    started.into_iter().map(|(i, _)| i.job.id.clone()).collect()
}

#[tokio::test]
async fn intakes_that_start_jobs_at_once_and_takes_never_exceed_a_keys_limit_together() {
    let env = TestEnv::new("[queues.work]\nhandler = { kind = \"rust\", name = \"h\" }\n").await;
    for w in ["w1", "w2", "w3"] {
        register(&env, w).await;
    }
    for rate in [None, Some((2_u32, 60_000_u64))] {
        let rules = KeyRules {
            concurrency: Some(2),
            fair: false,
            ordered: false,
            dead_blocks: false,
            rate: rate.map(|(starts, ms)| jobwarden::config::RateLimit {
                starts,
                window: Duration::from_millis(ms),
            }),
        };
        let tag = if rate.is_some() { "rate" } else { "cap" };
        let mut started = 0;
        let mut peak = 0;
        for round in 0..20_i64 {
            // Two intakes of new jobs of keys a and b, and a take, at once, each free to
            // start more than any key may run.
            let batch = |w: &str| -> Vec<ClaimInput> {
                (0..4)
                    .map(|i| {
                        let key = if i % 2 == 0 { "a" } else { "b" };
                        keyed_input(&format!("{tag}-{w}-{round}-{i}"), Some(key))
                    })
                    .collect()
            };
            let (b1, b2) = (batch("w1"), batch("w2"));
            let seq = 1 + round * 10_000;
            // All three wait behind a lock on job_keys, which their counts of the keys' room
            // read (the intakes' statements do not, so they are under way), then count at
            // once: they overlap every round, and only the keys' locks keep them apart.
            let mut gate = env.store.raw().await.unwrap();
            let gate = gate.transaction().await.unwrap();
            gate.batch_execute("LOCK TABLE job_keys IN ACCESS EXCLUSIVE MODE")
                .await
                .unwrap();
            let open = async {
                tokio::time::sleep(Duration::from_millis(100)).await;
                gate.commit().await.unwrap();
            };
            let (x, y, z, ()) = tokio::join!(
                intake_new(&env.store, "w1", rules, (seq, 8), &b1),
                intake_new(&env.store, "w2", rules, (seq + 100, 8), &b2),
                take(&env.store, "w3", 8, rules),
                open
            );
            let running = running_per_key(&env).await;
            for (key, n) in &running {
                peak = peak.max(*n);
                assert!(
                    *n <= 2,
                    "{tag}: key {key} runs {n} jobs at once (limit 2), round {round}: {running:?}"
                );
            }
            started += x.len() + y.len() + z.len();
            // Only the cap frees as jobs end; the rate of 2 a minute does not.
            if rate.is_none() {
                let ran: Vec<String> = x.into_iter().chain(y).chain(z).collect();
                complete(&env, &ran).await;
            }
        }
        assert_eq!(peak, 2, "{tag}: the keys never ran at their limit");
        if rate.is_some() {
            // Two starts per key in the window, and no more, whoever started them.
            assert_eq!(
                started, 4,
                "{tag}: {started} starts of two keys limited to 2 a minute"
            );
        } else {
            assert!(
                started >= 40,
                "{tag}: only {started} jobs started in 20 rounds"
            );
        }
        let c = env.store.raw().await.unwrap();
        c.execute("DELETE FROM jobs", &[]).await.unwrap();
        c.execute("DELETE FROM job_keys", &[]).await.unwrap();
    }
}

#[tokio::test]
async fn an_intake_starts_nothing_ahead_of_parked_jobs_of_its_key_or_with_fair_turns_its_queue() {
    let env = TestEnv::new("[queues.work]\nhandler = { kind = \"rust\", name = \"h\" }\n").await;
    register(&env, "w1").await;
    for fair in [false, true] {
        let rules = KeyRules {
            concurrency: Some(1),
            fair,
            ordered: false,
            dead_blocks: false,
            rate: None,
        };
        let tag = if fair { "fair" } else { "fifo" };
        // Key a at its limit, one more of a parked behind it.
        let first = intake_new(
            &env.store,
            "w1",
            rules,
            (1, 8),
            &[
                keyed_input(&format!("{tag}-a1"), Some("a")),
                keyed_input(&format!("{tag}-a2"), Some("a")),
            ],
        )
        .await;
        assert_eq!(first, vec![format!("{tag}-a1")]);
        complete(&env, &first).await;
        // a has room again, but a2 is parked: a3 must not overtake it; b starts at once
        // unless turns are fair (then a2 goes first).
        let next = intake_new(
            &env.store,
            "w1",
            rules,
            (10, 8),
            &[
                keyed_input(&format!("{tag}-a3"), Some("a")),
                keyed_input(&format!("{tag}-b1"), Some("b")),
            ],
        )
        .await;
        let expect: Vec<String> = if fair {
            vec![]
        } else {
            vec![format!("{tag}-b1")]
        };
        assert_eq!(next, expect, "{tag}: what the intake started");
        // The take starts a2 first, and says parked jobs are left.
        let takes = env
            .store
            .job_take("work", "w1", 1, (STALE, None), rules, None)
            .await
            .unwrap();
        assert_eq!(
            takes.jobs.iter().map(|t| t.id.clone()).collect::<Vec<_>>(),
            vec![format!("{tag}-a2")]
        );
        assert!(takes.more, "{tag}: a3 is parked, the take did not say so");
        // Nothing parked at all: the take says so (and its caller stops asking so often).
        let c = env.store.raw().await.unwrap();
        c.execute("DELETE FROM jobs", &[]).await.unwrap();
        c.execute(
            "UPDATE job_keys SET head_turn = NULL, head_priority = NULL",
            &[],
        )
        .await
        .unwrap();
        let takes = env
            .store
            .job_take("work", "w1", 4, (STALE, None), rules, None)
            .await
            .unwrap();
        assert!(takes.jobs.is_empty() && !takes.more, "{tag}: {takes:?}");
        c.execute("DELETE FROM job_keys", &[]).await.unwrap();
    }
}

#[tokio::test]
async fn fair_turns_hold_when_a_keys_jobs_were_parked_out_of_publish_order() {
    // Two workers' intakes of one key's messages commit in the other order than the messages
    // were published: the later messages are parked first. The key's jobs still run in
    // publish order, and a key that comes later gets every other turn at once.
    let env = TestEnv::new("[queues.work]\nhandler = { kind = \"rust\", name = \"h\" }\n").await;
    register(&env, "w1").await;
    let rules = KeyRules {
        concurrency: None,
        fair: true,
        ordered: false,
        dead_blocks: false,
        rate: None,
    };
    let a: Vec<ClaimInput> = (0..200)
        .map(|i| keyed_input(&format!("a{i:03}"), Some("a")))
        .collect();
    park(&env.store, "w1", rules, 101, &a[100..]).await;
    park(&env.store, "w1", rules, 1, &a[..100]).await;
    // The first 100 of a's jobs run (their turns came after the next ones').
    let mut first = Vec::new();
    while first.len() < 100 {
        let got = take(&env.store, "w1", 4, rules).await;
        complete(&env, &got).await;
        first.extend(got);
    }
    let expect: Vec<String> = (0..100).map(|i| format!("a{i:03}")).collect();
    assert_eq!(first, expect, "a's jobs out of publish order");
    let b: Vec<ClaimInput> = (0..5)
        .map(|i| keyed_input(&format!("b{i}"), Some("b")))
        .collect();
    park(&env.store, "w1", rules, 1000, &b).await;
    let mut order = Vec::new();
    while order.len() < 12 {
        let got = take(&env.store, "w1", 2, rules).await;
        assert!(!got.is_empty(), "nothing taken with jobs parked");
        complete(&env, &got).await;
        order.extend(got);
    }
    let bs = order.iter().filter(|id| id.starts_with('b')).count();
    assert_eq!(
        bs, 5,
        "b's five jobs are not all among the next 12 starts: {order:?}"
    );
    let a_order: Vec<&String> = order.iter().filter(|id| id.starts_with('a')).collect();
    let mut sorted = a_order.clone();
    sorted.sort();
    assert_eq!(a_order, sorted, "a's jobs out of publish order");
}

/// Invariant 11 in a keyed queue: messages of one ordered key that a worker fetched and was
/// killed before claiming are adopted by another worker within seconds (not after
/// `ack_wait`, 10 minutes here), and still run one at a time in publish order: adoption only
/// makes rows (with each message's stream sequence), and the intake of their republished
/// messages keeps the key's order and limit.
#[tokio::test]
async fn an_ordered_keys_messages_stranded_in_a_killed_worker_run_within_seconds_in_order() {
    let app = common::RecordingApp::start().await;
    let env = TestEnv::new(&format!(
        "adopt_after = \"300ms\"\n[queues.work]\nordered_by_key = true\nconcurrency = 4\n\
         handler = {{ kind = \"http\", url = \"{}\" }}\n",
        app.url
    ))
    .await;
    let ids: Vec<String> = (0..8).map(|i| format!("a-{i}")).collect();
    let bodies: Vec<String> = ids
        .iter()
        .map(|id| json!({"id": id, "key": "a", "payload": {"ms": 30}}).to_string())
        .collect();
    common::strand_in_a_killed_worker(&env, &env.config, &bodies).await;
    let t0 = std::time::Instant::now();
    let b = env.worker_with(env.config.clone(), &[]).await;
    let done = env.wait_count("completed", 8, 30).await;
    let took = t0.elapsed();
    let rows = env
        .strings(
            "SELECT format('%s %s parked=%s seq=%s attempts=%s', id, status, parked, seq, \
             attempts) FROM jobs ORDER BY id",
        )
        .await;
    let keys = env.strings(JOB_KEYS).await;
    assert!(done, "not all completed after {took:?}: {rows:#?} {keys:?}");
    assert!(
        took < 2 * env.config.worker.adopt_after + Duration::from_secs(5),
        "adopted and run in {took:?}"
    );
    assert_eq!(
        env.scalar("SELECT count(DISTINCT job_id) FROM job_attempts WHERE outcome = 'adopted'")
            .await,
        8,
        "not adopted"
    );
    // The application's times (the request's arrival, its answer): each job started after
    // the one before it had ended. Not the rows' started_at and completed_at: those are
    // their transactions' start times, and a take that began just before a completion's
    // transaction, and waited for its key's lock, stamps its start 2 µs before that
    // completion's end (seen).
    let mut runs = app.runs.lock().unwrap().clone();
    runs.sort_by_key(|r| r.start);
    let order: Vec<&String> = runs.iter().map(|r| &r.id).collect();
    assert_eq!(
        order,
        ids.iter().collect::<Vec<_>>(),
        "not in publish order"
    );
    for w in runs.windows(2) {
        assert!(
            w[1].start >= w[0].end,
            "{} started {:?} before {} ended",
            w[1].id,
            w[0].end - w[1].start,
            w[0].id
        );
    }
    b.shutdown().await;
}

/// Invariant 2 in a keyed queue: a keyed job whose message is gone (the stream purged after
/// its commit) is published again by the broker-loss repair and runs once; a parked job,
/// which has no message by design, is never republished however long it waits for its key.
#[tokio::test]
async fn lost_keyed_messages_are_republished_and_parked_jobs_are_not() {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    let env = TestEnv::new(
        "sweep_every = \"300ms\"\nbroker_lost_after = \"1s\"\n\
         [queues.work]\nconcurrency = 8\nkey_concurrency = 1\n\
         handler = { kind = \"rust\", name = \"h\" }\n",
    )
    .await;
    let client = jobwarden::client::Client::new(env.store.clone(), env.broker.clone());
    let mut ids = Vec::new();
    // Five jobs of one key (they wait for each other, parked, about 2 s in all) and five of
    // keys of their own; each row committed, then its message published.
    for (i, key) in ["a", "a", "a", "a", "a", "b", "c", "d", "e", "f"]
        .iter()
        .enumerate()
    {
        let id = format!("lost-{key}-{i}");
        let options = jobwarden::client::EnqueueOptions {
            id: Some(id.clone()),
            key: Some(key.to_string()),
            ..Default::default()
        };
        client.enqueue("work", json!({}), options).await.unwrap();
        ids.push(id);
    }
    assert_eq!(env.consumer_backlog("work").await.0, 10, "published");
    env.broker.stream().await.unwrap().purge().await.unwrap();
    assert_eq!(env.consumer_backlog("work").await.0, 0, "stream purged");
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    let h = jobwarden::handler::from_fn(move |_job| {
        let r = r.clone();
        async move {
            r.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(400)).await;
            Ok(None)
        }
    });
    let w = env.worker(&[("h", h)]).await;
    assert!(env.wait_count("completed", 10, 40).await);
    assert_eq!(runs.load(Ordering::SeqCst), 10, "each job ran once");
    let mut all = Vec::new();
    for id in &ids {
        all.push((id.clone(), common::outcomes(&env.store, id).await));
    }
    for (id, o) in &all {
        assert_eq!(
            o,
            &["broker_lost", "completed"],
            "{id}: published again once, then completed: {all:?}"
        );
    }
    assert_eq!(common::stat(&w.stats.republished_broker_lost), 10);
    w.shutdown().await;
}
