//! Debounce, throttle and unique-for-a-while against real servers (issue 31, item 5): one
//! mechanism (the gate trigger of schema version 23) at every door a job comes in by — NATS
//! messages (plain and keyed queues), SQL `enqueue()`, the CLI, the Rust client, `then` —
//! per job or per queue; what collapses or is dropped stays visible; bad values are refused
//! naming the field at every door and at config load.

mod common;

use common::{text, wait_for, TestEnv};
use jobwarden::client::{Client, EnqueueOptions};
use jobwarden::handler::Handler;
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What a handler was given: (job id, payload), in order.
type Seen = Arc<Mutex<Vec<(String, Value)>>>;

/// A handler that records every (job id, payload) it is given.
fn payloads() -> (Arc<dyn Handler>, Seen) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let h = jobwarden::handler::from_fn(move |job| {
        let s = s.clone();
        async move {
            s.lock()
                .unwrap()
                .push((job.id.clone(), job.payload.clone()));
            Ok(None)
        }
    });
    (h, seen)
}

fn queue(extra: &str) -> String {
    format!("[queues.hooks]\nconcurrency = 4\nhandler = {{ kind = \"rust\", name = \"work\" }}\n{extra}\n")
}

/// Waits until the handler has seen `n` jobs, then a little more (for any that should not
/// come), and returns what it saw.
async fn seen_after(seen: &Seen, n: usize, secs: u64) -> Vec<(String, Value)> {
    assert!(
        wait_for(Duration::from_secs(secs), || {
            let s = seen.clone();
            async move { s.lock().unwrap().len() >= n }
        })
        .await,
        "the handler saw {:?}",
        seen.lock().unwrap()
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    seen.lock().unwrap().clone()
}

/// Asserts the burst of `n` jobs collapsed into the last one, which ran once with the last
/// payload: the others are kept, ended, naming it.
async fn assert_collapsed(env: &TestEnv, seen: &[(String, Value)], n: i64, last: &Value) {
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(&seen[0].1, last, "{seen:?}");
    let survivor = &seen[0].0;
    assert_eq!(
        env.scalar(&format!(
            "SELECT debounced::int8 FROM jobs WHERE id = '{survivor}' AND status = 'completed'"
        ))
        .await,
        n - 1
    );
    assert_eq!(
        env.scalar(&format!(
            "SELECT count(*) FROM jobs WHERE status = 'cancelled' AND gated_by IS NOT NULL \
             AND last_error LIKE 'debounced: collapsed into job %' AND attempts = 0 \
             AND key = (SELECT key FROM jobs WHERE id = '{survivor}')"
        ))
        .await,
        n - 1
    );
    // Every job of the burst has its row: none lost, none run twice.
    assert_eq!(
        env.scalar(&format!(
            "SELECT count(*) FROM jobs WHERE key = (SELECT key FROM jobs WHERE id = '{survivor}')"
        ))
        .await,
        n
    );
}

/// The issue's Done-when: 100 jobs of one key published in 2 s through NATS run once, with
/// the last payload; the 99 others are kept as ended rows naming the one that ran.
#[tokio::test]
async fn a_burst_of_a_hundred_messages_of_one_key_runs_once_with_the_last_payload() {
    let env = TestEnv::new(&queue("debounce = \"1s\"\ndebounce_max_wait = \"1m\"")).await;
    let (work, seen) = payloads();
    let w = env.worker(&[("work", work)]).await;
    for i in 0..100 {
        env.publish_raw(
            "hooks",
            json!({"payload": {"n": i}, "key": "customer-42"}).to_string(),
        )
        .await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Another key is its own burst.
    env.publish_raw(
        "hooks",
        json!({"payload": {"other": true}, "key": "customer-7"}).to_string(),
    )
    .await;
    let seen = seen_after(&seen, 2, 30).await;
    let mine: Vec<_> = seen
        .iter()
        .filter(|(_, p)| p.get("n").is_some())
        .cloned()
        .collect();
    assert_collapsed(&env, &mine, 100, &json!({"n": 99})).await;
    assert_eq!(seen.len(), 2, "{seen:?}");
    env.wait_consumer_drained("hooks").await;
    w.shutdown().await;
}

/// The same burst through SQL enqueue(), the job's own fields on a queue without any: one
/// run, the last payload.
#[tokio::test]
async fn a_burst_enqueued_through_sql_runs_once_with_the_last_payload() {
    let env = TestEnv::new(&queue("")).await;
    let (work, seen) = payloads();
    let w = env.worker(&[("work", work)]).await;
    let c = env.store.raw().await.unwrap();
    for i in 0..100 {
        c.execute(
            "SELECT enqueue('hooks', jsonb_build_object('n', $1::int), key => 'c-1', \
             debounce => '1s', debounce_max_wait => '1m')",
            &[&i],
        )
        .await
        .unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let seen = seen_after(&seen, 1, 30).await;
    assert_collapsed(&env, &seen, 100, &json!({"n": 99})).await;
    w.shutdown().await;
}

/// A key that is never quiet still runs: at the latest max_wait after its first job came.
/// Jobs every 200 ms for 4 s with a debounce of 1 s never leave the key quiet; without
/// max_wait one job would run, at the end; with max_wait 1 s, several run meanwhile.
#[tokio::test]
async fn max_wait_runs_a_busy_key_before_it_is_quiet() {
    let env = TestEnv::new(&queue("debounce = \"1s\"\ndebounce_max_wait = \"1s\"")).await;
    let (work, seen) = payloads();
    let w = env.worker(&[("work", work)]).await;
    for i in 0..20 {
        env.publish_raw(
            "hooks",
            json!({"payload": {"n": i}, "key": "busy"}).to_string(),
        )
        .await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let during = seen.lock().unwrap().len();
    assert!(
        during >= 2,
        "max_wait did not run the busy key meanwhile: {during} runs"
    );
    // The last one runs too, and every job is accounted for: runs + collapsed = 20.
    assert!(
        wait_for(Duration::from_secs(10), || {
            let s = seen.clone();
            async move { s.lock().unwrap().iter().any(|(_, p)| p["n"] == json!(19)) }
        })
        .await
    );
    let runs = seen.lock().unwrap().len() as i64;
    // And it is a debounce: most of the 20 collapsed (about one run per max_wait).
    assert!(runs <= 10, "{runs} runs of 20 jobs");
    assert_eq!(
        env.scalar("SELECT count(*) FROM jobs WHERE last_error LIKE 'debounced:%'")
            .await,
        20 - runs
    );
    w.shutdown().await;
}

/// Throttle: the first job of a key in a window runs; the others end at once, visibly
/// (`cancelled`, `throttled: ...`, gated_by the one that ran); after the window a new one
/// runs. Another key is not throttled by this one.
#[tokio::test]
async fn throttle_runs_one_job_per_key_per_window_and_keeps_the_rest_visible() {
    let env = TestEnv::new(&queue("throttle = \"2s\"")).await;
    let (work, seen) = payloads();
    let w = env.worker(&[("work", work)]).await;
    for i in 0..10 {
        env.publish_raw(
            "hooks",
            json!({"id": format!("t-{i}"), "payload": {"n": i}, "key": "k"}).to_string(),
        )
        .await;
    }
    env.publish_raw(
        "hooks",
        json!({"id": "other", "payload": {}, "key": "k2"}).to_string(),
    )
    .await;
    let first = seen_after(&seen, 2, 20).await;
    assert_eq!(first.len(), 2, "{first:?}");
    assert!(first.iter().any(|(id, _)| id == "other"), "{first:?}");
    // Whichever of key k's jobs was stored first runs: a worker has several claims in
    // flight, and they commit in no fixed order (seen: t-3 before t-0).
    let ran = first
        .iter()
        .map(|(id, _)| id.clone())
        .find(|id| id.starts_with("t-"))
        .expect("one job of key k ran");
    assert_eq!(
        env.scalar(&format!(
            "SELECT count(*) FROM jobs WHERE status = 'cancelled' AND gated_by = '{ran}' \
             AND last_error LIKE 'throttled: key k ran job {ran} %' AND started_at IS NULL"
        ))
        .await,
        9
    );
    env.wait_consumer_drained("hooks").await;
    // Counted as throttled, not as expired.
    let m = common::metrics(&w).await;
    assert!(
        m.contains("jobwarden_jobs_throttled_total{queue=\"hooks\"} 9"),
        "{m}"
    );
    assert!(
        !m.contains("jobwarden_jobs_expired_total{queue=\"hooks\"} 9"),
        "{m}"
    );
    tokio::time::sleep(Duration::from_millis(2100)).await;
    env.publish_raw(
        "hooks",
        json!({"id": "t-late", "payload": {}, "key": "k"}).to_string(),
    )
    .await;
    assert!(env.wait_status("t-late", "completed", 20).await);
    // The CLI shows why a job did not run.
    let throttled = if ran == "t-3" { "t-4" } else { "t-3" };
    let shown = text(&env.cli(&["jobs", "show", throttled]));
    assert!(shown.contains("throttled"), "{shown}");
    w.shutdown().await;
}

/// unique_for: within the window the same idempotency key is the same job; after it a new
/// job is accepted, and the old row keeps the key it let go. Through SQL and through NATS.
#[tokio::test]
async fn unique_for_dedups_within_the_window_and_accepts_a_new_job_after_it() {
    let env = TestEnv::new(&queue("unique_for = \"1s\"")).await;
    let (work, seen) = payloads();
    let w = env.worker(&[("work", work)]).await;
    let c = env.store.raw().await.unwrap();
    let enqueue = || async {
        c.query_one(
            "SELECT enqueue('hooks', '{}', idempotency_key => 'nightly', unique_for => '1s')",
            &[],
        )
        .await
        .unwrap()
        .get::<_, String>(0)
    };
    let a = enqueue().await;
    assert_eq!(enqueue().await, a, "within the window: the same job");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let b = enqueue().await;
    assert_ne!(b, a, "after the window: a new job");
    assert_eq!(
        env.strings(&format!(
            "SELECT idempotency_key_released FROM jobs WHERE id = '{a}'"
        ))
        .await,
        ["nightly"]
    );
    // NATS, the queue's unique_for: two messages (distinct ids) with one key are one job.
    for id in ["m-1", "m-2"] {
        env.publish_raw(
            "hooks",
            json!({"id": id, "payload": {}, "idempotency_key": "report"}).to_string(),
        )
        .await;
    }
    // Either message may make the job: two deliveries can be claimed in concurrent batches,
    // and which commits first is not promised. The other has no row of its own.
    let one_done = || async {
        let (m1, m2) = (env.status_of("m-1").await, env.status_of("m-2").await);
        match (m1.as_deref(), m2.as_deref()) {
            (Some("completed"), None) | (None, Some("completed")) => true,
            (Some(_), Some(_)) => panic!("two jobs for one idempotency key: {m1:?} {m2:?}"),
            _ => false,
        }
    };
    assert!(wait_for(Duration::from_secs(20), one_done).await);
    env.wait_consumer_drained("hooks").await;
    assert!(one_done().await, "still one job after the stream drained");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    env.publish_raw(
        "hooks",
        json!({"id": "m-3", "payload": {}, "idempotency_key": "report"}).to_string(),
    )
    .await;
    assert!(env.wait_status("m-3", "completed", 20).await);
    // Without unique_for a key is held for ever, as before.
    let forever = || async {
        c.query_one(
            "SELECT enqueue('plain', '{}', idempotency_key => 'once')",
            &[],
        )
        .await
        .unwrap()
        .get::<_, String>(0)
    };
    let first = forever().await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(forever().await, first);
    assert_eq!(seen.lock().unwrap().len(), 4, "{:?}", seen.lock().unwrap());
    w.shutdown().await;
}

/// A job's own fields replace its queue's: on a queue that debounces for a minute and
/// throttles nothing, a job with its own short debounce runs within seconds, and one with
/// its own throttle is throttled instead of debounced.
#[tokio::test]
async fn a_jobs_own_fields_override_its_queues() {
    let env = TestEnv::new(&queue("debounce = \"1m\"")).await;
    let (work, seen) = payloads();
    let w = env.worker(&[("work", work)]).await;
    for i in 0..3 {
        env.publish_raw(
            "hooks",
            json!({"payload": {"n": i}, "key": "fast", "debounce": "300ms"}).to_string(),
        )
        .await;
    }
    for i in 0..3 {
        env.publish_raw(
            "hooks",
            json!({"id": format!("th-{i}"), "payload": {}, "key": "thr", "throttle": "1h"})
                .to_string(),
        )
        .await;
    }
    // The queue's minute-long debounce still holds a job without fields of its own.
    env.publish_raw(
        "hooks",
        json!({"id": "slow", "payload": {}, "key": "slow"}).to_string(),
    )
    .await;
    let seen = seen_after(&seen, 2, 20).await;
    let ids: Vec<&str> = seen.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(ids.contains(&"th-0"), "{ids:?}");
    assert!(seen.iter().any(|(_, p)| p == &json!({"n": 2})), "{seen:?}");
    assert_eq!(env.status_of("slow").await.as_deref(), Some("scheduled"));
    w.shutdown().await;
}

/// A keyed queue (key_concurrency: the intake parks its jobs) debounces alike.
#[tokio::test]
async fn a_keyed_queues_intake_debounces_too() {
    let env = TestEnv::new(&queue("key_concurrency = 2\ndebounce = \"500ms\"")).await;
    let (work, seen) = payloads();
    let w = env.worker(&[("work", work)]).await;
    for i in 0..30 {
        env.publish_raw(
            "hooks",
            json!({"payload": {"n": i}, "key": "c"}).to_string(),
        )
        .await;
    }
    let seen = seen_after(&seen, 1, 20).await;
    assert_collapsed(&env, &seen, 30, &json!({"n": 29})).await;
    w.shutdown().await;
}

/// The other doors: the Rust client, the CLI and a `then` spec debounce alike (the queue has
/// no settings: the jobs' own fields).
#[tokio::test]
async fn the_rust_client_the_cli_and_then_debounce_alike() {
    let env = TestEnv::new(&queue("")).await;
    let (work, seen) = payloads();
    let w = env.worker(&[("work", work)]).await;
    let client = Client::new(env.store.clone(), env.broker.clone());
    for i in 0..5 {
        client
            .enqueue(
                "hooks",
                json!({"rust": i}),
                EnqueueOptions {
                    key: Some("r".into()),
                    debounce: Some(Duration::from_millis(500)),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
    }
    for i in 0..3 {
        let out = env.cli(&[
            "enqueue",
            "hooks",
            &format!("{{\"cli\":{i}}}"),
            "--key",
            "c",
            "--debounce",
            "500ms",
        ]);
        assert!(out.status.success(), "{}", text(&out));
    }
    let c = env.store.raw().await.unwrap();
    c.execute(
        "SELECT enqueue('hooks', '{\"parent\":true}', then_jobs => '[\
         {\"queue\":\"hooks\",\"payload\":{\"then\":1},\"key\":\"t\",\"debounce\":\"500ms\"},\
         {\"queue\":\"hooks\",\"payload\":{\"then\":2},\"key\":\"t\",\"debounce\":\"500ms\"}]')",
        &[],
    )
    .await
    .unwrap();
    // The Rust client's `then` specs carry the key and the window too.
    let then = |n: i32| jobwarden::client::Then {
        key: Some("rt".into()),
        debounce: Some("500ms".into()),
        ..jobwarden::client::Then::new("hooks", json!({ "rthen": n }))
    };
    client
        .enqueue(
            "hooks",
            json!({"rust_parent": true}),
            EnqueueOptions {
                then: vec![then(1), then(2)],
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let seen = seen_after(&seen, 6, 30).await;
    let payloads: Vec<&Value> = seen.iter().map(|(_, p)| p).collect();
    assert_eq!(seen.len(), 6, "{seen:?}");
    for last in [
        json!({"rust": 4}),
        json!({"cli": 2}),
        json!({"then": 2}),
        json!({"rthen": 2}),
    ] {
        assert!(payloads.contains(&&last), "{last} not in {payloads:?}");
    }
    w.shutdown().await;
}

/// A worker that stops after the collapse and before the run loses nothing: the surviving
/// job waits in PostgreSQL (its messages were acked after the commit), and the next worker
/// runs it once.
#[tokio::test]
async fn a_worker_gone_between_the_collapse_and_the_run_loses_nothing() {
    let env = TestEnv::new(&queue("debounce = \"2s\"")).await;
    let (work, seen) = payloads();
    let w = env.worker(&[("work", work.clone())]).await;
    for i in 0..10 {
        env.publish_raw(
            "hooks",
            json!({"payload": {"n": i}, "key": "k"}).to_string(),
        )
        .await;
    }
    assert!(
        wait_for(Duration::from_secs(10), || async {
            env.scalar("SELECT count(*) FROM jobs").await == 10
        })
        .await
    );
    w.shutdown().await;
    assert!(seen.lock().unwrap().is_empty());
    let w2 = env.worker(&[("work", work)]).await;
    let seen = seen_after(&seen, 1, 30).await;
    assert_collapsed(&env, &seen, 10, &json!({"n": 9})).await;
    w2.shutdown().await;
}

/// Bad values are refused naming the field and the fix: a message (kept as a dead job with
/// the reason), SQL enqueue(), the Rust client, the CLI, and the config at load.
#[tokio::test]
async fn bad_windows_are_refused_naming_the_field_at_every_door() {
    let env = TestEnv::new(&queue("")).await;
    let (work, seen) = payloads();
    let w = env.worker(&[("work", work)]).await;
    let bad = [
        (
            json!({"debounce": "0s", "key": "k"}),
            "field `debounce` is invalid: \"0s\" is under a millisecond",
        ),
        (
            json!({"debounce": "-1s", "key": "k"}),
            "field `debounce` is invalid",
        ),
        (
            json!({"debounce": "5s", "debounce_max_wait": "1s", "key": "k"}),
            "field `debounce_max_wait` is invalid: \"1s\" is shorter than debounce \"5s\"",
        ),
        (
            json!({"debounce_max_wait": "1s", "key": "k"}),
            "field `debounce_max_wait` is invalid: is given without debounce",
        ),
        (
            json!({"debounce": "1s", "throttle": "1s", "key": "k"}),
            "field `throttle` is invalid: is given with debounce",
        ),
        (
            json!({"unique_for": "1h"}),
            "field `unique_for` is invalid: needs an idempotency_key",
        ),
        (
            json!({"throttle": 5, "key": "k"}),
            "field `throttle` must be a duration string",
        ),
    ];
    let c = env.store.raw().await.unwrap();
    for (i, (fields, words)) in bad.iter().enumerate() {
        // NATS: a dead job with the reason.
        let mut body = fields.clone();
        body["payload"] = json!({});
        env.publish_raw("hooks", body.to_string()).await;
        let n = i as i64 + 1;
        let dead = wait_for(Duration::from_secs(10), || async {
            env.scalar("SELECT count(*) FROM jobs WHERE status = 'dead'")
                .await
                >= n
        })
        .await;
        assert!(dead, "{body}");
        let reason = env.strings("SELECT last_error FROM jobs WHERE status = 'dead' ORDER BY created_at DESC, id LIMIT 1",
        )
        .await;
        assert!(reason[0].contains(words), "{body}: {reason:?}");
        // SQL: the same words.
        let mut spec = fields.clone();
        spec["queue"] = json!("hooks");
        spec["payload"] = json!({});
        let e = c
            .query_one(
                "SELECT job_check($1::text::jsonb, 'enqueue')",
                &[&spec.to_string()],
            )
            .await
            .unwrap_err();
        let e = e.as_db_error().unwrap().message().to_string();
        assert!(e.contains(words), "{spec}: {e}");
    }
    // A message may get its key from key_from, so a key-less one is refused by the worker.
    env.publish_raw("hooks", r#"{"id":"nokey","payload":{},"debounce":"1s"}"#)
        .await;
    assert!(
        wait_for(Duration::from_secs(10), || async {
            env.scalar("SELECT count(*) FROM jobs WHERE last_error LIKE '%needs a key%'")
                .await
                == 1
        })
        .await
    );
    let reason = env
        .strings("SELECT last_error FROM jobs WHERE last_error LIKE '%needs a key%'")
        .await;
    assert!(
        reason[0].contains("field `debounce` is invalid: needs a key"),
        "{reason:?}"
    );
    // SQL enqueue() without a key.
    let e = c
        .execute("SELECT enqueue('hooks', '{}', throttle => '1m')", &[])
        .await
        .unwrap_err();
    let e = e.as_db_error().unwrap().message().to_string();
    assert!(
        e.contains("field `throttle` is invalid: needs a key"),
        "{e}"
    );
    // The Rust client.
    let client = Client::new(env.store.clone(), env.broker.clone());
    let e = client
        .enqueue(
            "hooks",
            json!({}),
            EnqueueOptions {
                key: Some("k".into()),
                debounce: Some(Duration::from_secs(5)),
                debounce_max_wait: Some(Duration::from_secs(1)),
                ..Default::default()
            },
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("debounce_max_wait"), "{e}");
    // The CLI, naming its argument.
    let out = env.cli(&["enqueue", "hooks", "{}", "--key", "k", "--debounce", "0s"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("--debounce"), "{}", text(&out));
    assert_eq!(
        env.scalar("SELECT count(*) FROM jobs WHERE status <> 'dead'")
            .await,
        0
    );
    assert!(seen.lock().unwrap().is_empty());
    w.shutdown().await;
    // The config, at load.
    let load = |extra: &str| {
        jobwarden::config::Config::from_toml(&format!(
            "[handler]\nkind = \"http\"\nurl = \"http://127.0.0.1:1/j\"\n[queues.hooks]\n{extra}\n"
        ))
        .map_err(|e| e.to_string())
    };
    for (extra, words) in [
        (
            "debounce = \"0s\"",
            "queues.hooks.debounce (0s) must be at least 1ms",
        ),
        (
            "throttle = \"0s\"",
            "queues.hooks.throttle (0s) must be at least 1ms",
        ),
        (
            "unique_for = \"20y\"",
            "queues.hooks.unique_for (20years) must be at most",
        ),
        (
            "debounce = \"5s\"\ndebounce_max_wait = \"1s\"",
            "queues.hooks.debounce_max_wait` is invalid: \"1s\" is shorter than debounce \"5s\"",
        ),
        (
            "debounce_max_wait = \"1s\"",
            "queues.hooks.debounce_max_wait` is invalid: is given without debounce",
        ),
        (
            "debounce = \"1s\"\nthrottle = \"1s\"",
            "queues.hooks.throttle` is invalid: is given with debounce",
        ),
        ("debounce = \"-1s\"", "debounce"),
    ] {
        let e = load(extra).unwrap_err();
        assert!(e.contains(words), "{extra}: {e}");
    }
    assert!(load("debounce = \"5s\"\ndebounce_max_wait = \"30s\"\nunique_for = \"1h\"").is_ok());
}
