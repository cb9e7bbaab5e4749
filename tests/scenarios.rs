//! The four starting designs, each run end to end as its example does (`examples/<name>/`),
//! against real servers, with the figures the issue asks for asserted.

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
    };
    let r = payments::run(&settings).await.expect("the scenario runs");
    eprintln!("payments_service: {}", serde_json::to_string(&r).unwrap());
    assert_eq!(r.accepted, 15, "{r:?}");
    assert_eq!(
        r.deduplicated, 15,
        "the same keys name the same payments: {r:?}"
    );
    assert_eq!(r.payments, 30, "{r:?}");
    assert_eq!(r.charge_jobs, 30, "one job per payment: {r:?}");
    assert_eq!(r.charged, 30, "every payment charged: {r:?}");
    assert_eq!(
        r.charges, 30,
        "the gateway charged each payment once: {r:?}"
    );
    assert_eq!(r.duplicate_charges, 0, "{r:?}");
    assert!(r.transient_failures >= 1, "{r:?}");
    assert!(
        r.replayed_calls >= r.transient_failures,
        "every charge answered 503 was retried with its key and replayed: {r:?}"
    );
    assert_eq!(r.workers_killed, 2, "{r:?}");
    assert!(
        r.attempts_recovered >= 1,
        "a charge in flight on a killed worker was taken back: {r:?}"
    );
    let _ = std::fs::remove_dir_all(&logs);
}
