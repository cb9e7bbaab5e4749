//! Bulk enqueue (issue 32, item 4): one call enqueues many jobs in one transaction — SQL
//! `enqueue_many()`, `Client::enqueue_many`, `jobwarden enqueue-many` — each checked by the
//! same contract as one enqueue, each run once; a bad member refuses the whole call, naming
//! it, and leaves nothing behind.

mod common;

use common::{text, TestEnv};
use jobwarden::client::{BulkJob, Client, ClientError, EnqueueOptions, Then};
use jobwarden::handler::from_fn;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

const QUEUES: &str =
    "[queues.email]\nconcurrency = 64\nhandler = { kind = \"rust\", name = \"h\" }\n\
                      [queues.pdf]\nhandler = { kind = \"rust\", name = \"h\" }\n";

/// Handler calls per job id.
type Calls = Arc<Mutex<HashMap<String, usize>>>;

fn counting() -> (Arc<dyn jobwarden::Handler>, Calls) {
    let calls: Calls = Arc::default();
    let c = calls.clone();
    let h = from_fn(move |job| {
        let c = c.clone();
        async move {
            *c.lock().unwrap().entry(job.id.clone()).or_default() += 1;
            Ok(None)
        }
    });
    (h, calls)
}

/// `SELECT * FROM enqueue_many($1)` in a transaction that commits; the error's text on
/// refusal.
async fn sql_many(env: &TestEnv, jobs: &Value) -> Result<Vec<(i32, String)>, String> {
    let mut c = env.store.raw().await.unwrap();
    let tx = c.transaction().await.unwrap();
    let rows = tx
        .query("SELECT n, id FROM enqueue_many($1)", &[jobs])
        .await
        .map_err(|e| {
            e.as_db_error()
                .map(|d| d.message().to_string())
                .unwrap_or_else(|| e.to_string())
        })?;
    tx.commit().await.unwrap();
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

#[tokio::test]
async fn ten_thousand_jobs_in_one_sql_call_are_each_published_and_run_once() {
    let env = TestEnv::new(QUEUES).await;
    let (h, calls) = counting();
    let w = env.worker(&[("h", h)]).await;
    let n = 10_000;
    let jobs: Vec<Value> = (0..n)
        .map(|i| json!({"queue": "email", "payload": {"i": i}, "id": format!("m-{i}")}))
        .collect();
    let t0 = Instant::now();
    let rows = sql_many(&env, &Value::Array(jobs)).await.unwrap();
    let enqueued = t0.elapsed();
    assert_eq!(rows.len(), n);
    assert!(rows
        .iter()
        .enumerate()
        .all(|(i, (k, id))| *k as usize == i + 1 && *id == format!("m-{i}")));
    assert!(
        env.wait_count("completed", n as i64, 120).await,
        "only {} of {n} completed",
        env.count("completed").await
    );
    let ran = t0.elapsed();
    println!("{n} jobs: enqueued in {enqueued:?} (one call), all completed {ran:?} after it began");
    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls.len(), n, "every job ran");
    assert!(calls.values().all(|c| *c == 1), "a job ran twice");
    assert_eq!(
        env.scalar("SELECT count(*) FROM jobs WHERE attempts <> 1")
            .await,
        0,
        "a job was claimed twice"
    );
    // Enqueueing the same batch again makes nothing new: the same ids come back.
    let again: Vec<Value> = (0..3)
        .map(|i| json!({"queue": "email", "payload": {"i": i}, "id": format!("m-{i}")}))
        .collect();
    let rows = sql_many(&env, &Value::Array(again)).await.unwrap();
    assert_eq!(rows[2], (3, "m-2".to_string()));
    assert_eq!(env.scalar("SELECT count(*) FROM jobs").await, n as i64);
    w.shutdown().await;
}

