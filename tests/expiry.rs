//! Job expiry against real servers (issue 30, part 5): a job not started by its expiry
//! never runs — it ends `cancelled` with `expired: not started by <instant>` — whichever
//! door it came in by; a running job past its instant finishes; bad values are refused at
//! every door, naming the field, with nothing enqueued.

mod common;

use common::{recording, text, wait_for, TestEnv};
use jobwarden::client::{Client, ClientError, EnqueueOptions};
use std::time::Duration;

const EMAIL: &str =
    "[queues.email]\nconcurrency = 4\nhandler = { kind = \"rust\", name = \"work\" }\n";

async fn last_error(env: &TestEnv, id: &str) -> Option<String> {
    let c = env.store.raw().await.unwrap();
    c.query_opt("SELECT last_error FROM jobs WHERE id = $1", &[&id])
        .await
        .unwrap()
        .and_then(|r| r.get(0))
}

/// Asserts job `id` ended expired: cancelled, the reason, never started.
async fn assert_expired(env: &TestEnv, id: &str) {
    assert_eq!(
        env.status_of(id).await.as_deref(),
        Some("cancelled"),
        "{id}"
    );
    let reason = last_error(env, id).await.unwrap_or_default();
    assert!(
        reason.starts_with("expired: not started by 20"),
        "{id}: {reason}"
    );
    assert_eq!(
        env.scalar(&format!(
            "SELECT count(*) FROM jobs WHERE id = '{id}' AND (started_at IS NOT NULL OR attempts <> 0)"
        ))
        .await,
        0,
        "{id} was started"
    );
}

