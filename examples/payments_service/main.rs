//! `cargo run --example payments_service`: the payments service on throwaway servers (its
//! own nats-server and PostgreSQL), three worker processes, a burst of 15 payments, the same
//! burst again, and a burst while workers are killed mid-charge. Prints the figures; exits 1
//! if any payment was charged twice or not at all, or a charge job ran more often than
//! jobwarden's record of retries and reclaims explains. See README.md beside this file.

mod scenario;
#[path = "../common/servers.rs"]
mod shared;
#[path = "../../src/bin/jobwarden/testkit.rs"]
mod testkit;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let servers = shared::Servers::start()?;
    let settings = scenario::Settings {
        jobwarden: shared::jobwarden_binary()?,
        database_url: servers.pg.url(),
        nats_url: servers.nats.url(),
        schema: "payments_example".into(),
        burst: 15,
        workers: 3,
        fail_every: 4,
        log_dir: servers.dir("payments-logs"),
        confirm_deadline: std::time::Duration::from_secs(3),
    };
    let report = scenario::run(&settings).await?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    let ok = report.duplicate_charges == 0
        && report.charged == report.payments as i64
        && report.unexplained_runs.is_empty()
        && report.confirmed == report.confirmations as i64
        && report.forged_refused == 1;
    println!(
        "duplicateCharges = {} for {} payments ({} charged, {} of {} after 3-D Secure, {} \
         webhook lost and retried at its deadline, {} forged webhook refused), {} gateway \
         calls, {} unexplained runs: {}",
        report.duplicate_charges,
        report.payments,
        report.charged,
        report.confirmed,
        report.confirmations,
        report.webhooks_lost,
        report.forged_refused,
        report.gateway_calls,
        report.unexplained_runs.len(),
        if ok { "OK" } else { "FAILED" }
    );
    std::process::exit(if ok { 0 } else { 1 });
}