#[tokio::test]
async fn a_bad_member_refuses_the_whole_call_naming_it_and_leaves_nothing() {
    let env = TestEnv::new(QUEUES).await;
    env.enqueue_id("email", "taken", json!({"a": 1}))
        .await
        .unwrap();
    let ok = |id: &str| json!({"queue": "email", "payload": {}, "id": id});
    let cases: Vec<(Value, &[&str])> = vec![
        (
            json!([ok("a"), ok("b"), {"queue": "email", "payload": {}, "priority": 12}]),
            &["jobs[3]", "priority", "12"],
        ),
        (
            json!([ok("a"), {"queue": "email", "payload": {}, "priority": "high"}]),
            &["jobs[2]", "priority"],
        ),
        (
            json!([ok("a"), {"payload": {}}]),
            &["jobs[2]", "queue", "required"],
        ),
        (json!([ok("a"), "email"]), &["jobs[2]", "JSON object"]),
        (
            json!([ok("a"), ok("b"), ok("a")]),
            &["jobs[3].id", "'a'", "jobs[1]"],
        ),
        (
            json!([ok("a"), {"queue": "email", "payload": {"a": 2}, "id": "taken"}]),
            &["jobs[2]", "taken", "another payload"],
        ),
        (
            json!([ok("a"), {"queue": "email", "payload": {}, "depends_on": ["nope"]}]),
            &["jobs[2]", "'nope'", "does not exist"],
        ),
        (
            json!([ok("a"), {"queue": "email", "payload": {}, "bogus": 1}]),
            &["jobs[2]", "bogus"],
        ),
        (json!([]), &["jobs", "holds no job"]),
        (json!({"queue": "email"}), &["jobs", "array"]),
    ];
    for (jobs, words) in cases {
        let err = sql_many(&env, &jobs)
            .await
            .expect_err(&format!("{jobs} was accepted"));
        println!("refused: {err}");
        for w in words {
            assert!(err.contains(w), "{jobs}: {err:?} does not say {w:?}");
        }
        assert_eq!(
            env.scalar("SELECT count(*) FROM jobs").await,
            1,
            "{jobs}: a refused call left jobs behind ({err})"
        );
    }
    // Over the limit of one call.
    let many: Vec<Value> = (0..100_001).map(|_| json!({})).collect();
    let err = sql_many(&env, &Value::Array(many)).await.unwrap_err();
    assert!(err.contains("at most 100000"), "{err}");
}

#[tokio::test]
async fn the_call_is_atomic_with_the_producers_own_transaction_and_each_member_is_one_enqueue() {
    let env = TestEnv::new(QUEUES).await;
    let jobs = json!([{"queue": "email", "payload": {}, "id": "x-1"},
                      {"queue": "email", "payload": {}, "id": "x-2"}]);
    let mut c = env.store.raw().await.unwrap();
    let tx = c.transaction().await.unwrap();
    tx.query("SELECT n, id FROM enqueue_many($1)", &[&jobs])
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(env.scalar("SELECT count(*) FROM jobs").await, 0);

    // Each member as one enqueue() would make it: one idempotency key twice with one payload
    // is one job (its id comes back twice); a debounced member (enqueue()'s own path) and a
    // plain one with a generated id.
    let jobs = json!([
        {"queue": "email", "payload": {"a": 1}, "idempotency_key": "k-1", "id": "i-1"},
        {"queue": "email", "payload": {"a": 1}, "idempotency_key": "k-1", "id": "i-2"},
        {"queue": "email", "payload": {"b": 1}, "key": "c-1", "debounce": "1h", "id": "d-1"},
        {"queue": "email", "payload": {"c": 1}, "delay_ms": 3_600_000},
    ]);
    let rows = sql_many(&env, &jobs).await.unwrap();
    assert_eq!(rows[0], (1, "i-1".to_string()));
    assert_eq!(rows[1], (2, "i-1".to_string()), "{rows:?}");
    assert_eq!(rows[2], (3, "d-1".to_string()));
    assert_eq!(rows[3].1.len(), 36, "a generated id: {rows:?}");
    let mut want = vec![
        "d-1 scheduled later".to_string(),
        "i-1 scheduled now".to_string(),
        format!("{} scheduled later", rows[3].1),
    ];
    want.sort();
    assert_eq!(
        env.strings(
            "SELECT format('%s %s %s', id, status, CASE WHEN scheduled_at > now() + \
             interval '50 minutes' THEN 'later' ELSE 'now' END) FROM jobs ORDER BY id COLLATE \"C\""
        )
        .await,
        want
    );
}

