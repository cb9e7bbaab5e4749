//! Careless and hostile input, tried as a new user would, against real servers: one message
//! or one SQL call must never stall a worker, double its jobs, or stop a service of every pod
//! (invariants 9, 13 and 14). Each test here is one of the ways in that once did.

mod common;

use common::{wait_for, TestEnv};
use jobwarden::handler::from_fn;
use serde_json::json;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const QUEUE: &str = r#"
[queues.email]
concurrency = 8
max_attempts = 3
handler = { kind = "rust", name = "h" }
"#;

type Runs = Arc<Mutex<HashMap<String, u32>>>;

/// A handler that takes 20 ms and counts its runs per job id.
fn counting() -> (Arc<dyn jobwarden::Handler>, Runs) {
    let runs = Runs::default();
    let r = runs.clone();
    let h = from_fn(move |job| {
        let r = r.clone();
        async move {
            *r.lock().unwrap().entry(job.id.clone()).or_default() += 1;
            tokio::time::sleep(Duration::from_millis(20)).await;
            Ok(None)
        }
    });
    (h, runs)
}

/// Runs `sql` in the test's schema; the server's message when it fails.
async fn sql(env: &TestEnv, sql: &str) -> Result<(), String> {
    let c = env.store.raw().await.unwrap();
    c.batch_execute(&format!(
        "SET search_path TO \"{}\"; {sql}",
        env.config.database.schema
    ))
    .await
    .map_err(|e| {
        e.as_db_error()
            .map(|d| d.message().to_string())
            .unwrap_or_else(|| e.to_string())
    })
}

/// The example of issue 27: a retry time that overflows PostgreSQL's interval made the
/// completer retry its settle in a loop with no pause, and every job of the worker stayed
/// `processing` (then ran again elsewhere). The message is refused at the door now, by name,
/// and the twenty jobs behind it run once each.
#[tokio::test]
async fn a_message_whose_retry_time_overflows_stalls_nothing_and_doubles_nothing() {
    let env = TestEnv::new(QUEUE).await;
    let (h, runs) = counting();
    let worker = env.worker(&[("h", h)]).await;
    let poison = json!({
        "id": "poison", "payload": {}, "timeout_ms": 1,
        "backoff": {"kind": "fixed", "base": "1000000y", "max": "1000000y"}
    });
    env.publish_raw("email", poison.to_string()).await;
    for i in 0..20 {
        let ok = json!({"id": format!("ok-{i}"), "payload": {"n": i}});
        env.publish_raw("email", ok.to_string()).await;
    }
    assert!(
        env.wait_count("completed", 20, 30).await,
        "completed {}, processing {}",
        env.count("completed").await,
        env.count("processing").await
    );
    let reason = env
        .scalar("SELECT count(*) FROM jobs WHERE status = 'dead' AND last_error LIKE '%field `backoff.base` is invalid%'")
        .await;
    assert_eq!(
        reason, 1,
        "the refused message is kept as one dead job, with the reason"
    );
    assert_eq!(env.count("processing").await, 0);
    let runs = runs.lock().unwrap().clone();
    assert_eq!(runs.len(), 20, "{runs:?}");
    assert!(runs.values().all(|n| *n == 1), "{runs:?}");
    worker.shutdown().await;
}

/// `SELECT enqueue('email', '{}', id => E'x\ny')` was accepted, and the scheduler of every
/// pod panicked building the message header: from then on nothing scheduled was published.
/// Such an id is refused at the door now; a row holding one (stored before the contract, or
/// written by hand) is dead-lettered by the scheduler with the reason, once, and the jobs
/// behind it are published.
#[tokio::test]
async fn an_id_no_header_can_carry_is_refused_and_a_stored_one_stops_no_scheduler() {
    let env = TestEnv::new(QUEUE).await;
    let (h, runs) = counting();
    let worker = env.worker(&[("h", h)]).await;
    let refused = sql(&env, "SELECT enqueue('email', '{}', id => E'x\\ny')")
        .await
        .unwrap_err();
    assert!(
        refused.contains("field `id` is invalid: contains U+000A"),
        "{refused}"
    );
    // Rows no worker would accept, written straight into the table.
    sql(
        &env,
        "INSERT INTO jobs (id, queue, payload, status, max_attempts, timeout_ms, scheduled_at) VALUES \
         (E'legacy\\r\\nid', 'email', '{}', 'scheduled', 5, NULL, now()), \
         ('legacy-timeout', 'email', '{}', 'scheduled', 5, 700000000, now()), \
         ('legacy-attempts', 'email', '{}', 'scheduled', 5000, NULL, now())",
    )
    .await
    .unwrap();
    let out = env.cli(&["enqueue", "email", "{}", "--id", "later", "--delay", "1s"]);
    assert!(out.status.success(), "{}", common::text(&out));
    assert!(
        env.wait_status("later", "completed", 20).await,
        "later is {:?}",
        env.status_of("later").await
    );
    for id in ["legacy\r\nid", "legacy-timeout", "legacy-attempts"] {
        assert!(env.wait_status(id, "dead", 10).await, "{id:?}");
    }
    let why = env
        .scalar("SELECT count(*) FROM jobs WHERE status = 'dead' AND (last_error LIKE '%field `id`%' OR last_error LIKE '%field `timeout_ms`%' OR last_error LIKE '%field `max_attempts`%')")
        .await;
    assert_eq!(why, 3, "each dead with its reason");
    // Dead once: no copy of them was published and refused again.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(env.count("dead").await, 3);
    assert_eq!(runs.lock().unwrap().get("later"), Some(&1));
    worker.shutdown().await;
}

