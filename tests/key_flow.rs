//! Per-key flow control (issue 31) against real servers: a keyed queue parks its jobs in
//! PostgreSQL (`job_intake.sql`) and its slots take them (`job_take()`) within each key's
//! limit, in turn order.

mod common;

use common::TestEnv;
use jobwarden::config::KeyRules;
use jobwarden::job::NewJob;
use jobwarden::store::{ClaimInput, Store};
use serde_json::json;
use std::collections::HashMap;
use std::time::Duration;

const STALE: Duration = Duration::from_secs(60);

fn keyed_input(id: &str, key: Option<&str>) -> ClaimInput {
    let mut job = NewJob::plain(id.into(), "work".into(), json!({ "k": key }));
    job.key = key.map(str::to_string);
    ClaimInput {
        job,
        max_attempts: 3,
        traceparent: None,
    }
}

async fn register(env: &TestEnv, worker: &str) {
    let c = env.store.raw().await.unwrap();
    c.execute(
        "INSERT INTO workers (id, hostname, pid, version) VALUES ($1, 'other', 1, 'test') \
         ON CONFLICT DO NOTHING",
        &[&worker],
    )
    .await
    .unwrap();
}

/// Parks `inputs` (stream sequences from `seq0` on) as `worker`.
async fn park(store: &Store, worker: &str, rules: KeyRules, seq0: i64, inputs: &[ClaimInput]) {
    let seqs: Vec<i64> = (0..inputs.len() as i64).map(|i| seq0 + i).collect();
    let answer = store
        .job_intake(worker, None, rules, &seqs, inputs)
        .await
        .unwrap();
    assert!(answer.alive && !answer.paused);
}

async fn take(store: &Store, worker: &str, want: usize, rules: KeyRules) -> Vec<String> {
    store
        .job_take("work", worker, want, (STALE, None), rules)
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.id)
        .collect()
}

async fn complete(env: &TestEnv, ids: &[String]) {
    let c = env.store.raw().await.unwrap();
    c.execute(
        "UPDATE jobs SET status = 'completed', completed_at = now() WHERE id = ANY($1)",
        &[&ids],
    )
    .await
    .unwrap();
}

/// Running jobs per key, as the database has them.
async fn running_per_key(env: &TestEnv) -> HashMap<String, i64> {
    let c = env.store.raw().await.unwrap();
    c.query(
        "SELECT key, count(*) FROM jobs WHERE status = 'processing' GROUP BY key",
        &[],
    )
    .await
    .unwrap()
    .into_iter()
    .map(|r| (r.get::<_, Option<String>>(0).unwrap_or_default(), r.get(1)))
    .collect()
}

#[tokio::test]
async fn parked_jobs_are_taken_within_their_keys_limit_by_three_workers_at_once() {
    let env = TestEnv::new("[queues.work]\nhandler = { kind = \"rust\", name = \"h\" }\n").await;
    let rules = KeyRules {
        concurrency: Some(2),
        fair: false,
        ordered: false,
        dead_blocks: false,
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
            if (tries + id.len() as u64 + id.as_bytes()[4] as u64) % 10 == 0 {
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
        if tries % 3 != 0 {
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
            let again: Vec<ClaimInput> = due
                .iter()
                .map(|id| keyed_input(id, Some(id.split('-').next().unwrap())))
                .collect();
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
