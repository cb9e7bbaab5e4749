//! The three handler kinds end to end through a real worker, the producer client, and
//! messages for queues nobody serves.

mod common;

use common::{stat, wait_for, TestEnv};
use jobwarden::client::{Client, EnqueueOptions};
use jobwarden::handler::from_fn;
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A local application for the http handler: reports progress through the sidecar's API
/// (the `progress_url` it is given), then answers with a result.
async fn start_app(seen: Arc<Mutex<Vec<Value>>>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().route(
        "/jobs",
        axum::routing::post(
            move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                let seen = seen.clone();
                async move {
                    let job: Value = serde_json::from_slice(&body).unwrap();
                    let url = job["progress_url"].as_str().unwrap().to_string();
                    let resp = reqwest::Client::new()
                        .post(&url)
                        .json(&json!({"progress": 0.5, "stage": "sending", "message": "half way"}))
                        .send()
                        .await
                        .unwrap();
                    let mut rec = job.clone();
                    rec["progress_status"] = json!(resp.status().as_u16());
                    rec["idempotency_key"] = json!(headers
                        .get("idempotency-key")
                        .map(|v| v.to_str().unwrap().to_string()));
                    seen.lock().unwrap().push(rec);
                    if job["payload"]["fail"] == json!(true) {
                        return (
                            axum::http::StatusCode::UNPROCESSABLE_ENTITY,
                            "bad address".to_string(),
                        );
                    }
                    (
                        axum::http::StatusCode::OK,
                        json!({"sent": true}).to_string(),
                    )
                }
            },
        ),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}/jobs")
}