/// SQL `enqueue()` accepted ids, timeouts, backoffs, sizes and `then` trees the workers
/// refuse (such a job then looped between `queued` and a fresh dead row every sweep). It
/// refuses them now, by name, and stores nothing.
#[tokio::test]
async fn sql_enqueue_refuses_what_the_workers_refuse() {
    let env = TestEnv::new(QUEUE).await;
    let mut small = env.config.clone();
    small.worker.max_payload_bytes = 4096;
    let (h, _runs) = counting();
    let worker = env.worker_with(small, &[("h", h)]).await;
    let big = "x".repeat(10_000);
    let cases = [
        ("id => '..'", "id"),
        ("id => 'a b'", "id"),
        (&format!("id => '{}'", "é".repeat(101)), "id"),
        ("timeout_ms => 700000000", "timeout_ms"),
        (
            "backoff => '{\"kind\":\"fixed\",\"base\":\"1000000y\"}'",
            "backoff.base",
        ),
        (
            "backoff => '{\"kind\":\"exponential\",\"base\":\"1s\",\"factor\":2}'",
            "backoff.factor",
        ),
        ("priority => 12", "priority"),
        ("max_attempts => 0", "max_attempts"),
        ("idempotency_key => E'k\\u200B'", "idempotency_key"),
        ("run_at => 'infinity'", "run_at_ms"),
        (
            "then_jobs => '[{\"queue\":\"email\",\"payload\":{},\"delay_ms\":1e15}]'",
            "then[1].delay_ms",
        ),
        ("depends_on => ARRAY['a', NULL]", "depends_on[2]"),
    ];
    for (args, field) in cases {
        let call = format!("SELECT enqueue('email', '{{}}', {args})");
        let err = sql(&env, &call).await.unwrap_err();
        assert!(err.contains(&format!("field `{field}`")), "{args}: {err}");
    }
    let err = sql(
        &env,
        &format!("SELECT enqueue('email', '{{\"b\": \"{big}\"}}')"),
    )
    .await
    .unwrap_err();
    assert!(
        err.contains("field `payload` is invalid: is 10009 bytes, over the limit of 4096 bytes"),
        "{err}"
    );
    let mut deep = String::from("{\"queue\":\"email\",\"payload\":{}}");
    for _ in 0..jobwarden::contract::MAX_THEN_DEPTH {
        deep = format!("{{\"queue\":\"email\",\"payload\":{{}},\"then\":[{deep}]}}");
    }
    let err = sql(
        &env,
        &format!("SELECT enqueue('email', '{{}}', then_jobs => '[{deep}]')"),
    )
    .await
    .unwrap_err();
    assert!(
        err.contains(".then` is invalid: nests deeper than"),
        "{err}"
    );
    assert_eq!(
        env.scalar("SELECT count(*) FROM jobs").await,
        0,
        "nothing stored"
    );
    // What it accepts runs.
    sql(&env, "SELECT enqueue('email', '{}', id => 'fine', priority => 2.0::int, backoff => '{\"kind\":\"linear\",\"base\":\"1.5s\"}')")
        .await
        .unwrap();
    assert!(env.wait_status("fine", "completed", 20).await);
    worker.shutdown().await;
}

/// When a cron job's fire was, read from its id (`cron:<name>:<UTC time>`).
const FIRE_AT: &str = "to_timestamp(split_part(id, ':', 3) || ':' || split_part(id, ':', 4) || ':' || split_part(id, ':', 5), 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')";

