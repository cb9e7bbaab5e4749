//! The handler kinds end to end through a real worker: http (the app reporting progress on
//! the local API) and exec (stdin, progress, result).

mod common;

use common::{wait_for, TestEnv};
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
