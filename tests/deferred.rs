//! Completion from outside (issue 32, item 1): a handler answers "accepted, I will report"
//! (http `202` + `Jobwarden-Defer`, exec exit 202 after a `{"defer": …}` line, a Rust
//! handler's `job.defer()`); the job is `awaiting` (slot freed, message acked) until
//! `complete` or `fail` comes with the attempt's token (the local API of any worker, SQL,
//! the CLI, the Rust client), or its deadline retries or dead-letters it. Stale, forged and
//! late tokens are refused and recorded; the worker that deferred a job may die meanwhile.

mod common;

use common::with_id as opts;
use common::{text, wait_for, ChildWorker, TestEnv};
use jobwarden::client::{EnqueueOptions, Then};
use jobwarden::completion::{Ended, Refusal};
use jobwarden::handler::from_fn;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Tokens each attempt was handed: (job id, attempt) → token.
type Tokens = Arc<Mutex<HashMap<(String, u32), String>>>;

/// An application that defers every job (`202` with `Jobwarden-Defer: <defer>`, or the
/// payload's `defer` header value when it has one, or a plain `202` when it is `null`), and
/// records each request's completion token.
async fn deferring_app(tokens: Tokens, defer: &'static str) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().route(
        "/jobs",
        axum::routing::post(move |body: axum::body::Bytes| {
            let tokens = tokens.clone();
            async move {
                let job: Value = serde_json::from_slice(&body).unwrap();
                let id = job["id"].as_str().unwrap().to_string();
                let attempt = job["attempt"].as_u64().unwrap() as u32;
                let token = job["completion_token"].as_str().unwrap().to_string();
                tokens.lock().unwrap().insert((id, attempt), token);
                let mut resp = axum::http::Response::builder().status(202);
                match job["payload"].get("defer") {
                    Some(Value::Null) => {}
                    Some(v) => resp = resp.header("Jobwarden-Defer", v.as_str().unwrap()),
                    None => resp = resp.header("Jobwarden-Defer", defer),
                }
                resp.body(axum::body::Body::from("{\"accepted\": true}"))
                    .unwrap()
            }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}/jobs")
}

/// A Rust handler that records each attempt's token and defers its job for `deadline`.
fn deferring(tokens: Tokens, deadline: Duration) -> Arc<dyn jobwarden::Handler> {
    from_fn(move |job| {
        let tokens = tokens.clone();
        async move {
            tokens
                .lock()
                .unwrap()
                .insert((job.id.clone(), job.attempt), job.completion_token());
            job.defer(deadline)
        }
    })
}

fn token(tokens: &Tokens, id: &str, attempt: u32) -> String {
    tokens
        .lock()
        .unwrap()
        .get(&(id.to_string(), attempt))
        .cloned()
        .unwrap_or_else(|| panic!("no token for attempt {attempt} of {id}"))
}

/// `POST <api>/v1/jobs/<id>/<what>` with `body`: (status, answer).
async fn post(api: std::net::SocketAddr, id: &str, what: &str, body: Value) -> (u16, Value) {
    let url = format!(
        "http://{api}/v1/jobs/{}/{what}",
        jobwarden::handler::path_segment(id)
    );
    let r = reqwest::Client::new()
        .post(url)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

async fn outcomes(env: &TestEnv, id: &str) -> Vec<String> {
    common::outcomes(&env.store, id).await
}

#[tokio::test]
async fn a_202_defers_the_job_frees_its_slot_and_the_webhook_completes_it_once() {
    let tokens: Tokens = Arc::default();
    let url = deferring_app(tokens.clone(), "60").await;
    let env = TestEnv::new(&format!(
        r#"[queues.pay]
concurrency = 1
handler = {{ kind = "http", url = "{url}" }}
[queues.receipt]
handler = {{ kind = "rust", name = "r" }}
"#
    ))
    .await;
    let receipts = Arc::new(Mutex::new(Vec::new()));
    let seen = receipts.clone();
    let r = from_fn(move |job| {
        let seen = seen.clone();
        async move {
            seen.lock().unwrap().push(job.parents.clone());
            Ok(None)
        }
    });
    let w = env.worker(&[("r", r)]).await;
    let c = env.client();
    c.enqueue(
        "pay",
        json!({"amount": 1999}),
        EnqueueOptions {
            then: vec![Then::new("receipt", json!({}))],
            ..opts("pay-1")
        },
    )
    .await
    .unwrap();
    assert!(env.wait_status("pay-1", "awaiting", 20).await);
    // The slot is free: with a concurrency of 1, the next job runs (and defers) meanwhile.
    c.enqueue("pay", json!({"amount": 5}), opts("pay-2"))
        .await
        .unwrap();
    assert!(env.wait_status("pay-2", "awaiting", 20).await);
    // The deadline is the handler's; the token the worker handed out is the schema's.
    let t1 = token(&tokens, "pay-1", 1);
    let sql_token = env
        .strings("SELECT completion_token('pay-1', lease) FROM jobs WHERE id = 'pay-1'")
        .await;
    assert_eq!(sql_token, vec![t1.clone()]);
    let left = env
        .scalar("SELECT extract(epoch FROM await_until - now())::int8 FROM jobs WHERE id = 'pay-1'")
        .await;
    assert!(
        (55..=60).contains(&left),
        "{left} s left of a 60 s deadline"
    );
    let show = text(&env.cli(&["jobs", "show", "pay-1"]));
    assert!(show.contains("awaiting until:"), "{show}");
    let metrics = common::metrics(&w).await;
    assert!(metrics.contains(r#"outcome="deferred""#), "{metrics}");
    let stats: Value =
        serde_json::from_slice(&env.cli(&["stats", "--json"]).stdout).unwrap_or_default();
    let pay = stats["queues"]
        .as_array()
        .and_then(|q| q.iter().find(|r| r["queue"] == "pay"))
        .cloned();
    assert_eq!(
        pay.map(|r| r["awaiting"].clone()),
        Some(json!(2)),
        "{stats}"
    );

    // Refusals: a forged token, an unknown job, a token of another job, a malformed body.
    let forged = format!("{}.{}", t1.split('.').next().unwrap(), "0".repeat(32));
    let (status, body) = post(w.api_addr, "pay-1", "complete", json!({"token": forged})).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("was not issued for this job"),
        "{body}"
    );
    let (status, _) = post(w.api_addr, "nope", "complete", json!({"token": t1})).await;
    assert_eq!(status, 404);
    let (status, _) = post(w.api_addr, "pay-2", "complete", json!({"token": t1})).await;
    assert_eq!(status, 403);
    let (status, body) = post(w.api_addr, "pay-1", "complete", json!({"tokn": t1})).await;
    assert_eq!(status, 400, "{body}");
    // A result over the limit.
    let big = "x".repeat(jobwarden::contract::MAX_RESULT_BYTES + 1);
    let (status, body) = post(
        w.api_addr,
        "pay-1",
        "complete",
        json!({"token": t1, "result": big}),
    )
    .await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(env.status_of("pay-1").await.as_deref(), Some("awaiting"));

    // The provider's webhook: completes it with a result, which flows to the receipt.
    let (status, body) = post(
        w.api_addr,
        "pay-1",
        "complete",
        json!({"token": t1, "result": {"charge": "ch_1"}}),
    )
    .await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("completed")),
        "{body}"
    );
    assert!(env.wait_status("pay-1.1", "completed", 20).await);
    assert_eq!(
        receipts.lock().unwrap().clone(),
        vec![Some(json!({"pay-1": {"charge": "ch_1"}}))]
    );
    // The webhook again (providers retry): nothing changes, nothing runs twice.
    let (status, body) = post(
        w.api_addr,
        "pay-1",
        "complete",
        json!({"token": t1, "result": 1}),
    )
    .await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("already completed"))
    );
    let (status, _) = post(w.api_addr, "pay-1", "fail", json!({"token": t1})).await;
    assert_eq!(status, 409);
    let job = env.store.job_get("pay-1").await.unwrap().unwrap();
    assert_eq!(job.result, Some(json!({"charge": "ch_1"})));
    assert_eq!(receipts.lock().unwrap().len(), 1);
    assert_eq!(env.count("completed").await, 2, "pay-1 and its receipt");
    // Each refusal of a token is recorded with the job (the unknown id has no job to go with).
    let refused = env
        .scalar("SELECT count(*) FROM job_attempts WHERE outcome = 'completion_refused'")
        .await;
    assert_eq!(
        refused, 3,
        "forged, another job's token, fail after complete"
    );
    // The other job, failed for good from outside.
    let t2 = token(&tokens, "pay-2", 1);
    let (status, body) = post(
        w.api_addr,
        "pay-2",
        "fail",
        json!({"token": t2, "error": "card declined", "permanent": true}),
    )
    .await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("dead")),
        "{body}"
    );
    let dead = env.store.job_get("pay-2").await.unwrap().unwrap();
    assert_eq!(
        dead.last_error.as_deref(),
        Some("permanent error: card declined")
    );
    w.shutdown().await;
}

