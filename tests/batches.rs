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
        // A batch id is an id: its callbacks' ids are made of it.
        (
            json!({"id": "a b", "jobs": [job("a")]}),
            "field `batch.id` is invalid: contains U+0020",
        ),
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

/// Publishes a member of a batch to `jobs.work`: the envelope's `batch` names the batch, its
/// size and callbacks (every member carries the same object).
async fn publish_member(env: &TestEnv, id: &str, payload: Value, batch: Value) {
    let body = json!({"id": id, "payload": payload, "max_attempts": 1, "batch": batch});
    env.publish_raw("work", body.to_string()).await;
}

/// The one-line text of a SQL answer (a job's last error, a batch's field).
async fn text_of(env: &TestEnv, sql: &str, arg: &str) -> Option<String> {
    let c = env.store.raw().await.unwrap();
    c.query_opt(sql, &[&arg])
        .await
        .unwrap()
        .and_then(|r| r.get::<_, Option<String>>(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_published_over_nats_finishes_once_all_its_declared_members_came_and_ended() {
    let env = TestEnv::new(
        r#"[queues.work]
handler = { kind = "rust", name = "h" }
[queues.report]
handler = { kind = "rust", name = "r" }
"#,
    )
    .await;
    let ran = Arc::new(Mutex::new(Vec::new()));
    let seen = ran.clone();
    let r = from_fn(move |job| {
        let seen = seen.clone();
        async move {
            seen.lock()
                .unwrap()
                .push((job.id.clone(), job.payload.clone(), job.parents.clone()));
            Ok(None)
        }
    });
    let h = from_fn(|job| async move {
        if job.payload["fail"] == json!(true) {
            return Err(jobwarden::handler::JobError::permanent("bad address"));
        }
        Ok(Some(json!("sent")))
    });
    let w = env.worker(&[("h", h), ("r", r)]).await;
    let batch = json!({"id": "nats-b", "size": 20,
        "on_complete": {"queue": "report", "payload": {"which": "complete"}},
        "on_success": {"queue": "report", "payload": {"which": "success"}}});
    // 19 of the 20 members come (one fails for good) and end: the batch waits for the 20th.
    for i in 1..20 {
        let id = format!("nb-{i:02}");
        publish_member(&env, &id, json!({"n": i, "fail": i == 7}), batch.clone()).await;
    }
    assert!(
        wait_for(Duration::from_secs(30), || async {
            env.scalar("SELECT count(*) FROM jobs WHERE batch = 'nats-b' AND status IN ('completed', 'dead')")
                .await
                == 19
        })
        .await,
        "the 19 members that came ended"
    );
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let p = env.store.batch_progress("nats-b").await.unwrap().unwrap();
    assert_eq!((p.size, p.completed, p.dead), (20, 18, 1), "{p:?}");
    assert!(p.finished_at.is_none(), "a member has not come yet: {p:?}");
    let out = env.cli(&["batch", "show", "nats-b"]);
    assert!(text(&out).contains("19 of 20 ended"), "{}", text(&out));
    // Retention keeps the members of an unfinished batch: each is counted when it finishes.
    let session = env.store.prune_reader().await.unwrap();
    let pruned = session
        .prune_jobs("completed", Duration::ZERO, &[], "-infinity", 1_000)
        .await
        .unwrap();
    assert!(
        pruned.is_empty(),
        "members of an open batch pruned: {pruned:?}"
    );
    drop(session);
    // A member delivered twice is one member.
    publish_member(&env, "nb-03", json!({"n": 3, "fail": false}), batch.clone()).await;
    publish_member(
        &env,
        "nb-20",
        json!({"n": 20, "fail": false}),
        batch.clone(),
    )
    .await;
    assert!(finished(&env, "nats-b", 30).await, "the batch finished");
    assert!(env.wait_status("nats-b.on_complete", "completed", 20).await);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let got = ran.lock().unwrap().clone();
    assert_eq!(got.len(), 1, "on_complete once, on_success never: {got:?}");
    assert_eq!(got[0].0, "nats-b.on_complete");
    assert_eq!(got[0].1, json!({"which": "complete"}));
    assert_eq!(
        got[0].2,
        Some(
            json!({"nats-b": {"batch": "nats-b", "size": 20, "completed": 19, "dead": 1,
            "cancelled": 0, "pruned": 0, "failed": ["nb-07"], "failed_omitted": 0}})
        )
    );
    assert_eq!(
        env.scalar("SELECT count(*) FROM jobs WHERE batch = 'nats-b'")
            .await,
        20
    );

    // Bad input, each kept as a dead job that says why; nothing else is held up.
    let last_error = "SELECT last_error FROM jobs WHERE id = $1";
    // A new member of a finished batch (a worker takes the members of a batch it found open
    // for a second without asking again: past that, it asks).
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    publish_member(&env, "late-1", json!({}), batch.clone()).await;
    // A member of a batch enqueued whole through SQL.
    let c = env.store.raw().await.unwrap();
    c.query_one(
        "SELECT enqueue_batch('{\"id\": \"sql-b\", \"jobs\": [{\"queue\": \"work\", \"payload\": {}, \"id\": \"s-1\"}]}')",
        &[],
    )
    .await
    .unwrap();
    publish_member(
        &env,
        "intruder",
        json!({}),
        json!({"id": "sql-b", "size": 1}),
    )
    .await;
    // Two members that declare their batch differently: the first declaration holds, the
    // second member is a dead member of it.
    publish_member(&env, "d-1", json!({}), json!({"id": "dd", "size": 2})).await;
    assert!(env.wait_status("d-1", "completed", 20).await);
    publish_member(&env, "d-2", json!({}), json!({"id": "dd", "size": 3})).await;
    // An envelope the contract refuses, whose batch is readable: a dead member, so that the
    // batch does not wait for it for ever.
    env.publish_raw(
        "work",
        json!({"id": "e-1", "payload": {}, "max_attempts": 0,
               "batch": {"id": "ee", "size": 1, "on_complete": {"queue": "report", "payload": {"which": "ee"}}}})
        .to_string(),
    )
    .await;
    for (id, says) in [
        ("late-1", "batch `nats-b` has finished"),
        ("intruder", "enqueued whole through SQL"),
        ("d-2", "declared"),
    ] {
        assert!(env.wait_status(id, "dead", 20).await, "{id}");
        let e = text_of(&env, last_error, id).await.unwrap_or_default();
        assert!(e.contains(says), "{id}: {e}");
    }
    assert_eq!(
        text_of(&env, "SELECT batch FROM jobs WHERE id = $1", "late-1").await,
        None,
        "a finished batch takes no member"
    );
    assert!(
        finished(&env, "dd", 30).await,
        "the batch with a dead member finished"
    );
    let o = text_of(
        &env,
        "SELECT outcome::text FROM batches WHERE id = $1",
        "dd",
    )
    .await
    .unwrap();
    let o: Value = serde_json::from_str(&o).unwrap();
    assert_eq!(
        (o["size"].clone(), o["completed"].clone(), o["dead"].clone()),
        (json!(2), json!(1), json!(1)),
        "{o}"
    );
    assert!(
        finished(&env, "ee", 30).await,
        "a refused envelope's batch finished"
    );
    assert!(env.wait_status("ee.on_complete", "completed", 20).await);
    let dead_e = env
        .scalar("SELECT count(*) FROM jobs WHERE batch = 'ee' AND status = 'dead' AND last_error LIKE '%max_attempts%'")
        .await;
    assert_eq!(dead_e, 1);
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_of_a_keyed_queue_and_a_member_that_reused_a_taken_id_count_in_their_batch() {
    let env = TestEnv::new(
        r#"[queues.keyed]
key_concurrency = 1
handler = { kind = "rust", name = "h" }
[queues.report]
handler = { kind = "rust", name = "r" }
"#,
    )
    .await;
    let ran = Arc::new(Mutex::new(Vec::new()));
    let seen = ran.clone();
    let r = from_fn(move |job| {
        let seen = seen.clone();
        async move {
            seen.lock().unwrap().push(job.parents.clone());
            Ok(None)
        }
    });
    let h = from_fn(|_job| async move { Ok(None) });
    // A job that holds the id a member will reuse, with another payload.
    let c = env.store.raw().await.unwrap();
    for sql in [
        "SELECT enqueue('keyed', '{\"other\": true}', id => 'taken', run_at => now() + interval '1 day')",
        "SELECT enqueue('report', '{\"other\": true}', id => 'elsewhere', run_at => now() + interval '1 day')",
    ] {
        c.execute(sql, &[]).await.unwrap();
    }
    let w = env.worker(&[("h", h), ("r", r)]).await;
    let batch = json!({"id": "kb", "size": 7,
        "on_complete": {"queue": "report", "payload": {}}});
    for i in 1..=5 {
        let body = json!({"id": format!("k-{i}"), "payload": {"n": i},
            "key": if i % 2 == 0 { "a" } else { "b" }, "batch": batch});
        env.publish_raw("keyed", body.to_string()).await;
    }
    for id in ["taken", "elsewhere"] {
        let body = json!({"id": id, "payload": {"n": 6}, "key": "a", "batch": batch});
        env.publish_raw("keyed", body.to_string()).await;
    }
    assert!(finished(&env, "kb", 30).await, "the batch finished");
    assert!(env.wait_status("kb.on_complete", "completed", 20).await);
    let got = ran.lock().unwrap().clone();
    assert_eq!(got.len(), 1, "{got:?}");
    let o = &got[0].as_ref().unwrap()["kb"];
    assert_eq!(
        (o["size"].clone(), o["completed"].clone(), o["dead"].clone()),
        (json!(7), json!(5), json!(2)),
        "{o}"
    );
    // The members that reused an id are kept under their own message ids, dead members.
    let mut errors = Vec::new();
    for kept in o["failed"].as_array().unwrap() {
        let kept = kept.as_str().unwrap();
        assert!(kept.starts_with("JOBS-"), "{kept}");
        errors.push(
            text_of(&env, "SELECT last_error FROM jobs WHERE id = $1", kept)
                .await
                .unwrap(),
        );
    }
    errors.sort();
    assert!(
        errors[0].contains("id \"elsewhere\" belongs to a job of queue report"),
        "{errors:?}"
    );
    assert!(
        errors[1].contains("id \"taken\" is already used"),
        "{errors:?}"
    );
    assert_eq!(env.status_of("taken").await.as_deref(), Some("scheduled"));
    w.shutdown().await;
}
