//! Batches (issue 32, item 3): jobs enqueued together (SQL `enqueue_batch()`, the CLI's
//! `enqueue-batch`, `Client::enqueue_batch`) whose callbacks run once when every member has
//! ended — `on_complete` whatever became of them, `on_success` only if all completed — and
//! receive the counts and the failed ids as their parents' results. No member updates a
//! counter as it ends: each pod's scheduler finishes the batches with no unfinished member.

mod common;

use common::with_id as opts;
use common::{text, wait_for, ChildWorker, TestEnv};
use jobwarden::client::{Batch, BulkJob, ClientError};
use jobwarden::handler::from_fn;
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The application: members fail for good when their payload says so (`422`), callbacks
/// (queue `report`) are recorded with what they received.
async fn app(reports: Arc<Mutex<Vec<Value>>>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().route(
        "/jobs",
        axum::routing::post(move |body: axum::body::Bytes| {
            let reports = reports.clone();
            async move {
                let job: Value = serde_json::from_slice(&body).unwrap();
                if job["queue"] == "report" {
                    reports.lock().unwrap().push(job);
                    return (axum::http::StatusCode::OK, "{}");
                }
                if job["payload"]["fail"] == json!(true) {
                    return (axum::http::StatusCode::UNPROCESSABLE_ENTITY, "bad address");
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
                (axum::http::StatusCode::OK, "{}")
            }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}/jobs")
}

async fn finished(env: &TestEnv, batch: &str, secs: u64) -> bool {
    wait_for(Duration::from_secs(secs), || async {
        env.store
            .batch_progress(batch)
            .await
            .unwrap()
            .is_some_and(|p| p.finished_at.is_some())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_10000_with_1_percent_failures_calls_on_complete_once_through_a_killed_pod() {
    let reports = Arc::new(Mutex::new(Vec::new()));
    let url = app(reports.clone()).await;
    let env = TestEnv::new(&format!(
        r#"[queues.work]
concurrency = 32
max_attempts = 3
handler = {{ kind = "http", url = "{url}" }}
[queues.report]
handler = {{ kind = "http", url = "{url}" }}
"#
    ))
    .await;
    let mut config = env.config.clone();
    config.worker.heartbeat_every = Duration::from_millis(200);
    config.worker.dead_after = Duration::from_secs(2);
    let mut pods = vec![
        ChildWorker::spawn(&config, "pod-0"),
        ChildWorker::spawn(&config, "pod-1"),
    ];
    let n = 10_000;
    let failing: Vec<String> = (0..n)
        .filter(|i| i % 100 == 42)
        .map(|i| format!("m-{i:05}"))
        .collect();
    let batch = Batch {
        id: Some("newsletter".into()),
        jobs: (0..n)
            .map(|i| {
                BulkJob::new(
                    "work",
                    json!({"n": i, "fail": i % 100 == 42}),
                    opts(&format!("m-{i:05}")),
                )
            })
            .collect(),
        on_complete: Some(BulkJob::new(
            "report",
            json!({"report": "newsletter"}),
            Default::default(),
        )),
        on_success: Some(BulkJob::new(
            "report",
            json!({"report": "all sent"}),
            Default::default(),
        )),
    };
    let started = std::time::Instant::now();
    let id = env.client().enqueue_batch(&batch).await.unwrap();
    eprintln!("enqueued 10,000 members in {:?}", started.elapsed());
    assert_eq!(id, "newsletter");
    // Mid-batch, one pod dies (SIGKILL) and comes back under its name.
    assert!(
        wait_for(Duration::from_secs(120), || async {
            env.count("completed").await >= 3_000
        })
        .await
    );
    pods[0].kill9();
    let progress = env
        .store
        .batch_progress("newsletter")
        .await
        .unwrap()
        .unwrap();
    assert!(progress.finished_at.is_none(), "{progress:?}");
    assert!(progress.ended() < n, "killed mid-batch: {progress:?}");
    pods[0] = ChildWorker::spawn(&config, "pod-0");
    assert!(
        finished(&env, "newsletter", 240).await,
        "the batch finished"
    );
    eprintln!("10,000 members ended in {:?}", started.elapsed());
    // on_complete runs once, with the counts and the ids that failed.
    assert!(
        wait_for(Duration::from_secs(30), || async {
            env.status_of("newsletter.on_complete").await.as_deref() == Some("completed")
        })
        .await
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let got = reports.lock().unwrap().clone();
    assert_eq!(got.len(), 1, "one callback, once: {got:?}");
    let outcome = &got[0]["parents"]["newsletter"];
    assert_eq!(outcome["size"], json!(n));
    assert_eq!(outcome["completed"], json!(9_900));
    assert_eq!(outcome["dead"], json!(100));
    assert_eq!(outcome["cancelled"], json!(0));
    assert_eq!(outcome["failed"], json!(failing));
    assert_eq!(outcome["failed_omitted"], json!(0));
    assert_eq!(got[0]["payload"], json!({"report": "newsletter"}));
    // on_success never runs: some members failed.
    assert_eq!(env.status_of("newsletter.on_success").await, None);
    let p = env
        .store
        .batch_progress("newsletter")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        p.callbacks,
        Some(vec!["newsletter.on_complete".to_string()])
    );
    assert_eq!(
        (p.completed, p.dead, p.running, p.waiting),
        (9_900, 100, 0, 0)
    );
    // The progress in the CLI, and on a member's page.
    let out = env.cli(&["batch", "show", "newsletter"]);
    assert!(
        text(&out).contains("10000 of 10000 ended (9900 completed, 100 dead)"),
        "{}",
        text(&out)
    );
    let out = env.cli(&["jobs", "show", "m-00042"]);
    assert!(
        text(&out).contains("batch:         newsletter: 10000 of 10000 ended"),
        "{}",
        text(&out)
    );
    // The killed pod's attempts were taken back (the reconciliation says so).
    let recovered = env
        .scalar("SELECT count(*) FROM job_attempts WHERE outcome IN ('restarted', 'owner_dead')")
        .await;
    eprintln!("attempts taken back from the killed pod: {recovered}");
    for p in &mut pods {
        p.kill9();
    }
}

#[tokio::test]
async fn batch_doors_refuse_bad_input_and_a_clean_batch_runs_both_callbacks_once() {
    let env = TestEnv::new(
        r#"[queues.work]
handler = { kind = "rust", name = "h" }
[queues.report]
handler = { kind = "rust", name = "r" }
"#,
    )
    .await;
    let c = env.store.raw().await.unwrap();
    let refused = |spec: Value| {
        let c = &c;
        async move {
            c.query_one("SELECT enqueue_batch($1)", &[&spec])
                .await
                .unwrap_err()
                .as_db_error()
                .map(|e| e.message().to_string())
                .unwrap_or_default()
        }
    };
    let job = |id: &str| json!({"queue": "work", "payload": {}, "id": id});
    for (spec, says) in [
        (json!({"jobs": []}), "a batch needs at least one member"),
        (json!({"jobs": [job("a"), job("a")]}), "jobs[2].id"),
        (json!({"jobs": [{"queue": "work"}]}), "jobs[1]"),
        (
            json!({"jobs": [job("a")], "on_done": {}}),
            "unknown field(s) on_done",
        ),
        (
            json!({"jobs": [job("a")], "on_complete": {"queue": "report", "payload": {}, "depends_on": ["a"]}}),
            "depends on nothing else",
        ),
        (
            json!({"jobs": [job("a")], "on_complete": {"queue": "report"}}),
            "on_complete",
        ),
        (json!({"jobs": "a"}), "batch.jobs"),
    ] {
        let got = refused(spec.clone()).await;
        assert!(got.contains(says), "{spec}: {got}");
    }
    assert_eq!(
        env.scalar("SELECT count(*) FROM jobs").await,
        0,
        "nothing enqueued"
    );
    assert_eq!(env.scalar("SELECT count(*) FROM batches").await, 0);

    let ran = Arc::new(Mutex::new(Vec::new()));
    let seen = ran.clone();
    let r = from_fn(move |job| {
        let seen = seen.clone();
        async move {
            seen.lock()
                .unwrap()
                .push((job.id.clone(), job.parents.clone()));
            Ok(None)
        }
    });
    let h = from_fn(|_job| async move { Ok(Some(json!("sent"))) });
    let w = env.worker(&[("h", h), ("r", r)]).await;

    // The CLI door: members from JSON lines, both callbacks.
    let dir = std::env::temp_dir().join(format!("jobwarden-batch-{:08x}", rand::random::<u32>()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("members.jsonl");
    std::fs::write(
        &file,
        (1..=3)
            .map(|i| job(&format!("c-{i}")).to_string())
            .collect::<Vec<_>>()
            .join("\n"),
    )
    .unwrap();
    let out = env.cli(&[
        "enqueue-batch",
        file.to_str().unwrap(),
        "--id",
        "cli-batch",
        "--on-complete",
        r#"{"queue": "report", "payload": {"which": "complete"}}"#,
        "--on-success",
        r#"{"queue": "report", "payload": {"which": "success"}}"#,
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "cli-batch");
    assert!(finished(&env, "cli-batch", 30).await);
    assert!(
        env.wait_status("cli-batch.on_success", "completed", 20)
            .await
    );
    assert!(
        env.wait_status("cli-batch.on_complete", "completed", 20)
            .await
    );
    let outcome = json!({"cli-batch": {"batch": "cli-batch", "size": 3, "completed": 3,
        "dead": 0, "cancelled": 0, "pruned": 0, "failed": [], "failed_omitted": 0}});
    let mut got = ran.lock().unwrap().clone();
    got.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        got,
        vec![
            ("cli-batch.on_complete".to_string(), Some(outcome.clone())),
            ("cli-batch.on_success".to_string(), Some(outcome)),
        ]
    );
    // The same id again; a bad line, named by its number.
    let out = env.cli(&["enqueue-batch", file.to_str().unwrap(), "--id", "cli-batch"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("batch 'cli-batch' already exists"),
        "{}",
        text(&out)
    );
    std::fs::write(&file, format!("{}\n{{\"queue\": \"work\"}}\n", job("d-1"))).unwrap();
    let out = env.cli(&["enqueue-batch", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("line 2:"), "{}", text(&out));

    // The Rust door: a callback for a queue no pod serves waits, visibly; the batch finished.
    let client = env.client();
    let b = Batch {
        id: None,
        jobs: vec![BulkJob::new("work", json!({}), Default::default())],
        on_complete: Some(BulkJob::new("nobody", json!({}), Default::default())),
        on_success: None,
    };
    let id = client.enqueue_batch(&b).await.unwrap();
    assert!(finished(&env, &id, 30).await);
    let cb = format!("{id}.on_complete");
    let status = env.status_of(&cb).await.unwrap();
    assert!(
        ["scheduled", "queued"].contains(&status.as_str()),
        "{status}"
    );
    let empty = Batch {
        jobs: vec![],
        ..b.clone()
    };
    match client.enqueue_batch(&empty).await {
        Err(ClientError::Invalid(m)) => assert!(m.contains("at least one member"), "{m}"),
        other => panic!("{other:?}"),
    }
    w.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}