#[tokio::test]
async fn the_deadline_retries_an_awaiting_job_then_dead_letters_it_and_old_tokens_are_stale() {
    let env = TestEnv::new(
        r#"[queues.slow]
backoff = { kind = "fixed", base = "10ms" }
handler = { kind = "rust", name = "d" }
"#,
    )
    .await;
    let tokens: Tokens = Arc::default();
    let h = deferring(tokens.clone(), Duration::from_millis(800));
    let w = env.worker(&[("d", h)]).await;
    let c = env.client();
    c.enqueue(
        "slow",
        json!({}),
        EnqueueOptions {
            max_attempts: Some(2),
            ..opts("never-confirmed")
        },
    )
    .await
    .unwrap();
    assert!(env.wait_status("never-confirmed", "awaiting", 20).await);
    // No webhook comes: the deadline retries it; the second attempt defers again, and its
    // deadline dead-letters it (no attempts left).
    assert!(env.wait_status("never-confirmed", "dead", 30).await);
    assert_eq!(
        outcomes(&env, "never-confirmed").await,
        vec!["deadline", "dead"]
    );
    let job = env.store.job_get("never-confirmed").await.unwrap().unwrap();
    assert!(
        job.last_error
            .as_deref()
            .unwrap()
            .starts_with("deadline passed")
            && job
                .last_error
                .as_deref()
                .unwrap()
                .ends_with("(attempt 2 of 2, no attempts left)"),
        "{:?}",
        job.last_error
    );
    // The first attempt's token is stale; the second's is refused as ended by its deadline.
    let first = token(&tokens, "never-confirmed", 1);
    let second = token(&tokens, "never-confirmed", 2);
    assert_ne!(first, second);
    let stale = c.complete("never-confirmed", &first, None).await.unwrap();
    let stale = stale.unwrap_err();
    assert_eq!(stale.refusal, Refusal::Conflict);
    assert!(
        stale.message.contains("moved on to lease"),
        "{}",
        stale.message
    );
    let late = c
        .complete("never-confirmed", &second, None)
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(late.refusal, Refusal::Conflict);
    assert!(
        late.message.contains("already ended (status dead)"),
        "{}",
        late.message
    );
    // A failure with the last token after the deadline is a repeat: nothing changes.
    let again = c
        .fail("never-confirmed", &second, "late", false, None)
        .await
        .unwrap();
    assert_eq!(again, Ok(Ended::AlreadyFailed));
    assert_eq!(
        env.status_of("never-confirmed").await.as_deref(),
        Some("dead")
    );
    w.shutdown().await;
}