/// A `missed = "run_once"` schedule after a long downtime ran once per 1,000 missed fires
/// (each tick looked at the next 1,000 and ran the latest of them); it runs once.
#[tokio::test]
async fn a_run_once_schedule_runs_once_after_a_long_downtime() {
    let env = TestEnv::new(QUEUE).await;
    let cfg = jobwarden::cron::CronConfig {
        schedule: "* * * * * *".parse().unwrap(),
        timezone: Default::default(),
        queue: "email".into(),
        payload: json!({}),
        priority: Default::default(),
        missed: jobwarden::cron::Missed::RunOnce,
        expires_in: None,
        key: None,
    };
    let schedule = jobwarden::cron::Schedule::new("tick", &cfg).unwrap();
    // First sight, then two days down.
    env.store.cron_tick(&schedule).await.unwrap();
    sql(
        &env,
        "UPDATE cron_state SET last_fire_at = now() - interval '2 days' WHERE name = 'tick'",
    )
    .await
    .unwrap();
    for _ in 0..5 {
        env.store.cron_tick(&schedule).await.unwrap();
    }
    // Every fire the ticks enqueued: the latest missed one (just before the 30 s after which
    // a fire counts as missed), and the ones on time since; nothing older.
    let old = env
        .scalar(&format!("SELECT count(*) FROM jobs WHERE id LIKE 'cron:tick:%' AND {FIRE_AT} < now() - interval '1 hour'"))
        .await;
    assert_eq!(old, 0, "no run for the earlier missed fires");
    let missed_run = env
        .scalar(&format!("SELECT count(*) FROM jobs WHERE id LIKE 'cron:tick:%' AND {FIRE_AT} < now() - interval '30 seconds'"))
        .await;
    assert!(missed_run >= 1, "the latest missed fire ran once");
    let all = env
        .scalar("SELECT count(*) FROM jobs WHERE id LIKE 'cron:tick:%'")
        .await;
    assert!((31..=40).contains(&all), "{all} fires");
}

/// A message on `jobs.email` whose envelope said `"priority": 0` was stored as priority 0 and
/// delivered behind every priority-5 job (the subject decides the lane). An envelope that
/// names another priority than its subject's is refused now, by name, saying where to
/// publish it, and kept as a dead job that `dlq retry` runs at the priority it named; one
/// that agrees with its subject runs.
#[tokio::test]
async fn an_envelope_priority_is_honoured_or_refused_never_stored_and_ignored() {
    let env = TestEnv::new(QUEUE).await;
    let (h, runs) = counting();
    let worker = env.worker(&[("h", h)]).await;
    let publish = |subject: &'static str, body: serde_json::Value| {
        let js = env.broker.js.clone();
        async move {
            js.publish(subject, body.to_string().into())
                .await
                .unwrap()
                .await
                .unwrap();
        }
    };
    publish(
        "jobs.email",
        json!({"id": "urgent", "payload": {}, "priority": 0}),
    )
    .await;
    publish(
        "jobs.email.3",
        json!({"id": "seven", "payload": {}, "priority": 7}),
    )
    .await;
    publish(
        "jobs.email.0",
        json!({"id": "zero", "payload": {}, "priority": 0}),
    )
    .await;
    publish(
        "jobs.email",
        json!({"id": "five", "payload": {}, "priority": 5}),
    )
    .await;
    publish("jobs.email.2", json!({"id": "two", "payload": {}})).await;
    for id in ["zero", "five", "two"] {
        assert!(env.wait_status(id, "completed", 20).await, "{id}");
    }
    assert_eq!(
        env.scalar("SELECT priority::int8 FROM jobs WHERE id = 'two'")
            .await,
        2,
        "the band is the priority"
    );
    assert!(
        wait_for(Duration::from_secs(10), || async {
            env.count("dead").await == 2
        })
        .await
    );
    assert_eq!(
        env.status_of("urgent").await,
        None,
        "not stored as the job it named"
    );
    let c = env.store.raw().await.unwrap();
    let rows = c
        .query(
            &format!(
                "SELECT id, priority, last_error FROM \"{}\".jobs WHERE status = 'dead' ORDER BY priority",
                env.config.database.schema
            ),
            &[],
        )
        .await
        .unwrap();
    let (id0, p0, why0): (String, i16, String) = (rows[0].get(0), rows[0].get(1), rows[0].get(2));
    assert_eq!(p0, 0);
    assert!(
        why0.contains("names priority 0, but the message was published to jobs.email (priority 5); publish it to jobs.email.0"),
        "{why0}"
    );
    let why7: String = rows[1].get(2);
    assert!(why7.contains("publish it to jobs.email.7"), "{why7}");
    // Retried, it runs, at the priority it named.
    let out = env.cli(&["dlq", "retry", &id0]);
    assert!(out.status.success(), "{}", common::text(&out));
    assert!(env.wait_status(&id0, "completed", 20).await);
    assert_eq!(runs.lock().unwrap().get(&id0), Some(&1));
    assert_eq!(runs.lock().unwrap().get("urgent"), None);
    worker.shutdown().await;
}

