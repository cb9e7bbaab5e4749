//! The four starting designs, each run end to end as its example does (`examples/<name>/`),
//! against real servers, with the figures the issue asks for asserted.

// Each scenario module is compiled as its example compiles it, with its own copy of
// examples/common/pod.rs.
#![allow(clippy::duplicate_mod)]

mod common;

#[path = "../examples/payments_service/scenario.rs"]
mod payments;

use common::test_database_url;
use common::testkit::{unique_name, NatsServer};

/// Drops the scenario's schema at the end, even if the test failed.
struct Schema {
    url: String,
    name: String,
}

impl Drop for Schema {
    fn drop(&mut self) {
        let _ = std::process::Command::new("psql")
            .arg(&self.url)
            .args(["-X", "-q", "-c"])
            .arg(format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", self.name))
            .output();
    }
}

fn fresh_schema(prefix: &str) -> Schema {
    Schema {
        url: test_database_url(),
        name: unique_name(prefix),
    }
}

// Several threads, as the example runs: the application and the gateway serve requests while
// the test waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payments_service_charges_every_payment_once_through_retried_bursts_and_killed_workers() {
    common::init_logs();
    let nats = NatsServer::start().expect("nats-server");
    let schema = fresh_schema("pay");
    let logs = std::env::temp_dir().join(&schema.name);
    let settings = payments::Settings {
        jobwarden: env!("CARGO_BIN_EXE_jobwarden").into(),
        database_url: schema.url.clone(),
        nats_url: nats.url(),
        schema: schema.name.clone(),
        burst: 15,
        workers: 3,
        fail_every: 4,
        log_dir: logs.clone(),
        confirm_deadline: std::time::Duration::from_secs(3),
    };
    let r = payments::run(&settings).await.expect("the scenario runs");
    eprintln!("payments_service: {}", serde_json::to_string(&r).unwrap());
    assert_eq!(r.accepted, 15, "{r:?}");
    assert_eq!(
        r.deduplicated, 15,
        "the same keys name the same payments: {r:?}"
    );
    assert_eq!(r.payments, 45, "{r:?}");
    assert_eq!(r.charge_jobs, 45, "one job per payment: {r:?}");
    assert_eq!(r.charged, 45, "every payment charged: {r:?}");
    assert_eq!(
        r.charges, 45,
        "the gateway charged each payment once: {r:?}"
    );
    // 3-D Secure: every confirmation completed its deferred charge job, the lost one after
    // its deadline retried the job, the forged one was refused and recorded, and the jobs
    // awaiting on the killed worker were completed all the same.
    assert_eq!(r.confirmations, 15, "{r:?}");
    assert_eq!(r.confirmed, 15, "{r:?}");
    assert_eq!(r.completed_by_webhook, 15, "{r:?}");
    assert_eq!(r.webhooks_lost, 1, "{r:?}");
    assert!(r.deadline_retries >= 1, "{r:?}");
    assert_eq!(r.forged_refused, 1, "{r:?}");
    assert!(r.refusals_recorded >= 1, "{r:?}");
    assert!(r.awaiting_when_killed >= 1, "{r:?}");
    assert_eq!(r.duplicate_charges, 0, "{r:?}");
    // The gateway's ledger is idempotent: it would hide a charge job run twice. Every call
    // that reached it is counted per job, and each must be a claim jobwarden made, every
    // claim but the last ended by a recorded retry or reclaim.
    assert!(
        r.unexplained_runs.is_empty(),
        "charge jobs ran more often than jobwarden's record explains:\n{}",
        r.unexplained_runs.join("\n")
    );
    assert!(
        r.gateway_calls >= r.charge_jobs as usize,
        "every charge job called the gateway: {r:?}"
    );
    assert!(r.transient_failures >= 1, "{r:?}");
    assert!(
        r.replayed_calls >= r.transient_failures,
        "every charge answered 503 was retried with its key and replayed: {r:?}"
    );
    assert_eq!(r.workers_killed, 3, "{r:?}");
    assert!(
        r.attempts_recovered >= 1,
        "a charge in flight on a killed worker was taken back: {r:?}"
    );
    let _ = std::fs::remove_dir_all(&logs);
}

#[path = "../examples/order_pipeline/scenario.rs"]
mod orders;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_pipeline_retries_only_the_failing_step_and_shows_each_pipeline_in_one_query() {
    common::init_logs();
    let nats = NatsServer::start().expect("nats-server");
    let schema = fresh_schema("ord");
    let settings = orders::Settings {
        database_url: schema.url.clone(),
        nats_url: nats.url(),
        schema: schema.name.clone(),
        orders: 12,
        workers: 2,
        dashboard: true,
    };
    let r = orders::run(&settings).await.expect("the scenario runs");
    eprintln!("order_pipeline: {}", serde_json::to_string(&r).unwrap());
    assert_eq!(r.orders, 12);
    assert_eq!(
        r.completed, 11,
        "every pipeline but the cancelled one: {r:?}"
    );
    assert_eq!(r.emails, 11, "{r:?}");
    assert_eq!(
        r.emails_with_their_invoice, 11,
        "every email got the invoice its PDF step made from its own charge (results passed \
         down the chain): {r:?}"
    );
    assert_eq!(
        r.charges, 12,
        "every order charged once (the cancelled one before its PDF): {r:?}"
    );
    assert_eq!(r.duplicate_charges, 0, "{r:?}");
    // The gateway's ledger is idempotent: every handler call of every step is counted too,
    // each one a claim jobwarden made, every claim but the last ended on record.
    assert!(
        r.unexplained_runs.is_empty(),
        "steps ran more often than jobwarden's record explains:\n{}",
        r.unexplained_runs.join("\n")
    );
    assert_eq!(r.pdf_retried, 3, "orders 4, 8 and 12: {r:?}");
    assert_eq!(
        r.other_steps_rerun, 0,
        "only the failing step ran again: {r:?}"
    );
    assert!(r.declined_dead_without_followers, "{r:?}");
    assert!(r.declined_completed_after_retry, "{r:?}");
    assert_eq!(r.cancelled_jobs, 1, "the running PDF step: {r:?}");
    assert!(!r.cancelled_email_created, "{r:?}");
    let sample: Vec<(&str, &str, &str, i32)> = r
        .sample_pipeline
        .iter()
        .map(|(id, q, st, a)| (id.as_str(), q.as_str(), st.as_str(), *a))
        .collect();
    assert_eq!(
        sample,
        [
            ("order-4", "charge", "completed", 1),
            ("order-4.1", "pdf", "completed", 2),
            ("order-4.1.1", "email", "completed", 1)
        ]
    );
    assert_eq!(r.dashboard_pipeline_rows, 3, "{r:?}");
}

