//! Results flow down a chain (issue 32, item 2): a job that a parent's `then` created, or
//! that waited for its `depends_on` parents, receives their results — in a Rust handler's
//! `JobContext::parents`, an http handler's request (`parents`), an exec command's
//! `JOB_PARENTS` — on every attempt, through every door a job is claimed by (a plain queue's
//! claim, a keyed queue's take); bounded in size; shown by `jobs pipeline`.

mod common;

use common::with_id as opts;

use common::{text, TestEnv};
use jobwarden::client::{EnqueueOptions, Then};
use jobwarden::handler::{from_fn, JobError};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// What each attempt received as its parents' results: (job id, attempt) → parents.
type Seen = Arc<Mutex<HashMap<(String, u32), Option<Value>>>>;

/// A Rust handler that records its parents' results and returns the payload's `result`;
/// `fail_first` fails the first attempt (a retry).
fn rust_handler() -> (Arc<dyn jobwarden::Handler>, Seen) {
    let seen: Seen = Arc::default();
    let s = seen.clone();
    let h = from_fn(move |job| {
        let s = s.clone();
        async move {
            s.lock()
                .unwrap()
                .insert((job.id.clone(), job.attempt), job.parents.clone());
            if job.payload["fail_first"] == json!(true) && job.attempt == 1 {
                return Err(JobError::retry("first attempt fails"));
            }
            Ok(job.payload.get("result").cloned())
        }
    });
    (h, seen)
}