#[tokio::test]
async fn the_rust_client_and_the_cli_enqueue_many_with_every_field() {
    let env = TestEnv::new(QUEUES).await;
    let (h, calls) = counting();
    let w = env.worker(&[("h", h)]).await;
    let client = Client::new(env.store.clone(), env.broker.clone());
    let jobs = vec![
        BulkJob::new(
            "email",
            json!({"to": "a"}),
            EnqueueOptions {
                id: Some("r-1".into()),
                key: Some("customer-1".into()),
                priority: Some(2),
                then: vec![Then::new("pdf", json!({}))],
                ..Default::default()
            },
        ),
        BulkJob::new(
            "pdf",
            json!({}),
            EnqueueOptions {
                id: Some("r-2".into()),
                depends_on: vec!["r-1".into()],
                ..Default::default()
            },
        ),
        BulkJob::new("email", json!({"to": "c"}), EnqueueOptions::default()),
    ];
    let ids = client.enqueue_many(&jobs).await.unwrap();
    assert_eq!(ids.len(), 3);
    assert_eq!(&ids[..2], ["r-1", "r-2"]);
    for id in ["r-1", "r-1.1", "r-2", ids[2].as_str()] {
        assert!(env.wait_status(id, "completed", 30).await, "{id}");
    }
    assert_eq!(
        env.strings("SELECT format('%s %s %s', id, priority, key) FROM jobs WHERE id = 'r-1'")
            .await,
        ["r-1 2 customer-1"]
    );
    // A member the contract refuses is named by its position; nothing is stored.
    let bad = vec![
        BulkJob::new("email", json!({}), EnqueueOptions::default()),
        BulkJob::new(
            "email",
            json!({}),
            EnqueueOptions {
                priority: Some(12),
                ..Default::default()
            },
        ),
    ];
    let before = env.scalar("SELECT count(*) FROM jobs").await;
    let err = client.enqueue_many(&bad).await.unwrap_err();
    assert!(
        matches!(&err, ClientError::Invalid(m) if m.contains("jobs[2]") && m.contains("priority")),
        "{err:?}"
    );
    assert_eq!(env.scalar("SELECT count(*) FROM jobs").await, before);

    // The CLI, from a JSON-lines file: all lines, or none.
    let dir = std::env::temp_dir().join(format!("jw-many-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("good.jsonl");
    std::fs::write(
        &good,
        "{\"queue\": \"email\", \"payload\": {\"n\": 1}, \"id\": \"f-1\"}\n\n\
         {\"queue\": \"email\", \"payload\": {\"n\": 2}, \"id\": \"f-2\", \"delay_ms\": 10}\n",
    )
    .unwrap();
    let out = env.cli(&["enqueue-many", good.to_str().unwrap(), "--ids"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "f-1\nf-2\n");
    assert!(text(&out).contains("2 jobs enqueued"), "{}", text(&out));
    let bad = dir.join("bad.jsonl");
    std::fs::write(
        &bad,
        "{\"queue\": \"email\", \"payload\": {}, \"id\": \"g-1\"}\n\
         {\"queue\": \"email\", \"payload\": {}, \"timeout_ms\": 0}\n",
    )
    .unwrap();
    let out = env.cli(&["enqueue-many", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("line 2:") && text(&out).contains("timeout_ms"),
        "{}",
        text(&out)
    );
    std::fs::write(&bad, "{\"queue\": \"email\", \"payload\": {}}\nnot json\n").unwrap();
    let out = env.cli(&["enqueue-many", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("line 2: not JSON"), "{}", text(&out));
    assert_eq!(
        env.scalar("SELECT count(*) FROM jobs WHERE id = 'g-1'")
            .await,
        0
    );
    for id in ["f-1", "f-2"] {
        assert!(env.wait_status(id, "completed", 30).await, "{id}");
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(calls.lock().unwrap().values().all(|c| *c == 1));
    w.shutdown().await;
}