/// A write PostgreSQL refuses for one job's data — here a trigger of the operator's that
/// raises for one job — ends that job with a storable reason within a few tries, and never
/// holds up the others. Before, any refusal but a data exception (class 22) was retried as
/// an outage, for ever and without a pause: every job of the worker stayed `processing`.
#[tokio::test]
async fn a_settle_postgres_refuses_for_one_job_ends_that_job_and_holds_up_no_other() {
    let env = TestEnv::new(
        r#"
[queues.email]
concurrency = 8
max_attempts = 3
backoff = { kind = "fixed", base = "50ms" }
handler = { kind = "rust", name = "h" }
"#,
    )
    .await;
    // Refuses the retry of `refused` (its first attempt fails), and every settle of `stuck`.
    sql(
        &env,
        "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
           IF (NEW.id = 'refused' AND NEW.status = 'scheduled' AND OLD.status = 'processing') \
              OR (NEW.id = 'stuck' AND OLD.status = 'processing') THEN \
             RAISE EXCEPTION 'no settling % here', NEW.id; \
           END IF; RETURN NEW; END $$; \
         CREATE TRIGGER refuse BEFORE UPDATE ON jobs FOR EACH ROW EXECUTE FUNCTION refuse();",
    )
    .await
    .unwrap();
    let runs = Runs::default();
    let r = runs.clone();
    let h = from_fn(move |job| {
        let r = r.clone();
        async move {
            *r.lock().unwrap().entry(job.id.clone()).or_default() += 1;
            if job.id == "refused" {
                return Err(jobwarden::handler::JobError::retry("first try fails"));
            }
            Ok(None)
        }
    });
    let worker = env.worker(&[("h", h)]).await;
    for id in ["refused", "stuck"] {
        env.publish_raw("email", json!({"id": id, "payload": {}}).to_string())
            .await;
    }
    for i in 0..20 {
        env.publish_raw(
            "email",
            json!({"id": format!("ok-{i}"), "payload": {}}).to_string(),
        )
        .await;
    }
    assert!(
        env.wait_count("completed", 20, 30).await,
        "completed {}, processing {}",
        env.count("completed").await,
        env.count("processing").await
    );
    assert!(env.wait_status("refused", "dead", 10).await);
    let why = env
        .scalar("SELECT count(*) FROM jobs WHERE id = 'refused' AND last_error LIKE 'PostgreSQL refused to settle this attempt (no settling refused here (SQLSTATE P0001))%'")
        .await;
    assert_eq!(why, 1, "dead with the reason");
    // `stuck` can be settled in no form: left, unacked, for the stale sweep; said once.
    assert!(
        wait_for(Duration::from_secs(10), || async {
            jobwarden::worker::Stats::get(&worker.stats.unsettled) == 1
        })
        .await
    );
    assert_eq!(env.status_of("stuck").await.as_deref(), Some("processing"));
    let runs = runs.lock().unwrap().clone();
    assert!(
        runs.iter()
            .filter(|(id, _)| id.starts_with("ok-"))
            .all(|(_, n)| *n == 1),
        "{runs:?}"
    );
    assert_eq!(
        runs.get("refused"),
        Some(&1),
        "its retry was never scheduled, so it ran once"
    );
    sql(&env, "DROP TRIGGER refuse ON jobs").await.unwrap();
    worker.abort();
}

/// The Rust client is a door like the others: a job the contract refuses is an error naming
/// the field and the value, and nothing is stored or published.
#[tokio::test]
async fn the_rust_client_refuses_a_bad_job_with_the_contracts_error_and_stores_nothing() {
    use jobwarden::client::{Client, EnqueueOptions};
    let env = TestEnv::new("[queues.work]\nhandler = { kind = \"rust\", name = \"h\" }\n").await;
    let client = Client::new(env.store.clone(), env.broker.clone());
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
    assert_eq!(env.scalar("SELECT count(*) FROM jobs").await, 0);
    let (pending, unacked) = env.consumer_backlog("work").await;
    assert_eq!((pending, unacked), (0, 0), "nothing was published");
}
