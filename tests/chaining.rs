//! Job chaining against real servers: `then` chains, `depends_on` fan-in, a dead parent, a
//! cancelled pipeline, through the Rust client, SQL `enqueue()` and the CLI.

mod common;

use common::with_id as opts;

use common::{text, wait_for, TestEnv};
use jobwarden::client::{EnqueueOptions, Then};
use jobwarden::handler::{from_fn, JobError};
use serde_json::json;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const QUEUES: &str = r#"
[queues.charge]
concurrency = 4
max_attempts = 3
backoff = { kind = "fixed", base = "50ms" }
handler = { kind = "rust", name = "h" }
[queues.pdf]
concurrency = 4
max_attempts = 3
backoff = { kind = "fixed", base = "50ms" }
handler = { kind = "rust", name = "h" }
[queues.email]
concurrency = 4
handler = { kind = "rust", name = "h" }
"#;

/// Every run: (job id, attempt, queue), in start order.
type Runs = Arc<Mutex<Vec<(String, i32, String)>>>;

/// A handler that records each run; a payload's `fail_until` makes attempts below it fail,
/// `fail: true` fails every attempt, `hold_ms` holds the job.
fn recording() -> (Arc<dyn jobwarden::Handler>, Runs) {
    let runs: Runs = Arc::new(Mutex::new(Vec::new()));
    let r = runs.clone();
    let h = from_fn(move |job| {
        let r = r.clone();
        async move {
            r.lock()
                .unwrap()
                .push((job.id.clone(), job.attempt as i32, job.queue.clone()));
            if let Some(ms) = job.payload["hold_ms"].as_u64() {
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            if job.payload["fail"] == json!(true) {
                return Err(JobError::permanent("the gateway said no"));
            }
            if let Some(n) = job.payload["fail_until"].as_i64() {
                if (job.attempt as i64) < n {
                    return Err(JobError::retry(format!("flaky attempt {}", job.attempt)));
                }
            }
            Ok(Some(json!({"done": job.id})))
        }
    });
    (h, runs)
}

fn count(runs: &Runs, id: &str) -> usize {
    runs.lock().unwrap().iter().filter(|r| r.0 == id).count()
}

/// Job `id`, waiting for `parents`.
fn after(parents: &[&str], id: &str) -> EnqueueOptions {
    EnqueueOptions {
        depends_on: parents.iter().map(|p| p.to_string()).collect(),
        ..opts(id)
    }
}

#[tokio::test]
async fn a_then_chain_runs_in_order_and_a_failure_in_the_middle_retries_only_that_step() {
    let env = TestEnv::new(QUEUES).await;
    let (h, runs) = recording();
    let worker = env.worker(&[("h", h)]).await;
    let chain = EnqueueOptions {
        then: vec![Then::new("pdf", json!({"order": 42, "fail_until": 2}))
            .then(Then::new("email", json!({"order": 42})))],
        ..opts("order-42")
    };
    let enq = env
        .client()
        .enqueue("charge", json!({"order": 42}), chain)
        .await
        .unwrap();
    assert!(enq.created);
    assert!(
        env.wait_status("order-42.1.1", "completed", 30).await,
        "the email ran"
    );
    // Each step once; the flaky one twice; nothing else.
    assert_eq!(count(&runs, "order-42"), 1);
    assert_eq!(count(&runs, "order-42.1"), 2, "{:?}", runs.lock().unwrap());
    assert_eq!(count(&runs, "order-42.1.1"), 1);
    let order: Vec<String> = runs.lock().unwrap().iter().map(|r| r.0.clone()).collect();
    assert_eq!(
        order,
        ["order-42", "order-42.1", "order-42.1", "order-42.1.1"]
    );

    // The whole pipeline is one query.
    let jobs = env.store.pipeline_jobs("order-42.1").await.unwrap();
    let view: Vec<(&str, &str, &str, i32)> = jobs
        .iter()
        .map(|j| {
            (
                j.id.as_str(),
                j.queue.as_str(),
                j.status.as_str(),
                j.attempts,
            )
        })
        .collect();
    assert_eq!(
        view,
        [
            ("order-42", "charge", "completed", 1),
            ("order-42.1", "pdf", "completed", 2),
            ("order-42.1.1", "email", "completed", 1)
        ]
    );
    assert_eq!(jobs[2].parents, ["order-42.1"]);
    let out = env.cli(&["jobs", "pipeline", "order-42"]);
    assert!(out.status.success(), "{}", text(&out));
    let table = text(&out);
    assert!(
        table.contains("order-42.1.1") && table.contains("after order-42.1"),
        "{table}"
    );
    worker.shutdown().await;
}

#[tokio::test]
async fn fan_in_runs_the_child_once_after_every_parent_completed() {
    let env = TestEnv::new(QUEUES).await;
    let (h, runs) = recording();
    let worker = env.worker(&[("h", h)]).await;
    let c = env.client();
    for (id, ms) in [("a", 300), ("b", 900), ("c", 1500)] {
        c.enqueue("pdf", json!({ "hold_ms": ms }), opts(id))
            .await
            .unwrap();
    }
    let child = c
        .enqueue(
            "email",
            json!({"all": "done"}),
            after(&["a", "b", "c"], "fan-in"),
        )
        .await
        .unwrap();
    assert_eq!(child.status.as_str(), "waiting");
    assert!(env.wait_status("a", "completed", 10).await);
    assert_eq!(env.status_of("fan-in").await.as_deref(), Some("waiting"));
    assert!(env.wait_status("fan-in", "completed", 20).await);
    assert_eq!(count(&runs, "fan-in"), 1);
    // It started after the last parent completed.
    let started_after = env
        .scalar(
            "SELECT count(*) FROM jobs c, jobs p WHERE c.id = 'fan-in' AND p.id IN ('a','b','c') \
             AND c.started_at >= p.completed_at",
        )
        .await;
    assert_eq!(started_after, 3);
    // A child of parents that completed already runs at once; enqueueing it again is the
    // same job.
    let late = after(&["a", "c"], "late");
    c.enqueue("email", json!({}), late.clone()).await.unwrap();
    assert!(env.wait_status("late", "completed", 10).await);
    let again = c.enqueue("email", json!({}), late).await.unwrap();
    assert!(!again.created);
    assert_eq!(count(&runs, "late"), 1);
    // A parent that does not exist is refused, by name.
    let err = c
        .enqueue("email", json!({}), after(&["nope"], "orphan"))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("'nope', which does not exist"), "{err}");
    worker.shutdown().await;
}

