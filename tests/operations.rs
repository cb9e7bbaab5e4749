//! Failure policy and operations against real servers: backoff timings read from the
//! attempts table, dead letters and their events, retry, cancel across processes, exec
//! timeouts, stats and the operator views.

mod common;

use common::{outcomes, text, wait_for, ChildWorker, RecordingApp, TestEnv};
use futures::StreamExt;
use jobwarden::handler::{from_fn, JobError};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Seconds between consecutive attempt starts of `id`, from the attempts table.
async fn gaps(env: &TestEnv, id: &str) -> Vec<f64> {
    let c = env.store.raw().await.unwrap();
    let starts: Vec<f64> = c
        .query(
            "SELECT extract(epoch FROM started_at)::float8 FROM job_attempts
             WHERE job_id = $1 ORDER BY finished_at, id",
            &[&id],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    starts.windows(2).map(|w| w[1] - w[0]).collect()
}

#[tokio::test]
async fn each_backoff_kind_retries_on_its_schedule_then_dead_letters() {
    // The seed's queues: webhooks exponential from 1 s × 5, email exponential from 5 s × 3,
    // pdf fixed 10 s × 2; plus linear from 1 s × 3.
    let env = TestEnv::new(
        "[queues.webhooks]\nmax_attempts = 5\nbackoff = { kind = \"exponential\", base = \"1s\" }\n\
         handler = { kind = \"rust\", name = \"fail\" }\n\
         [queues.email]\nmax_attempts = 3\nbackoff = { kind = \"exponential\", base = \"5s\" }\n\
         handler = { kind = \"rust\", name = \"fail\" }\n\
         [queues.pdf]\nmax_attempts = 2\nbackoff = { kind = \"fixed\", base = \"10s\" }\n\
         handler = { kind = \"rust\", name = \"fail\" }\n\
         [queues.linear]\nmax_attempts = 3\nbackoff = { kind = \"linear\", base = \"1s\" }\n\
         handler = { kind = \"rust\", name = \"fail\" }\n",
    )
    .await;
    let fail = from_fn(|_job| async { Err(JobError::retry("endpoint returned 503")) });
    let worker = env.worker(&[("fail", fail)]).await;
    // Subscribe to dead-letter events before anything dies.
    let mut events = env
        .broker
        .client
        .subscribe("jobwarden.dead.>")
        .await
        .unwrap();
    for q in ["webhooks", "email", "pdf", "linear"] {
        env.publish_raw(q, format!(r#"{{"id":"{q}-1","payload":{{}}}}"#))
            .await;
    }
    assert!(
        wait_for(Duration::from_secs(40), || async {
            env.count("dead").await == 4
        })
        .await,
        "dead: {}",
        env.count("dead").await
    );
    let expect = [
        ("webhooks-1", vec![1.0, 2.0, 4.0, 8.0]),
        ("email-1", vec![5.0, 10.0]),
        ("pdf-1", vec![10.0]),
        ("linear-1", vec![1.0, 2.0]),
    ];
    for (id, want) in expect {
        let got = gaps(&env, id).await;
        println!("{id}: retried after {got:.2?} s (want {want:?})");
        assert_eq!(got.len(), want.len(), "{id}: {got:?}");
        for (g, w) in got.iter().zip(&want) {
            // The scheduler polls every 50 ms here; claims and handlers add a few ms.
            assert!(
                *g >= *w && *g < *w + 0.6,
                "{id}: gap {g:.3}s, want {w}s ({got:?})"
            );
        }
        let o = outcomes(&env.store, id).await;
        assert_eq!(o.last().map(String::as_str), Some("dead"), "{id}: {o:?}");
    }
    let job = env.store.job_get("webhooks-1").await.unwrap().unwrap();
    assert!(job.last_error.unwrap().contains("attempt 5 of 5"));
    // One event per dead job, outside the work stream.
    let mut seen = Vec::new();
    while seen.len() < 4 {
        let m = tokio::time::timeout(Duration::from_secs(5), events.next())
            .await
            .expect("dead-letter event")
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&m.payload).unwrap();
        assert_eq!(
            m.subject.as_str(),
            format!("jobwarden.dead.{}", v["queue"].as_str().unwrap())
        );
        seen.push(v["id"].as_str().unwrap().to_string());
    }
    seen.sort();
    assert_eq!(seen, vec!["email-1", "linear-1", "pdf-1", "webhooks-1"]);
    worker.shutdown().await;
}

/// `dlq list` shows the most recently dead first: after an incident the jobs that just died
/// are on top, even one enqueued days ago that used up its retries only now, and `--limit`
/// keeps them rather than the newest-created.
#[tokio::test]
async fn dlq_list_shows_the_most_recently_dead_first() {
    let env = TestEnv::new("[queues.work]\nhandler = { kind = \"rust\", name = \"h\" }\n").await;
    let c = env.store.raw().await.unwrap();
    c.batch_execute(
        "INSERT INTO jobs (id, queue, payload, status, attempts, max_attempts, created_at,
                           completed_at, last_error) VALUES
         ('enqueued-days-ago', 'work', '{}', 'dead', 5, 5, now() - interval '2 days',
          now() - interval '1 minute', 'died a minute ago'),
         ('enqueued-an-hour-ago', 'work', '{}', 'dead', 1, 1, now() - interval '1 hour',
          now() - interval '1 hour', 'died an hour ago'),
         ('enqueued-yesterday', 'work', '{}', 'dead', 3, 3, now() - interval '1 day',
          now() - interval '20 minutes', 'died 20 minutes ago')",
    )
    .await
    .unwrap();
    let ids = |out: &std::process::Output| -> Vec<String> {
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .skip(1)
            .filter_map(|l| l.split_whitespace().next().map(str::to_string))
            .collect()
    };
    let out = env.cli(&["dlq", "list", "--queue", "work"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(
        ids(&out),
        [
            "enqueued-days-ago",
            "enqueued-yesterday",
            "enqueued-an-hour-ago"
        ],
        "{}",
        text(&out)
    );
    let out = env.cli(&["dlq", "list", "--limit", "1"]);
    assert_eq!(ids(&out), ["enqueued-days-ago"], "{}", text(&out));
    let out = env.cli(&["dlq", "list", "--json"]);
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rows[0]["id"], "enqueued-days-ago", "{}", text(&out));
}

#[tokio::test]
async fn dlq_retry_brings_a_dead_job_to_completed_with_its_history() {
    let env = TestEnv::new(
        "[queues.work]\nmax_attempts = 2\nbackoff = { kind = \"fixed\", base = \"50ms\" }\n\
         handler = { kind = \"rust\", name = \"h\" }\n",
    )
    .await;
    let fixed = Arc::new(AtomicBool::new(false));
    let f = fixed.clone();
    let h = from_fn(move |_job| {
        let f = f.clone();
        async move {
            if f.load(Ordering::SeqCst) {
                Ok(None)
            } else {
                Err(JobError::retry("smtp down"))
            }
        }
    });
    let worker = env.worker(&[("h", h)]).await;
    env.publish_raw("work", r#"{"id":"mail-9","payload":{}}"#)
        .await;
    assert!(env.wait_status("mail-9", "dead", 10).await);
    let out = env.cli(&["dlq", "list", "--queue", "work"]);
    assert!(
        text(&out).contains("mail-9") && text(&out).contains("smtp down"),
        "{}",
        text(&out)
    );
    // Bad input: nothing changes.
    let out = env.cli(&["jobs", "retry", "nope"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out).contains("no job with id \"nope\""),
        "{}",
        text(&out)
    );
    let out = env.cli(&["dlq", "retry"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let out = env.cli(&["dlq", "purge", "--older-than", "a while"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains("write it like 30d"), "{}", text(&out));
    assert_eq!(env.status_of("mail-9").await.as_deref(), Some("dead"));

    fixed.store(true, Ordering::SeqCst);
    let out = env.cli(&["dlq", "retry", "mail-9"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(env.wait_status("mail-9", "completed", 10).await);
    assert_eq!(
        outcomes(&env.store, "mail-9").await,
        vec!["retry", "dead", "completed"],
        "history kept"
    );
    // Retrying a job that is not dead is refused.
    let out = env.cli(&["jobs", "retry", "mail-9"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out).contains("is completed, not dead"),
        "{}",
        text(&out)
    );
    // A whole queue's dead letters at once.
    fixed.store(false, Ordering::SeqCst);
    for id in ["bulk-1", "bulk-2"] {
        env.publish_raw("work", format!(r#"{{"id":"{id}","payload":{{}}}}"#))
            .await;
    }
    assert!(env.wait_count("dead", 2, 10).await);
    fixed.store(true, Ordering::SeqCst);
    let out = env.cli(&["dlq", "retry", "--queue", "work", "--all"]);
    assert!(
        text(&out).contains("2 dead job(s) of queue work"),
        "{}",
        text(&out)
    );
    assert!(env.wait_count("completed", 3, 10).await);
    // Purge removes only what is old enough.
    let out = env.cli(&["dlq", "purge", "--older-than", "30d"]);
    assert!(text(&out).contains("deleted 0"), "{}", text(&out));
    worker.shutdown().await;
    // A DELETE of jobs (the pruner's, an operator's own) takes the jobs' attempts
    // along (a trigger since attempts carry no foreign key), and only theirs.
    let attempts = "SELECT count(*) FROM job_attempts WHERE job_id IN ('bulk-1', 'bulk-2')";
    assert!(env.scalar(attempts).await >= 4, "each ran twice");
    let logged = "SELECT count(*) FROM job_attempt_log WHERE job_id IN ('bulk-1', 'bulk-2')";
    assert!(env.scalar(logged).await >= 2, "each died once");
    let others = env
        .scalar("SELECT count(*) FROM job_attempts WHERE job_id NOT LIKE 'bulk-%'")
        .await;
    assert!(others > 0);
    let c = env.store.raw().await.unwrap();
    let n = c
        .execute(
            "DELETE FROM jobs WHERE id IN (SELECT id FROM jobs WHERE id LIKE 'bulk-%' LIMIT 10000)",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(n, 2);
    assert_eq!(env.scalar(attempts).await, 0);
    assert_eq!(env.scalar(logged).await, 0);
    assert_eq!(
        env.scalar("SELECT count(*) FROM job_attempts WHERE job_id NOT LIKE 'bulk-%'")
            .await,
        others
    );
}

#[tokio::test]
async fn cancel_stops_a_job_running_on_another_worker_process_and_keeps_queued_ones_from_running() {
    let app = RecordingApp::start().await;
    let env = TestEnv::new(&format!(
        "heartbeat_every = \"300ms\"\ndead_after = \"2s\"\n\
         [queues.work]\nhandler = {{ kind = \"http\", url = \"{}\" }}\n",
        app.url
    ))
    .await;
    // A delayed job is cancelled before it is due: it never runs.
    let out = env.cli(&["enqueue", "work", "{}", "--id", "later", "--delay", "2s"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = env.cli(&["jobs", "cancel", "later"]);
    assert!(
        text(&out).contains("later cancelled (it was scheduled)"),
        "{}",
        text(&out)
    );
    let _pod = ChildWorker::spawn(&env.config, "pod-a");
    env.publish_raw("work", r#"{"id":"long","payload":{"hold":true}}"#)
        .await;
    assert!(wait_for(Duration::from_secs(20), || async { app.start_count() == 1 }).await);
    let out = env.cli(&["jobs", "cancel", "long"]);
    assert!(
        text(&out).contains("long cancelled (it was processing"),
        "{}",
        text(&out)
    );
    // The owner notices at its next lease check (every 300 ms here) and aborts the request:
    // when the app is later let go, nobody is waiting for that answer any more.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    app.release();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let answered = app.answered.lock().unwrap().clone();
    assert!(
        !answered.iter().any(|(id, _, _)| id == "long"),
        "the cancelled attempt was not stopped: {answered:?}"
    );
    assert_eq!(env.status_of("long").await.as_deref(), Some("cancelled"));
    assert_eq!(env.status_of("later").await.as_deref(), Some("cancelled"));
    assert!(app.starts_of("later").is_empty(), "a cancelled job ran");
    assert_eq!(app.starts_of("long").len(), 1);
    // Cancelling a finished job is refused.
    let out = env.cli(&["jobs", "cancel", "long"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out).contains("a finished job cannot be cancelled"),
        "{}",
        text(&out)
    );
    let out = env.cli(&["jobs", "cancel", "nope"]);
    assert_eq!(out.status.code(), Some(2));
}

#[tokio::test]
async fn a_timed_out_exec_job_leaves_no_process_of_its_tree_alive() {
    let dir = std::env::temp_dir().join(common::testkit::unique_name("pids"));
    std::fs::create_dir_all(&dir).unwrap();
    let script = format!(
        "sh -c 'sleep 300 & echo $! >> {d}/pids; wait' & echo $! >> {d}/pids; sleep 300 & echo $! >> {d}/pids; wait",
        d = dir.display()
    );
    let env = TestEnv::new(&format!(
        "[queues.pdf]\nmax_attempts = 1\ntimeout = \"1s\"\n\
         handler = {{ kind = \"exec\", command = [\"sh\", \"-c\", {script:?}] }}\n"
    ))
    .await;
    let worker = env.worker(&[]).await;
    env.publish_raw("pdf", r#"{"id":"slow","payload":{}}"#)
        .await;
    assert!(env.wait_status("slow", "dead", 20).await);
    let job = env.store.job_get("slow").await.unwrap().unwrap();
    assert!(job.last_error.unwrap().contains("timed out after 1s"));
    let pids: Vec<i32> = std::fs::read_to_string(dir.join("pids"))
        .unwrap()
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    assert_eq!(pids.len(), 3, "children and grandchild recorded");
    for pid in pids {
        let alive = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| !s.contains(") Z "))
            .unwrap_or(false);
        assert!(!alive, "process {pid} of the timed-out job is still alive");
    }
    let _ = std::fs::remove_dir_all(&dir);
    worker.shutdown().await;
}

#[tokio::test]
async fn stats_and_views_agree_with_the_jobs_table() {
    let env = TestEnv::new(
        "[queues.work]\nmax_attempts = 2\nbackoff = { kind = \"fixed\", base = \"50ms\" }\n\
         handler = { kind = \"rust\", name = \"h\" }\n",
    )
    .await;
    let h = common::by_kind();
    let worker = env.worker(&[("h", h)]).await;
    for i in 0..6 {
        let kind = ["ok", "ok", "ok", "flaky", "bad", "ok"][i];
        env.publish_raw(
            "work",
            format!(r#"{{"id":"s{i}","payload":{{"kind":"{kind}"}}}}"#),
        )
        .await;
    }
    assert!(
        wait_for(Duration::from_secs(10), || async {
            env.count("completed").await == 5 && env.count("dead").await == 1
        })
        .await
    );
    worker.shutdown().await;
    let stats = env.store.job_stats().await.unwrap();
    assert_eq!(stats.len(), 1);
    let s = &stats[0];
    assert_eq!((s.queued, s.scheduled, s.processing), (0, 0, 0));
    assert_eq!((s.completed_24h, s.dead_24h), (5, 1));
    // 7 attempts ended: 5 completed, 1 retry, 1 dead.
    assert!((s.retry_rate - 1.0 / 7.0).abs() < 1e-9, "{}", s.retry_rate);
    assert!(s.p50_run_seconds.is_some() && s.p95_run_seconds >= s.p50_run_seconds);
    let c = env.store.raw().await.unwrap();
    let dead: Vec<String> = c
        .query("SELECT id FROM dead_jobs", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(dead, vec!["s4"]);
    // A job left running by a stopped owner shows up as stuck.
    c.batch_execute(
        "INSERT INTO workers (id, hostname, pid, version, stopped_at) VALUES ('gone-1', 'gone', 1, 'x', now());
         INSERT INTO jobs (id, queue, payload, status, max_attempts, worker_id, lease, last_activity_at)
         VALUES ('orphan', 'work', '{}', 'processing', 1, 'gone-1', 1, now())",
    )
    .await
    .unwrap();
    let stuck: Vec<(String, String)> = c
        .query("SELECT id, why FROM stuck_jobs", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        stuck,
        vec![("orphan".to_string(), "owner stopped".to_string())]
    );
    let out = env.cli(&["stats", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["queues"][0]["completed_24h"], 5);
    assert_eq!(v["queues"][0]["processing"], 1);
    assert_eq!(v["unserved"], serde_json::json!([]));
    let out = env.cli(&["stats"]);
    println!("{}", String::from_utf8_lossy(&out.stdout));
    assert!(text(&out).contains("work"), "{}", text(&out));
}

#[tokio::test]
async fn a_job_can_override_its_queues_backoff_and_timeout() {
    // The queue waits 10 s between attempts; these jobs bring their own policy.
    let env = TestEnv::new(
        "[queues.work]\nmax_attempts = 3\ntimeout = \"30s\"\nbackoff = { kind = \"fixed\", base = \"10s\" }\n\
         handler = { kind = \"rust\", name = \"h\" }\n",
    )
    .await;
    let h = from_fn(|job| async move {
        if job.payload["sleep"].as_bool() == Some(true) {
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
        Err(JobError::retry("nope"))
    });
    let worker = env.worker(&[("h", h)]).await;
    env.publish_raw(
        "work",
        r#"{"id":"own","payload":{},"backoff":{"kind":"exponential","base":"200ms"}}"#,
    )
    .await;
    // Through the CLI, stored in PostgreSQL first.
    let out = env.cli(&[
        "enqueue",
        "work",
        "{}",
        "--id",
        "cli-own",
        "--backoff",
        "linear:300ms",
        "--max-attempts",
        "3",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = env.cli(&["enqueue", "work", "{}", "--backoff", "sometimes:1s"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out).contains("unknown backoff kind"),
        "{}",
        text(&out)
    );
    env.publish_raw(
        "work",
        r#"{"id":"quick","payload":{"sleep":true},"timeout_ms":300,"max_attempts":1}"#,
    )
    .await;
    assert!(
        wait_for(Duration::from_secs(15), || async {
            env.count("dead").await == 3
        })
        .await,
        "dead {}",
        env.count("dead").await
    );
    let own = gaps(&env, "own").await;
    assert!(
        own.len() == 2 && own[0] < 0.7 && own[1] >= 0.4 && own[1] < 0.9,
        "{own:?}"
    );
    let cli_own = gaps(&env, "cli-own").await;
    assert!(
        cli_own.len() == 2 && cli_own[0] >= 0.3 && cli_own[1] >= 0.6 && cli_own[1] < 1.1,
        "{cli_own:?}"
    );
    let quick = env.store.job_get("quick").await.unwrap().unwrap();
    assert!(quick.last_error.unwrap().contains("timed out after 300ms"));
    worker.shutdown().await;
}

/// Pause holds across three workers: after `pause_queue()` returns, nothing of the queue
/// starts on any of them (the jobs published meanwhile get no row at all: their messages
/// wait in the stream), a job already running finishes, and after the resume every job runs
/// once, no attempt spent while paused.
#[tokio::test]
async fn a_paused_queue_starts_nothing_on_three_workers_then_runs_everything_once() {
    let env = TestEnv::new(
        "[queues.email]\nconcurrency = 8\nhandler = { kind = \"rust\", name = \"work\" }\n",
    )
    .await;
    let work = from_fn(|job| async move {
        if job.id == "long" {
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        Ok(None)
    });
    let mut workers = Vec::new();
    for _ in 0..3 {
        workers.push(env.worker(&[("work", work.clone())]).await);
    }
    for i in 0..30 {
        env.publish_raw("email", format!(r#"{{"id":"before-{i}","payload":{{}}}}"#))
            .await;
    }
    assert!(env.wait_count("completed", 30, 20).await);
    env.publish_raw("email", r#"{"id":"long","payload":{}}"#)
        .await;
    assert!(env.wait_status("long", "processing", 10).await);
    let since = env
        .store
        .pause_queue("email", "test", Some("incident 42"), false)
        .await
        .unwrap();
    // Ten seconds of publishing while paused.
    let started = std::time::Instant::now();
    let mut i: i64 = 0;
    while started.elapsed() < Duration::from_secs(10) {
        env.publish_raw("email", format!(r#"{{"id":"after-{i}","payload":{{}}}}"#))
            .await;
        i += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let published = i;
    assert_eq!(
        env.scalar("SELECT count(*) FROM jobs WHERE id LIKE 'after-%'")
            .await,
        0,
        "jobs published while paused got rows (started)"
    );
    assert_eq!(
        env.scalar(&format!(
            "SELECT count(*) FROM jobs WHERE started_at > to_timestamp({since}) + interval '50 ms'"
        ))
        .await,
        0,
        "a job started after the pause"
    );
    assert_eq!(env.status_of("long").await.as_deref(), Some("completed"));
    for w in &workers {
        let metrics = reqwest::get(format!("http://{}/metrics", w.ops_addr.unwrap()))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            metrics.contains("jobwarden_queue_paused{queue=\"email\"} 1"),
            "{metrics}"
        );
    }
    let listed = text(&env.cli(&["queues", "list"]));
    assert!(
        listed.contains("email") && listed.contains("by test: incident 42"),
        "{listed}"
    );
    let stats = text(&env.cli(&["stats"]));
    assert!(stats.contains("paused queues"), "{stats}");
    // A job with a row (enqueued through PostgreSQL) says what it waits for.
    env.enqueue_id("email", "with-row", serde_json::json!({}))
        .await
        .unwrap();
    let shown = text(&env.cli(&["jobs", "show", "with-row"]));
    assert!(
        shown.contains("waits for its queue to be resumed: paused"),
        "{shown}"
    );

    let out = env.cli(&["queues", "resume", "email"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        wait_for(Duration::from_secs(30), || async {
            env.scalar("SELECT count(*) FROM jobs WHERE (id LIKE 'after-%' OR id = 'with-row') AND status = 'completed'")
                .await
                == published + 1
        })
        .await,
        "after the resume: {} of {published} completed",
        env.scalar("SELECT count(*) FROM jobs WHERE id LIKE 'after-%' AND status = 'completed'")
            .await
    );
    assert_eq!(
        env.scalar("SELECT count(*) FROM jobs WHERE attempts <> 1")
            .await,
        0,
        "an attempt was spent while paused"
    );
    for w in workers {
        w.shutdown().await;
    }
}

/// Pausing a queue no running worker serves (a typo), a queue name the contract refuses, or
/// resuming a queue that is not paused: an error naming the queue, and nothing changed.
/// `--force` pauses a queue before its workers run.
#[tokio::test]
async fn pausing_a_queue_nobody_serves_or_a_bad_name_is_refused_and_changes_nothing() {
    let env =
        TestEnv::new("[queues.email]\nhandler = { kind = \"rust\", name = \"work\" }\n").await;
    let work = from_fn(|_job| async { Ok(None) });
    let worker = env.worker(&[("work", work)]).await;
    let out = env.cli(&["queues", "pause", "emial"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("no running worker serves queue \"emial\" (served: email)"),
        "{}",
        text(&out)
    );
    let out = env.cli(&["queues", "pause", "e mail"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("\"e mail\""), "{}", text(&out));
    let out = env.cli(&["queues", "resume", "email"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("queue \"email\" is not paused (paused: none)"),
        "{}",
        text(&out)
    );
    let long = "x".repeat(1001);
    let out = env.cli(&["queues", "pause", "email", "--reason", &long]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("its reason at most 1000 (got ") && !text(&out).contains(&long),
        "{}",
        text(&out)
    );
    assert_eq!(env.scalar("SELECT count(*) FROM queue_pauses").await, 0);
    let out = env.cli(&[
        "queues",
        "pause",
        "reports",
        "--force",
        "--reason",
        "not deployed",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        env.scalar("SELECT count(*) FROM queue_pauses WHERE queue = 'reports'")
            .await,
        1
    );
    worker.shutdown().await;
}