/// An application for the http handler: records each request's body and answers with the
/// request's `parents` as the result (`{"got": <parents or null>}`).
async fn echo_app(bodies: Arc<Mutex<Vec<Value>>>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().route(
        "/jobs",
        axum::routing::post(move |body: axum::body::Bytes| {
            let bodies = bodies.clone();
            async move {
                let job: Value = serde_json::from_slice(&body).unwrap();
                let got = job.get("parents").cloned().unwrap_or(Value::Null);
                bodies.lock().unwrap().push(job);
                json!({ "got": got }).to_string()
            }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}/jobs")
}

async fn result_of(env: &TestEnv, id: &str) -> Option<Value> {
    env.store.job_get(id).await.unwrap().and_then(|j| j.result)
}

#[tokio::test]
async fn the_charges_result_reaches_the_invoice_step_and_the_email_in_every_handler_kind() {
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let url = echo_app(bodies.clone()).await;
    // charge: Rust; invoice: exec (its result is the JOB_PARENTS it was given); email: http
    // (its result is the request's `parents`).
    let env = TestEnv::new(&format!(
        r#"[queues.charge]
handler = {{ kind = "rust", name = "h" }}
[queues.invoice]
handler = {{ kind = "exec", command = ["sh", "-c", '''printf '{{"result": {{"parents": %s}}}}\n' "${{JOB_PARENTS:-\"unset\"}}"'''] }}
[queues.email]
handler = {{ kind = "http", url = "{url}" }}
"#
    ))
    .await;
    let (h, _) = rust_handler();
    let w = env.worker(&[("h", h)]).await;
    let charged = json!({"charge_id": "ch_42", "amount": 1999});
    env.client()
        .enqueue(
            "charge",
            json!({"order": 42, "result": charged}),
            EnqueueOptions {
                then: vec![Then::new("invoice", json!({"order": 42}))
                    .then(Then::new("email", json!({"order": 42})))],
                ..opts("order-42")
            },
        )
        .await
        .unwrap();
    assert!(env.wait_status("order-42.1.1", "completed", 30).await);
    // The exec step saw the charge's result in JOB_PARENTS (its result echoes them).
    let invoice = json!({"parents": { "order-42": charged }});
    assert_eq!(result_of(&env, "order-42.1").await, Some(invoice.clone()));
    // The http step got the exec step's result in its request.
    assert_eq!(
        result_of(&env, "order-42.1.1").await,
        Some(json!({ "got": { "order-42.1": invoice } }))
    );

    // A job that follows none: no `parents` in the request, JOB_PARENTS unset.
    env.client()
        .enqueue("email", json!({}), opts("alone"))
        .await
        .unwrap();
    env.client()
        .enqueue("invoice", json!({}), opts("alone-exec"))
        .await
        .unwrap();
    assert!(env.wait_status("alone", "completed", 20).await);
    assert!(env.wait_status("alone-exec", "completed", 20).await);
    let alone = bodies
        .lock()
        .unwrap()
        .iter()
        .find(|b| b["id"] == "alone")
        .cloned();
    assert!(
        alone.as_ref().is_some_and(|b| b.get("parents").is_none()),
        "{alone:?}"
    );
    assert_eq!(
        result_of(&env, "alone-exec").await,
        Some(json!({"parents": "unset"}))
    );

    // `jobs pipeline` shows each step's result.
    let out = env.cli(&["jobs", "pipeline", "order-42"]);
    let table = text(&out);
    assert!(out.status.success(), "{table}");
    assert!(
        table.contains(r#"result {"amount":1999,"charge_id":"ch_42"}"#),
        "{table}"
    );
    assert!(
        table.contains(r#"result {"parents":{"order-42":{"#),
        "{table}"
    );
    w.shutdown().await;
}

#[tokio::test]
async fn a_fan_in_child_gets_every_parents_result_on_every_attempt_within_the_bound() {
    let env = TestEnv::new(
        "[queues.work]\nmax_attempts = 3\nbackoff = { kind = \"fixed\", base = \"50ms\" }\n\
         handler = { kind = \"rust\", name = \"h\" }\n",
    )
    .await;
    let (h, seen) = rust_handler();
    let w = env.worker(&[("h", h)]).await;
    let c = env.client();
    let big = "x".repeat(70_000);
    for (id, result) in [
        ("a", json!({"n": 1})),
        ("b", json!("two")),
        ("c", Value::Null),
        ("huge", json!({ "blob": big })),
    ] {
        c.enqueue("work", json!({ "result": result }), opts(id))
            .await
            .unwrap();
    }
    c.enqueue(
        "work",
        json!({"fail_first": true}),
        EnqueueOptions {
            depends_on: vec!["a".into(), "b".into(), "c".into(), "huge".into()],
            ..opts("child")
        },
    )
    .await
    .unwrap();
    assert!(env.wait_status("child", "completed", 30).await);
    let seen = seen.lock().unwrap().clone();
    let first = seen.get(&("child".into(), 1)).cloned().flatten();
    let second = seen.get(&("child".into(), 2)).cloned().flatten();
    assert_eq!(first, second, "the retry got other parents' results");
    let parents = first.expect("the child got no parents' results");
    assert_eq!(parents["a"], json!({"n": 1}));
    assert_eq!(parents["b"], json!("two"));
    assert_eq!(parents["c"], Value::Null);
    assert!(parents.as_object().unwrap().contains_key("c"), "{parents}");
    // Over the bound: named, with its size and where to read it, not passed.
    let omitted = parents["huge"]["omitted"].as_str().unwrap_or_default();
    assert!(
        omitted.contains("job huge") && omitted.contains("jobs show huge"),
        "{parents}"
    );
    assert!(parents.to_string().len() < 65_536 + 1_000);
    // A job that follows none gets none.
    assert_eq!(seen.get(&("a".into(), 1)), Some(&None));
    w.shutdown().await;
}

#[tokio::test]
async fn a_keyed_queues_then_job_gets_its_parents_result_when_taken() {
    let env = TestEnv::new(
        "[queues.charge]\nhandler = { kind = \"rust\", name = \"h\" }\n\
         [queues.notify]\nkey_concurrency = 1\nhandler = { kind = \"rust\", name = \"h\" }\n",
    )
    .await;
    let (h, seen) = rust_handler();
    let w = env.worker(&[("h", h)]).await;
    env.client()
        .enqueue(
            "charge",
            json!({"result": {"paid": true}}),
            EnqueueOptions {
                then: vec![Then {
                    key: Some("customer-7".into()),
                    ..Then::new("notify", json!({}))
                }],
                ..opts("pay-7")
            },
        )
        .await
        .unwrap();
    assert!(env.wait_status("pay-7.1", "completed", 30).await);
    assert_eq!(
        seen.lock().unwrap().get(&("pay-7.1".into(), 1)),
        Some(&Some(json!({"pay-7": {"paid": true}})))
    );
    w.shutdown().await;
}