#[tokio::test]
async fn http_handler_runs_jobs_and_the_app_reports_progress_on_the_local_api() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let url = start_app(seen.clone()).await;
    let env = TestEnv::new(&format!(
        "[queues.email]\nmax_attempts = 3\nhandler = {{ kind = \"http\", url = \"{url}\" }}\n"
    ))
    .await;
    let worker = env.worker(&[]).await;
    env.publish_raw(
        "email",
        r#"{"id":"mail-1","payload":{"to":"a@example.com"}}"#,
    )
    .await;
    env.publish_raw("email", r#"{"id":"mail-2","payload":{"fail":true}}"#)
        .await;
    assert!(
        wait_for(Duration::from_secs(20), || async {
            env.status_of("mail-1").await.as_deref() == Some("completed")
                && env.status_of("mail-2").await.as_deref() == Some("dead")
        })
        .await
    );
    let job = env.store.job_get("mail-1").await.unwrap().unwrap();
    assert_eq!(job.result, Some(json!({"sent": true})));
    assert_eq!(job.stage.as_deref(), Some("sending"));
    assert_eq!(job.progress, Some(0.5));
    assert_eq!(job.message.as_deref(), Some("half way"));
    // A 4xx other than 408/429 is permanent: dead after one attempt.
    let dead = env.store.job_get("mail-2").await.unwrap().unwrap();
    assert_eq!(dead.attempts, 1);
    assert!(dead.last_error.unwrap().contains("422"));
    let seen = seen.lock().unwrap().clone();
    let first = seen.iter().find(|j| j["id"] == "mail-1").unwrap();
    assert_eq!(first["payload"], json!({"to": "a@example.com"}));
    assert_eq!(first["attempt"], json!(1));
    assert_eq!(first["progress_status"], json!(200));
    assert_eq!(first["idempotency_key"], json!("mail-1"));
    // The local API refuses reports for attempts that do not run here, reports that name
    // no attempt, and bodies that are not a report.
    let post = |path: &str, body: &'static str| {
        reqwest::Client::new()
            .post(format!("http://{}{path}", worker.api_addr))
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let resp = post("/v1/jobs/nope/progress?lease=1", r#"{"progress": 1.0}"#)
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 404);
    let resp = post("/v1/jobs/nope/progress", r#"{"progress": 1.0}"#)
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    let body: Value = resp.json().await.unwrap();
    assert!(
        body["error"].as_str().unwrap().contains("progress_url"),
        "{body}"
    );
    let resp = post("/v1/jobs/nope/progress?lease=1", "{not json")
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    worker.shutdown().await;
}

#[tokio::test]
async fn exec_handler_reads_stdin_reports_progress_and_returns_a_result() {
    let script = r#"payload=$(cat); echo '{"progress":0.3,"stage":"render"}'; echo "log line that is not json"; printf '{"result":{"got":%s,"attempt":%s}}\n' "$payload" "$JOB_ATTEMPT"; if [ "$JOB_ID" = "ex-fail" ]; then echo "renderer crashed" >&2; exit 3; fi"#;
    let env = TestEnv::new(&format!(
        "[queues.pdf]\nmax_attempts = 2\nbackoff = {{ kind = \"fixed\", base = \"50ms\" }}\n\
         handler = {{ kind = \"exec\", command = [\"sh\", \"-c\", {script:?}] }}\n"
    ))
    .await;
    let worker = env.worker(&[]).await;
    env.publish_raw("pdf", r#"{"id":"ex-1","payload":{"doc":7}}"#)
        .await;
    env.publish_raw("pdf", r#"{"id":"ex-fail","payload":{}}"#)
        .await;
    assert!(
        wait_for(Duration::from_secs(20), || async {
            env.status_of("ex-1").await.as_deref() == Some("completed")
                && env.status_of("ex-fail").await.as_deref() == Some("dead")
        })
        .await
    );
    let job = env.store.job_get("ex-1").await.unwrap().unwrap();
    assert_eq!(job.result, Some(json!({"got": {"doc": 7}, "attempt": 1})));
    assert_eq!(job.stage.as_deref(), Some("render"));
    assert_eq!(job.progress, Some(0.3));
    let failed = env.store.job_get("ex-fail").await.unwrap().unwrap();
    assert_eq!(failed.attempts, 2);
    let err = failed.last_error.unwrap();
    assert!(
        err.contains("exit code 3") && err.contains("renderer crashed"),
        "{err}"
    );
    env.wait_consumer_drained("pdf").await;
    worker.shutdown().await;
}

#[tokio::test]
async fn client_enqueue_runs_once_per_idempotency_key_and_delays_wait_in_postgres() {
    let env = TestEnv::new("[queues.work]\nhandler = { kind = \"rust\", name = \"h\" }\n").await;
    let runs = Arc::new(Mutex::new(Vec::<(String, Value)>::new()));
    let r = runs.clone();
    let h = from_fn(move |job| {
        let r = r.clone();
        async move {
            r.lock()
                .unwrap()
                .push((job.id.clone(), job.payload.clone()));
            Ok(None)
        }
    });
    let worker = env.worker(&[("h", h)]).await;
    let client = Client::new(env.store.clone(), env.broker.clone());
    let opts = EnqueueOptions {
        idempotency_key: Some("order-42".into()),
        ..Default::default()
    };
    let a = client
        .enqueue("work", json!({"charge": 42}), opts.clone())
        .await
        .unwrap();
    let b = client
        .enqueue("work", json!({"charge": 42}), opts)
        .await
        .unwrap();
    assert!(a.created && !b.created);
    assert_eq!(a.id, b.id, "the second enqueue returns the first job");
    let delayed = client
        .enqueue(
            "work",
            json!({"later": true}),
            EnqueueOptions {
                delay: Some(Duration::from_millis(1500)),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(delayed.status.as_str(), "scheduled");
    assert!(env.wait_status(&a.id, "completed", 10).await);
    // Not before its time.
    assert_eq!(
        env.status_of(&delayed.id).await.as_deref(),
        Some("scheduled")
    );
    assert!(env.wait_status(&delayed.id, "completed", 10).await);
    let c = env.store.raw().await.unwrap();
    let waited: f64 = c
        .query_one(
            "SELECT extract(epoch FROM started_at - created_at)::float8 FROM jobs WHERE id = $1",
            &[&delayed.id],
        )
        .await
        .unwrap()
        .get(0);
    assert!(waited >= 1.5, "delayed job started after {waited}s");
    let runs = runs.lock().unwrap().clone();
    assert_eq!(runs.iter().filter(|(id, _)| id == &a.id).count(), 1);
    assert_eq!(runs.len(), 2);
    assert!(stat(&worker.stats.scheduled_published) >= 1);
    // Bad input through the client: clear errors, nothing stored.
    let err = client
        .enqueue("work", json!([1, 2]), EnqueueOptions::default())
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "field `payload` must be an object, found an array"
    );
    let err = client
        .enqueue("bad queue", json!({}), EnqueueOptions::default())
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("field `queue` is invalid: queue name \"bad queue\" must be 1 to 64"),
        "{err}"
    );
    worker.shutdown().await;
}

#[tokio::test]
async fn messages_for_a_queue_nobody_serves_are_dead_lettered_with_the_reason_and_payload() {
    let env = TestEnv::new("[queues.email]\nhandler = { kind = \"rust\", name = \"h\" }\n").await;
    // sweep_every drives the janitor, unserved_grace how long messages wait; short here.
    let mut config = env.config.clone();
    config.worker.sweep_every = Duration::from_millis(300);
    config.worker.unserved_grace = Duration::from_millis(500);
    let h = from_fn(|_job| async { Ok(None) });
    let worker = env.worker_with(config, &[("h", h)]).await;
    env.publish_raw("emial", r#"{"to":"typo@example.com"}"#)
        .await;
    env.publish_raw("email", r#"{"id":"fine","payload":{}}"#)
        .await;
    assert!(
        wait_for(Duration::from_secs(15), || async {
            env.count("dead").await == 1 && env.count("completed").await == 1
        })
        .await,
        "dead {} completed {}",
        env.count("dead").await,
        env.count("completed").await
    );
    let c = env.store.raw().await.unwrap();
    let row = c
        .query_one(
            "SELECT queue, last_error, payload FROM jobs WHERE status = 'dead'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "emial");
    let reason: String = row.get(1);
    assert!(
        reason.contains("no worker served queue `emial`"),
        "{reason}"
    );
    // The job keeps its own payload, so a retry runs the real job.
    let payload: Value = row.get(2);
    assert_eq!(payload, json!({"to": "typo@example.com"}));
    assert_eq!(stat(&worker.stats.unserved_dead_lettered), 1);
    // The message is out of the stream, and no consumer was ever created for it (only the
    // eleven lanes of `email`).
    let mut stream = env.broker.stream().await.unwrap();
    let info = stream.info().await.unwrap();
    assert_eq!(info.state.messages, 0, "{:?}", info.state);
    assert_eq!(info.state.consumer_count, 11, "{:?}", info.state);
    worker.shutdown().await;
}