#[tokio::test]
async fn exec_defers_with_exit_202_and_the_cli_fails_then_completes_it() {
    let dir = tempdir();
    let env = TestEnv::new(&format!(
        r#"[queues.render]
max_attempts = 3
backoff = {{ kind = "fixed", base = "10ms" }}
handler = {{ kind = "exec", command = ["sh", "-c", '''
case "$JOB_ID" in
  no-deadline) exit 202 ;;
  bad-deadline) echo '{{"defer": "soon"}}'; exit 202 ;;
esac
printf %s "$JOB_COMPLETION_TOKEN" > "{dir}/$JOB_ID.$JOB_ATTEMPT"
echo '{{"defer": "5m"}}'
exit 202''' ] }}
"#,
        dir = dir.display()
    ))
    .await;
    let w = env.worker(&[]).await;
    let c = env.client();
    for id in ["video-1", "no-deadline", "bad-deadline"] {
        c.enqueue("render", json!({}), opts(id)).await.unwrap();
    }
    assert!(env.wait_status("video-1", "awaiting", 20).await);
    let read = |id: &str, attempt: u32| {
        std::fs::read_to_string(dir.join(format!("{id}.{attempt}"))).unwrap()
    };
    // The CLI fails it (retried at once: retry after 0 s) ...
    let t1 = read("video-1", 1);
    let out = env.cli(&[
        "jobs",
        "fail",
        "video-1",
        "--token",
        &t1,
        "--error",
        "encoder busy",
        "--retry-after",
        "0s",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("video-1: retry scheduled"),
        "{}",
        text(&out)
    );
    // ... the second attempt defers again, and the CLI completes it with its token.
    assert!(
        wait_for(Duration::from_secs(20), || async {
            dir.join("video-1.2").exists()
                && env.status_of("video-1").await.as_deref() == Some("awaiting")
        })
        .await
    );
    let t2 = read("video-1", 2);
    // The old token is refused (exit 1, recorded); a malformed result is bad input (exit 2).
    let out = env.cli(&["jobs", "complete", "video-1", "--token", &t1]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("stale token"), "{}", text(&out));
    let out = env.cli(&[
        "jobs", "complete", "video-1", "--token", &t2, "--result", "{nope",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let out = env.cli(&["jobs", "complete", "missing", "--token", &t2]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let out = env.cli(&[
        "jobs",
        "complete",
        "video-1",
        "--token",
        &t2,
        "--result",
        r#"{"url": "s3://v/1.mp4"}"#,
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("video-1: completed"), "{}", text(&out));
    let job = env.store.job_get("video-1").await.unwrap().unwrap();
    assert_eq!(job.status, "completed");
    assert_eq!(job.result, Some(json!({"url": "s3://v/1.mp4"})));
    assert_eq!(
        outcomes(&env, "video-1").await[..2],
        ["failed", "completion_refused"]
    );
    // Exit 202 without a deadline, or with one that is not a duration: retried, saying why.
    for (id, why) in [
        ("no-deadline", "printed no deadline"),
        ("bad-deadline", "\"soon\" is not a duration"),
    ] {
        assert!(
            wait_for(Duration::from_secs(20), || async {
                env.store
                    .job_get(id)
                    .await
                    .unwrap()
                    .and_then(|j| j.last_error)
                    .is_some_and(|e| e.contains(why))
            })
            .await,
            "{id}: {:?}",
            env.store.job_get(id).await.unwrap().map(|j| j.last_error)
        );
    }
    w.shutdown().await;
}

#[tokio::test]
async fn http_deferrals_need_a_valid_deadline_and_a_plain_202_still_completes() {
    let tokens: Tokens = Arc::default();
    let url = deferring_app(tokens.clone(), "60").await;
    let env = TestEnv::new(&format!(
        r#"[queues.pay]
max_attempts = 1
handler = {{ kind = "http", url = "{url}" }}
"#
    ))
    .await;
    let w = env.worker(&[]).await;
    let c = env.client();
    for (id, defer) in [
        ("plain", Value::Null),
        ("soon", json!("soon")),
        ("zero", json!("0")),
        ("too-long", json!("31d")),
    ] {
        c.enqueue("pay", json!({ "defer": defer }), opts(id))
            .await
            .unwrap();
    }
    assert!(env.wait_status("plain", "completed", 20).await);
    for id in ["soon", "zero", "too-long"] {
        assert!(env.wait_status(id, "dead", 20).await, "{id}");
        let e = env.store.job_get(id).await.unwrap().unwrap().last_error;
        assert!(
            e.as_deref()
                .is_some_and(|e| e.contains("with Jobwarden-Defer: deferral deadline")),
            "{id}: {e:?}"
        );
    }
    w.shutdown().await;
}

#[tokio::test]
async fn a_cancelled_awaiting_job_refuses_its_completion() {
    let env = TestEnv::new(
        r#"[queues.approve]
handler = { kind = "rust", name = "d" }
"#,
    )
    .await;
    let tokens: Tokens = Arc::default();
    let h = deferring(tokens.clone(), Duration::from_secs(3600));
    let w = env.worker(&[("d", h)]).await;
    env.client()
        .enqueue("approve", json!({}), opts("expense-9"))
        .await
        .unwrap();
    assert!(env.wait_status("expense-9", "awaiting", 20).await);
    let out = env.cli(&["jobs", "cancel", "expense-9"]);
    assert!(out.status.success(), "{}", text(&out));
    let (status, body) = post(
        w.api_addr,
        "expense-9",
        "complete",
        json!({"token": token(&tokens, "expense-9", 1)}),
    )
    .await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("was cancelled"),
        "{body}"
    );
    assert_eq!(
        env.status_of("expense-9").await.as_deref(),
        Some("cancelled")
    );
    w.shutdown().await;
}

#[tokio::test]
async fn the_completion_lands_after_the_worker_that_deferred_the_job_was_killed() {
    let tokens: Tokens = Arc::default();
    let url = deferring_app(tokens.clone(), "120").await;
    let env = TestEnv::new(&format!(
        r#"[queues.pay]
handler = {{ kind = "http", url = "{url}" }}
[queues.receipt]
handler = {{ kind = "rust", name = "r" }}
"#
    ))
    .await;
    let mut config = env.config.clone();
    config.worker.heartbeat_every = Duration::from_millis(200);
    config.worker.dead_after = Duration::from_secs(1);
    config.queues.remove("receipt");
    let mut child = ChildWorker::spawn(&config, "pod-0");
    env.client()
        .enqueue(
            "pay",
            json!({"amount": 1}),
            EnqueueOptions {
                then: vec![Then::new("receipt", json!({}))],
                ..opts("pay-k")
            },
        )
        .await
        .unwrap();
    assert!(env.wait_status("pay-k", "awaiting", 30).await);
    let owner = env
        .strings("SELECT worker_id FROM jobs WHERE id = 'pay-k'")
        .await;
    child.kill9();
    // Another pod starts and finds the dead owner: its live jobs would be reclaimed, but an
    // awaiting job is not running anywhere, and stays awaiting with its lease.
    let mut survivor = env.config.clone();
    survivor.worker.heartbeat_every = Duration::from_millis(200);
    survivor.worker.dead_after = Duration::from_secs(1);
    let r = from_fn(|_job| async move { Ok(Some(json!("receipt sent"))) });
    let w = env.worker_with(survivor, &[("r", r)]).await;
    assert!(
        wait_for(Duration::from_secs(15), || async {
            env.scalar(&format!(
                "SELECT count(*) FROM workers WHERE id = '{}' AND stopped_at IS NOT NULL",
                owner[0]
            ))
            .await
                == 1
        })
        .await,
        "the killed worker was declared dead"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(env.status_of("pay-k").await.as_deref(), Some("awaiting"));
    assert_eq!(
        env.scalar("SELECT lease FROM jobs WHERE id = 'pay-k'")
            .await,
        1
    );
    // The webhook reaches the surviving pod's API (or any SQL session): it lands.
    let (status, body) = post(
        w.api_addr,
        "pay-k",
        "complete",
        json!({"token": token(&tokens, "pay-k", 1), "result": {"paid": true}}),
    )
    .await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("completed")),
        "{body}"
    );
    assert!(env.wait_status("pay-k.1", "completed", 20).await);
    assert_eq!(tokens.lock().unwrap().len(), 1, "the payment ran once");
    w.shutdown().await;
}

fn tempdir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "jobwarden-deferred-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[tokio::test]
async fn a_sql_completion_is_part_of_the_callers_transaction() {
    let env = TestEnv::new(
        r#"[queues.approve]
handler = { kind = "rust", name = "d" }
"#,
    )
    .await;
    let tokens: Tokens = Arc::default();
    let w = env
        .worker(&[("d", deferring(tokens.clone(), Duration::from_secs(3600)))])
        .await;
    env.client()
        .enqueue("approve", json!({}), opts("po-7"))
        .await
        .unwrap();
    assert!(env.wait_status("po-7", "awaiting", 20).await);
    let t = token(&tokens, "po-7", 1);
    let mut c = env.store.raw().await.unwrap();
    // The approval's own write and the completion commit together, or neither does.
    let tx = c.transaction().await.unwrap();
    let said: String = tx
        .query_one(
            "SELECT complete('po-7', $1, '{\"approved_by\": \"ana\"}')",
            &[&t],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(said, "completed");
    tx.rollback().await.unwrap();
    assert_eq!(env.status_of("po-7").await.as_deref(), Some("awaiting"));
    let tx = c.transaction().await.unwrap();
    tx.query_one(
        "SELECT complete('po-7', $1, '{\"approved_by\": \"ana\"}')",
        &[&t],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(env.status_of("po-7").await.as_deref(), Some("completed"));
    // A forged token raises in the caller's session (JW403): its transaction is aborted.
    let e = c
        .query_one(
            "SELECT fail('po-7', '1.00000000000000000000000000000000', 'x')",
            &[],
        )
        .await
        .unwrap_err();
    assert_eq!(e.as_db_error().map(|d| d.code().code()), Some("JW403"));
    w.shutdown().await;
}