/// Messages that expire while their queue is paused (they wait in the stream, no row yet):
/// at the resume the claim ends them instead of starting them — the handler never sees them,
/// their messages are acked (not redelivered), and the other jobs of the same batch run.
/// One of them has an expiry still ahead and runs.
#[tokio::test]
async fn a_message_that_expires_while_it_waits_never_starts_and_its_batch_runs() {
    let env = TestEnv::new(EMAIL).await;
    let (work, seen) = recording();
    let w = env.worker(&[("work", work)]).await;
    env.store
        .pause_queue("email", "test", Some("expiry test"), false)
        .await
        .unwrap();
    let past_ms = (std::time::SystemTime::now() - Duration::from_secs(60))
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    env.publish_raw(
        "email",
        r#"{"id":"late-in","payload":{},"expires_in":"1s"}"#,
    )
    .await;
    env.publish_raw(
        "email",
        format!(r#"{{"id":"late-at","payload":{{}},"expires_at_ms":{past_ms}}}"#),
    )
    .await;
    env.publish_raw("email", r#"{"id":"ahead","payload":{},"expires_in":"1h"}"#)
        .await;
    for i in 0..5 {
        env.publish_raw("email", format!(r#"{{"id":"plain-{i}","payload":{{}}}}"#))
            .await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        env.scalar("SELECT count(*) FROM jobs").await,
        0,
        "rows while paused"
    );
    env.store.resume_queue("email").await.unwrap();
    assert!(env.wait_count("completed", 6, 20).await);
    assert!(env.wait_status("late-in", "cancelled", 10).await);
    assert!(env.wait_status("late-at", "cancelled", 10).await);
    assert_expired(&env, "late-in").await;
    assert_expired(&env, "late-at").await;
    assert_eq!(env.status_of("ahead").await.as_deref(), Some("completed"));
    env.wait_consumer_drained("email").await;
    // Given the time to redeliver, nothing comes back.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let seen = seen.lock().unwrap().clone();
    assert!(
        !seen.iter().any(|id| id.starts_with("late-")),
        "the handler saw an expired job: {seen:?}"
    );
    assert_eq!(seen.len(), 6, "{seen:?}");
    let m = common::metrics(&w).await;
    assert!(
        m.contains("jobwarden_jobs_expired_total{queue=\"email\"} 2"),
        "{m}"
    );
    // The operator sees why.
    let shown = text(&env.cli(&["jobs", "show", "late-in"]));
    assert!(shown.contains("expired: not started by"), "{shown}");
    let listed = text(&env.cli(&["jobs", "list", "--status", "cancelled"]));
    assert!(
        listed.contains("late-in") && listed.contains("expired"),
        "{listed}"
    );
    w.shutdown().await;
}

/// A job already in PostgreSQL whose message comes after its expiry (enqueued through SQL
/// while the queue is paused: the scheduler publishes it, the claim finds it expired) is
/// ended by the claim statement, not started.
#[tokio::test]
async fn a_row_past_its_expiry_is_ended_by_the_claim_not_started() {
    let env = TestEnv::new(EMAIL).await;
    let (work, seen) = recording();
    let w = env.worker(&[("work", work)]).await;
    env.store
        .pause_queue("email", "test", None, false)
        .await
        .unwrap();
    let c = env.store.raw().await.unwrap();
    c.execute(
        "SELECT enqueue('email', '{}', id => 'row-late', expires_in => '1s')",
        &[],
    )
    .await
    .unwrap();
    c.execute("SELECT enqueue('email', '{}', id => 'row-ok')", &[])
        .await
        .unwrap();
    // Published meanwhile (the scheduler publishes due rows of a paused queue; the claims
    // hand them back).
    assert!(env.wait_status("row-late", "queued", 10).await);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    env.store.resume_queue("email").await.unwrap();
    assert!(env.wait_status("row-ok", "completed", 20).await);
    assert!(env.wait_status("row-late", "cancelled", 10).await);
    assert_expired(&env, "row-late").await;
    assert!(!seen.lock().unwrap().contains(&"row-late".to_string()));
    env.wait_consumer_drained("email").await;
    w.shutdown().await;
}

/// Jobs with no message on its way (scheduled far ahead) end when their expiry passes, by
/// the scheduler's round; an expiry already past at the enqueue is accepted and ends the
/// job at once. Through the SQL function and the Rust client (and its outbox form).
#[tokio::test]
async fn the_schedulers_round_ends_expired_jobs_whose_message_is_not_on_its_way() {
    let env = TestEnv::new(EMAIL).await;
    let (work, seen) = recording();
    let w = env.worker(&[("work", work)]).await;
    let c = env.store.raw().await.unwrap();
    c.execute(
        "SELECT enqueue('email', '{}', id => 'sql-in', run_at => now() + interval '1 hour', \
         expires_in => '1s')",
        &[],
    )
    .await
    .unwrap();
    c.execute(
        "SELECT enqueue('email', '{}', id => 'sql-past', expires_at => now() - interval '1 minute')",
        &[],
    )
    .await
    .unwrap();
    let client = Client::new(env.store.clone(), env.broker.clone());
    client
        .enqueue(
            "email",
            serde_json::json!({}),
            EnqueueOptions {
                id: Some("client-in".into()),
                delay: Some(Duration::from_secs(3600)),
                expires_in: Some(Duration::from_secs(1)),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let mut conn = env.store.raw().await.unwrap();
    let tx = conn.transaction().await.unwrap();
    client
        .enqueue_in(
            &*tx,
            "email",
            serde_json::json!({}),
            EnqueueOptions {
                id: Some("outbox-at".into()),
                delay: Some(Duration::from_secs(3600)),
                expires_at: Some(std::time::SystemTime::now() + Duration::from_secs(1)),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();
    for id in ["sql-in", "sql-past", "client-in", "outbox-at"] {
        assert!(env.wait_status(id, "cancelled", 10).await, "{id}");
        assert_expired(&env, id).await;
    }
    assert!(seen.lock().unwrap().is_empty());
    let m = common::metrics(&w).await;
    assert!(
        m.contains("jobwarden_jobs_expired_total{queue=\"email\"} 4"),
        "{m}"
    );
    w.shutdown().await;
}

/// A retry whose backoff passes the job's expiry ends expired and does not run again; a job
/// running when its instant passes finishes normally.
#[tokio::test]
async fn a_retry_past_the_expiry_ends_expired_and_a_running_job_finishes() {
    let env = TestEnv::new(
        "[queues.email]\nconcurrency = 4\nhandler = { kind = \"rust\", name = \"work\" }\n\
         backoff = { kind = \"fixed\", base = \"4s\" }\n",
    )
    .await;
    let (work, seen) = recording();
    let w = env.worker(&[("work", work)]).await;
    env.publish_raw("email", r#"{"id":"fail-1","payload":{},"expires_in":"2s"}"#)
        .await;
    env.publish_raw(
        "email",
        r#"{"id":"slow-1","payload":{},"expires_in":"500ms"}"#,
    )
    .await;
    assert!(env.wait_status("slow-1", "completed", 10).await);
    assert!(env.wait_status("fail-1", "cancelled", 10).await);
    let reason = last_error(&env, "fail-1").await.unwrap_or_default();
    assert!(reason.starts_with("expired: not started by"), "{reason}");
    assert_eq!(
        env.scalar("SELECT attempts::int8 FROM jobs WHERE id = 'fail-1'")
            .await,
        1
    );
    // Past the retry's due time: it never ran again.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let runs = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|id| *id == "fail-1")
        .count();
    assert_eq!(runs, 1, "the retry ran");
    assert_eq!(env.status_of("fail-1").await.as_deref(), Some("cancelled"));
    w.shutdown().await;
}

/// The queue's `expire_after` applies to jobs that carry no expiry: a message (counted from
/// when the stream stored it) and a row enqueued through SQL (from its creation, at the
/// claim). A job's own expiry wins over the default.
#[tokio::test]
async fn a_queues_expire_after_applies_to_jobs_without_their_own() {
    let env = TestEnv::new(&format!("{EMAIL}expire_after = \"1s\"\n")).await;
    let (work, seen) = recording();
    let w = env.worker(&[("work", work)]).await;
    env.store
        .pause_queue("email", "test", None, false)
        .await
        .unwrap();
    env.publish_raw("email", r#"{"id":"msg-default","payload":{}}"#)
        .await;
    env.publish_raw(
        "email",
        r#"{"id":"msg-own","payload":{},"expires_in":"1h"}"#,
    )
    .await;
    env.store
        .raw()
        .await
        .unwrap()
        .execute("SELECT enqueue('email', '{}', id => 'row-default')", &[])
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    env.store.resume_queue("email").await.unwrap();
    assert!(env.wait_status("msg-own", "completed", 20).await);
    for id in ["msg-default", "row-default"] {
        assert!(env.wait_status(id, "cancelled", 10).await, "{id}");
        assert_expired(&env, id).await;
    }
    assert_eq!(*seen.lock().unwrap(), vec!["msg-own".to_string()]);
    w.shutdown().await;
}

/// Bad values at every door: an error naming the field and the right form, and nothing
/// enqueued (a message's is recorded as a dead job with that reason, never run).
#[tokio::test]
async fn bad_expiry_values_are_refused_at_every_door_naming_the_field() {
    let env = TestEnv::new(EMAIL).await;
    let c = env.store.raw().await.unwrap();
    // SQL.
    for (call, field, words) in [
        (
            "SELECT enqueue('email', '{}', id => 'x1', expires_in => 'soon')",
            "expires_in",
            "is not a duration",
        ),
        (
            "SELECT enqueue('email', '{}', id => 'x2', expires_in => '1h', expires_at => now())",
            "expires_in",
            "give one of them",
        ),
        (
            "SELECT enqueue('email', '{}', id => 'x3', expires_in => '0s')",
            "expires_in",
            "under a millisecond",
        ),
        (
            "SELECT enqueue('email', '{}', id => 'x4', expires_in => '20y')",
            "expires_in",
            "the longest delay",
        ),
        (
            "SELECT enqueue('email', '{}', id => 'x5', expires_at => 'infinity')",
            "expires_at_ms",
            "is not a time",
        ),
    ] {
        let e = c.execute(call, &[]).await.unwrap_err();
        let msg = e.as_db_error().map(|d| d.message().to_string()).unwrap();
        assert!(
            msg.contains(&format!("`{field}`")) && msg.contains(words),
            "{call}: {msg}"
        );
    }
    // The Rust client (and so the outbox and the CLI).
    let client = Client::new(env.store.clone(), env.broker.clone());
    let e = client
        .enqueue(
            "email",
            serde_json::json!({}),
            EnqueueOptions {
                id: Some("x6".into()),
                expires_in: Some(Duration::from_secs(60)),
                expires_at: Some(std::time::SystemTime::now()),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&e, ClientError::Refused(r) if r.field() == "expires_in"),
        "{e}"
    );
    let e = client
        .enqueue(
            "email",
            serde_json::json!({}),
            EnqueueOptions {
                id: Some("x7".into()),
                expires_in: Some(Duration::from_nanos(10)),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert!(e.to_string().contains("`expires_in`"), "{e}");
    let out = env.cli(&[
        "enqueue",
        "email",
        "{}",
        "--id",
        "x8",
        "--expires-at",
        "tomorrow",
    ]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("--expires-at") && text(&out).contains("RFC 3339"),
        "{}",
        text(&out)
    );
    assert_eq!(
        env.scalar("SELECT count(*) FROM jobs").await,
        0,
        "a refused job was stored"
    );
    // A message: recorded dead with the reason, never run.
    let (work, seen) = recording();
    let w = env.worker(&[("work", work)]).await;
    env.publish_raw(
        "email",
        r#"{"id":"m1","payload":{},"expires_in":"1h","expires_at_ms":1}"#,
    )
    .await;
    env.publish_raw("email", r#"{"id":"m2","payload":{},"expires_in":5}"#)
        .await;
    assert!(
        wait_for(Duration::from_secs(10), || async {
            env.scalar("SELECT count(*) FROM jobs WHERE status = 'dead'")
                .await
                == 2
        })
        .await
    );
    let errors = env
        .strings("SELECT last_error FROM jobs WHERE status = 'dead' ORDER BY last_error")
        .await;
    assert!(
        errors.iter().all(|e| e.contains("`expires_in`")),
        "{errors:?}"
    );
    assert!(seen.lock().unwrap().is_empty());
    w.shutdown().await;
}

/// The CLI's `--expires-in` stores the expiry; `jobs show` says when the job expires.
#[tokio::test]
async fn the_cli_enqueues_with_an_expiry_and_jobs_show_says_when() {
    let env = TestEnv::new(EMAIL).await;
    let out = env.cli(&[
        "enqueue",
        "email",
        "{}",
        "--id",
        "cli-1",
        "--delay",
        "1h",
        "--expires-in",
        "30m",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        env.scalar(
            "SELECT round(extract(epoch FROM expires_at - created_at))::int8 FROM jobs \
             WHERE id = 'cli-1'"
        )
        .await,
        1800
    );
    let shown = text(&env.cli(&["jobs", "show", "cli-1"]));
    assert!(shown.contains("expires"), "{shown}");
}

/// A cron schedule's `expires_in` is resolved per fire: each fire's job expires that long
/// after the fire's own time. A missed fire run late (run_once, after a downtime) is past
/// its expiry already and ends expired without running; fires on time carry their expiry.
/// A bad `expires_in` is refused when the configuration loads, naming the setting.
#[tokio::test]
async fn a_cron_fire_expires_its_expires_in_after_its_own_time() {
    let env = TestEnv::new(EMAIL).await;
    let cfg = jobwarden::cron::CronConfig {
        schedule: "* * * * * *".parse().unwrap(),
        timezone: Default::default(),
        queue: "email".into(),
        payload: serde_json::json!({}),
        priority: Default::default(),
        missed: jobwarden::cron::Missed::RunOnce,
        expires_in: Some(Duration::from_secs(10)),
        key: None,
    };
    let schedule = jobwarden::cron::Schedule::new("tick", &cfg).unwrap();
    env.store.cron_tick(&schedule).await.unwrap();
    env.store
        .raw()
        .await
        .unwrap()
        .execute(
            "UPDATE cron_state SET last_fire_at = now() - interval '1 hour' WHERE name = 'tick'",
            &[],
        )
        .await
        .unwrap();
    env.store.cron_tick(&schedule).await.unwrap();
    let fires = env
        .scalar("SELECT count(*) FROM jobs WHERE id LIKE 'cron:tick:%'")
        .await;
    assert!(fires >= 2, "{fires} fires");
    // Every fire expires 10 s after its own time (the time its id names, in whole seconds).
    let fire_at = "to_timestamp(split_part(id, ':', 3) || ':' || split_part(id, ':', 4) || ':' \
                   || split_part(id, ':', 5), 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')";
    assert_eq!(
        env.scalar(&format!(
            "SELECT count(*) FROM jobs WHERE id LIKE 'cron:tick:%' \
             AND NOT (expires_at - {fire_at} >= interval '10 seconds' \
                      AND expires_at - {fire_at} < interval '11 seconds')"
        ))
        .await,
        0
    );
    let (work, seen) = recording();
    let w = env.worker(&[("work", work)]).await;
    // The missed fire (over 30 s old) is past its 10 s: it ends expired, never run.
    let missed: String = env
        .store
        .raw()
        .await
        .unwrap()
        .query_one(
            "SELECT id FROM jobs WHERE id LIKE 'cron:tick:%' \
             AND expires_at < now() - interval '15 seconds' ORDER BY id LIMIT 1",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(env.wait_status(&missed, "cancelled", 10).await);
    assert_expired(&env, &missed).await;
    assert!(!seen.lock().unwrap().contains(&missed));
    w.shutdown().await;

    let bad = jobwarden::config::Config::from_toml(&format!(
        "{EMAIL}[cron.t]\nschedule = \"* * * * *\"\nqueue = \"email\"\nexpires_in = \"11y\"\n"
    ))
    .map(|_| ())
    .unwrap_err()
    .to_string();
    assert!(
        bad.contains("cron.t.expires_in") && bad.contains("the longest delay"),
        "{bad}"
    );
}

/// A `then` job's `expires_in` counts from its creation (when its parent completed): a
/// chained job delayed past it ends expired, never run. A `then` spec takes no instant
/// (`expires_at_ms`): refused, naming the field, nothing enqueued.
#[tokio::test]
async fn a_then_jobs_expiry_counts_from_its_creation() {
    let env = TestEnv::new(EMAIL).await;
    let (work, seen) = recording();
    let w = env.worker(&[("work", work)]).await;
    let c = env.store.raw().await.unwrap();
    c.execute(
        "SELECT enqueue('email', '{}', id => 'parent', then_jobs => \
         '[{\"queue\":\"email\",\"payload\":{},\"id\":\"child\",\"delay_ms\":3600000,\"expires_in\":\"1s\"}]')",
        &[],
    )
    .await
    .unwrap();
    assert!(env.wait_status("parent", "completed", 10).await);
    assert!(env.wait_status("child", "cancelled", 10).await);
    assert_expired(&env, "child").await;
    assert_eq!(
        env.scalar(
            "SELECT round(extract(epoch FROM c.expires_at - p.completed_at))::int8 \
             FROM jobs c, jobs p WHERE c.id = 'child' AND p.id = 'parent'"
        )
        .await,
        1
    );
    assert_eq!(*seen.lock().unwrap(), vec!["parent".to_string()]);
    let e = c
        .execute(
            "SELECT enqueue('email', '{}', id => 'p2', then_jobs => \
             '[{\"queue\":\"email\",\"payload\":{},\"expires_at_ms\":1}]')",
            &[],
        )
        .await
        .unwrap_err();
    let msg = e.as_db_error().unwrap().message().to_string();
    assert!(msg.contains("`then[1].expires_at_ms`"), "{msg}");
    assert_eq!(env.status_of("p2").await, None);
    w.shutdown().await;
}