#[tokio::test]
async fn a_dead_parent_dead_letters_its_descendants_and_retrying_it_revives_them() {
    let env = TestEnv::new(QUEUES).await;
    let (h, runs) = recording();
    let worker = env.worker(&[("h", h)]).await;
    let c = env.client();
    c.enqueue(
        "charge",
        json!({"fail": true}),
        EnqueueOptions {
            max_attempts: Some(1),
            ..opts("p")
        },
    )
    .await
    .unwrap();
    c.enqueue("pdf", json!({}), after(&["p"], "child"))
        .await
        .unwrap();
    c.enqueue("email", json!({}), after(&["child"], "grandchild"))
        .await
        .unwrap();
    assert!(env.wait_status("grandchild", "dead", 20).await);
    assert_eq!(env.status_of("child").await.as_deref(), Some("dead"));
    let why = env.store.job_get("grandchild").await.unwrap().unwrap();
    assert_eq!(why.last_error.as_deref(), Some("parent child is dead"));
    assert_eq!(count(&runs, "child") + count(&runs, "grandchild"), 0);

    // Retrying a doomed child alone does not run it: its parent is still dead. It waits,
    // and the scheduler's next chain round may doom it again at once (its parent is dead):
    // either way it stays blocked by its parent.
    let out = env.cli(&["dlq", "retry", "grandchild"]);
    assert!(out.status.success(), "{}", text(&out));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let blocked = env.store.job_get("grandchild").await.unwrap().unwrap();
    assert!(
        blocked.status == "waiting"
            || (blocked.status == "dead"
                && blocked.last_error.as_deref() == Some("parent child is dead")),
        "{:?} {:?}",
        blocked.status,
        blocked.last_error
    );
    assert_eq!(
        count(&runs, "grandchild"),
        0,
        "a child never runs before its parent completed"
    );

    // The parent is fixed and retried from the dead-letter queue: the chain resumes.
    env.store
        .raw()
        .await
        .unwrap()
        .batch_execute("UPDATE jobs SET payload = '{}' WHERE id = 'p'")
        .await
        .unwrap();
    let out = env.cli(&["dlq", "retry", "p"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(env.wait_status("grandchild", "completed", 20).await);
    assert_eq!(
        (
            count(&runs, "p"),
            count(&runs, "child"),
            count(&runs, "grandchild")
        ),
        (2, 1, 1)
    );
    worker.shutdown().await;
}

#[tokio::test]
async fn a_cancelled_pipeline_runs_nothing_more() {
    let env = TestEnv::new(QUEUES).await;
    let (h, runs) = recording();
    let worker = env.worker(&[("h", h)]).await;
    let c = env.client();
    c.enqueue(
        "charge",
        json!({"hold_ms": 60_000}),
        EnqueueOptions {
            then: vec![Then::new("pdf", json!({}))],
            ..opts("root")
        },
    )
    .await
    .unwrap();
    c.enqueue("email", json!({}), after(&["root"], "after-root"))
        .await
        .unwrap();
    assert!(env.wait_status("root", "processing", 10).await);
    let out = env.cli(&["jobs", "cancel", "--pipeline", "after-root"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("2 unfinished jobs"), "{}", text(&out));
    assert!(env.wait_status("root", "cancelled", 10).await);
    assert!(
        wait_for(Duration::from_secs(10), || async {
            env.status_of("after-root").await.as_deref() == Some("cancelled")
        })
        .await
    );
    // Cancelling one job cancels what depends on it.
    c.enqueue("charge", json!({"hold_ms": 60_000}), opts("solo"))
        .await
        .unwrap();
    c.enqueue("email", json!({}), after(&["solo"], "after-solo"))
        .await
        .unwrap();
    let out = env.cli(&["jobs", "cancel", "solo"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(env.wait_status("after-solo", "cancelled", 10).await);
    let why = env.store.job_get("after-solo").await.unwrap().unwrap();
    assert_eq!(why.last_error.as_deref(), Some("parent solo was cancelled"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let ran: HashMap<String, usize> =
        runs.lock()
            .unwrap()
            .iter()
            .fold(HashMap::new(), |mut m, r| {
                *m.entry(r.0.clone()).or_default() += 1;
                m
            });
    assert_eq!(
        ran.get("root.1"),
        None,
        "the then job was never created: {ran:?}"
    );
    assert_eq!(ran.get("after-root"), None, "{ran:?}");
    assert_eq!(ran.get("after-solo"), None, "{ran:?}");
    assert_eq!(
        env.scalar("SELECT count(*) FROM jobs WHERE id = 'root.1'")
            .await,
        0
    );
    worker.shutdown().await;
}

#[tokio::test]
async fn sql_enqueue_and_the_cli_chain_jobs_too() {
    let env = TestEnv::new(QUEUES).await;
    let (h, runs) = recording();
    let worker = env.worker(&[("h", h)]).await;
    let db = env.store.raw().await.unwrap();
    // The outbox path: one transaction writes the order and enqueues the chain.
    db.batch_execute(
        "BEGIN; \
         SELECT enqueue('charge', '{\"order\": 7}', id => 'sql-7', \
                        then_jobs => '[{\"queue\": \"pdf\", \"payload\": {\"order\": 7}, \
                                        \"then\": [{\"queue\": \"email\", \"id\": \"sql-7-mail\", \
                                                    \"payload\": {\"order\": 7}}]}]'); \
         SELECT enqueue('pdf', '{\"stock\": 7}', id => 'sql-7-stock'); \
         SELECT enqueue('email', '{\"audit\": 7}', id => 'sql-7-audit', \
                        depends_on => ARRAY['sql-7', 'sql-7-stock']); \
         COMMIT;",
    )
    .await
    .unwrap();
    assert!(env.wait_status("sql-7-mail", "completed", 20).await);
    assert!(env.wait_status("sql-7-audit", "completed", 20).await);
    let pipeline = env.store.pipeline_jobs("sql-7").await.unwrap();
    let ids: Vec<&str> = pipeline.iter().map(|j| j.id.as_str()).collect();
    // The audit job joins the pipeline of its first parent; the stock job, a parent that
    // began no pipeline, stays its own.
    assert_eq!(ids.len(), 4, "{ids:?}");
    for id in ["sql-7", "sql-7.1", "sql-7-mail", "sql-7-audit"] {
        assert!(ids.contains(&id), "{id} in {ids:?}");
    }
    for id in [
        "sql-7",
        "sql-7.1",
        "sql-7-mail",
        "sql-7-stock",
        "sql-7-audit",
    ] {
        assert_eq!(count(&runs, id), 1, "{id}");
    }
    // Bad specs are refused by name.
    let err = db
        .batch_execute("SELECT enqueue('pdf', '{}', then_jobs => '[{\"queue\": \"pdf\"}]')")
        .await
        .unwrap_err();
    let msg = err.as_db_error().unwrap().message().to_string();
    assert_eq!(msg, "jobwarden: field `then[1].payload` is required");

    // The CLI: --then and --depends-on.
    let out = env.cli(&[
        "enqueue",
        "charge",
        "{}",
        "--id",
        "cli-1",
        "--then",
        r#"[{"queue":"pdf","payload":{"n":1}}]"#,
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let out = env.cli(&[
        "enqueue",
        "email",
        "{}",
        "--id",
        "cli-2",
        "--depends-on",
        "cli-1.1",
    ]);
    assert!(
        !out.status.success(),
        "cli-1.1 does not exist yet: {}",
        text(&out)
    );
    assert!(env.wait_status("cli-1.1", "completed", 20).await);
    let out = env.cli(&[
        "enqueue",
        "email",
        "{}",
        "--id",
        "cli-2",
        "--depends-on",
        "cli-1.1",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(env.wait_status("cli-2", "completed", 20).await);
    let out = env.cli(&["enqueue", "pdf", "{}", "--then", "[{\"queue\": 3}]"]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("field `then[1].queue` must be a string, found a number"),
        "{}",
        text(&out)
    );
    let out = env.cli(&["enqueue", "pdf", "{}", "--then", "not json"]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("give a JSON array of jobs"),
        "{}",
        text(&out)
    );
    drop(db);
    worker.shutdown().await;
}

#[tokio::test]
async fn a_published_message_may_carry_then_and_one_with_depends_on_is_dead_lettered_saying_why() {
    let env = TestEnv::new(QUEUES).await;
    let (h, runs) = recording();
    let worker = env.worker(&[("h", h)]).await;
    let body = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/examples/envelope-then.json"
    ))
    .unwrap();
    env.publish_raw("charge", body).await;
    assert!(env.wait_status("order-42.1.1", "completed", 20).await);
    let pipeline = env.store.pipeline_jobs("order-42").await.unwrap();
    let view: Vec<(&str, &str, i32)> = pipeline
        .iter()
        .map(|j| (j.id.as_str(), j.status.as_str(), j.max_attempts))
        .collect();
    assert_eq!(
        view,
        [
            ("order-42", "completed", 3),
            ("order-42.1", "completed", 2),
            ("order-42.1.1", "completed", 5)
        ]
    );
    assert_eq!(runs.lock().unwrap().len(), 3);

    env.publish_raw(
        "email",
        json!({"id": "waits", "payload": {}, "depends_on": ["order-42"]}).to_string(),
    )
    .await;
    assert!(
        wait_for(Duration::from_secs(10), || async {
            env.scalar(
                "SELECT count(*) FROM jobs WHERE status = 'dead' AND last_error LIKE '%depends_on%--depends-on%'",
            )
            .await
                == 1
        })
        .await,
        "the message is kept as a dead job that says how to enqueue it"
    );
    worker.shutdown().await;
}

#[tokio::test]
async fn a_then_spec_postgresql_refuses_holds_up_no_other_chain() {
    let env = TestEnv::new(QUEUES).await;
    let (h, runs) = recording();
    let worker = env.worker(&[("h", h)]).await;
    let c = env.client();
    // Two parents complete together: one with a `then` the database cannot create (written
    // behind the validation's back), one with a good one; a child waits for both.
    for id in ["bad", "good"] {
        c.enqueue(
            "charge",
            json!({"hold_ms": 800}),
            EnqueueOptions {
                then: vec![Then::new("pdf", json!({"after": id}))],
                ..opts(id)
            },
        )
        .await
        .unwrap();
    }
    c.enqueue("email", json!({}), after(&["bad", "good"], "both"))
        .await
        .unwrap();
    env.store
        .raw()
        .await
        .unwrap()
        .batch_execute(
            "UPDATE jobs SET then_jobs = '[{\"queue\": \"pdf\", \"payload\": {}, \"timeout_ms\": \"soon\"}]' WHERE id = 'bad'",
        )
        .await
        .unwrap();
    assert!(
        env.wait_status("good.1", "completed", 20).await,
        "the good then job ran"
    );
    assert!(
        env.wait_status("both", "completed", 20).await,
        "the child of both ran"
    );
    let bad = env.store.job_get("bad").await.unwrap().unwrap();
    assert_eq!(bad.status, "completed");
    let why = bad.last_error.unwrap_or_default();
    assert!(why.starts_with("then jobs not created: "), "{why}");
    assert!(
        why.contains("soon"),
        "the specs are kept in the reason: {why}"
    );
    assert_eq!(
        env.scalar("SELECT count(*) FROM jobs WHERE id = 'bad.1'")
            .await,
        0
    );
    assert_eq!(count(&runs, "both"), 1);
    worker.shutdown().await;
}