#[path = "../examples/repo_analyzer/scenario.rs"]
mod analyzer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repo_analyzer_keeps_a_reporting_job_and_recovers_killed_pods_in_the_promised_times() {
    common::init_logs();
    let nats = NatsServer::start().expect("nats-server");
    let schema = fresh_schema("ana");
    let logs = std::env::temp_dir().join(&schema.name);
    // stale_after above dead_after: a killed pod's job is the reaper's to take back (with
    // stale_after below it, the stale sweep would be first).
    let dead_after = std::time::Duration::from_secs(2);
    let settings = analyzer::Settings {
        jobwarden: env!("CARGO_BIN_EXE_jobwarden").into(),
        database_url: schema.url.clone(),
        nats_url: nats.url(),
        schema: schema.name.clone(),
        long_job: std::time::Duration::from_secs(12),
        stale_after: std::time::Duration::from_secs(4),
        dead_after,
        log_dir: logs.clone(),
    };
    let r = analyzer::run(&settings).await.expect("the scenario runs");
    eprintln!("repo_analyzer: {}", serde_json::to_string(&r).unwrap());
    assert!(r.all_completed, "{r:?}");
    assert_eq!(
        r.long_job_attempts, 1,
        "three times stale_after, never reclaimed: {r:?}"
    );
    assert_eq!(r.long_job_stale_entries, 0, "{r:?}");
    assert_eq!(r.long_job_stages, ["clone", "count", "report"], "{r:?}");
    assert!(r.long_job_seconds >= 12.0, "{r:?}");
    assert!(
        r.restarted_recovery_seconds < 5.0,
        "restarted under its name: seconds: {r:?}"
    );
    assert!(
        r.restarted_trail.contains(&"restarted".to_string()),
        "{r:?}"
    );
    assert!(
        r.gone_recovery_seconds >= dead_after.as_secs_f64() * 0.9
            && r.gone_recovery_seconds < dead_after.as_secs_f64() + 5.0,
        "pod gone: about dead_after: {r:?}"
    );
    assert!(r.gone_trail.contains(&"owner_dead".to_string()), "{r:?}");
    assert!(r.jobs_show.contains("owner_dead"), "{}", r.jobs_show);
    let _ = std::fs::remove_dir_all(&logs);
}

#[path = "../examples/saas_queue/scenario.rs"]
mod saas;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn saas_queue_keeps_email_under_its_rate_and_resets_overtake_the_marketing_burst() {
    common::init_logs();
    let nats = NatsServer::start().expect("nats-server");
    let schema = fresh_schema("saas");
    let logs = std::env::temp_dir().join(&schema.name);
    // Scaled as the issue allows: 100 per 6 s instead of per minute.
    let settings = saas::Settings {
        jobwarden: env!("CARGO_BIN_EXE_jobwarden").into(),
        database_url: schema.url.clone(),
        nats_url: nats.url(),
        schema: schema.name.clone(),
        marketing: 150,
        resets: 8,
        bounces: 3,
        window: std::time::Duration::from_secs(6),
        pods: 3,
        log_dir: logs.clone(),
    };
    let r = saas::run(&settings).await.expect("the scenario runs");
    eprintln!("saas_queue: {}", serde_json::to_string(&r).unwrap());
    assert_eq!(r.emails_sent, 150 - 3 + 8, "{r:?}");
    assert!(r.max_sends_per_window <= 100, "{r:?}");
    assert!(
        r.max_sends_per_window >= 50,
        "the limit, not something slower, paced it: {r:?}"
    );
    assert_eq!(r.resets_sent, 8, "{r:?}");
    assert_eq!(r.resets_after_backlog, 0, "{r:?}");
    assert!(r.max_concurrent_emails <= 5, "{r:?}");
    assert_eq!(r.dead_emails, 3, "{r:?}");
    assert_eq!(r.dead_alerts, 3, "{r:?}");
    assert_eq!(r.dashboard_dead_rows, 3, "{r:?}");
    assert_eq!(r.pdf_completed, 5, "{r:?}");
    assert_eq!(r.images_completed, 5, "{r:?}");
    assert_eq!(r.webhooks_completed, 7, "{r:?}");
    assert_eq!(r.flaky_webhook_attempts, 3, "{r:?}");
    assert!(r.delayed_webhook_waited_seconds >= 2.0, "{r:?}");
    let _ = std::fs::remove_dir_all(&logs);
}
