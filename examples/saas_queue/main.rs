//! `cargo run --example saas_queue`: the SaaS task queue on throwaway servers with three
//! worker processes: a burst of marketing email (priority 8) through an SMTP server limited
//! to 100 sends a minute, password resets (priority 0) overtaking it, bounces dead-lettered
//! and announced, and PDFs, webhooks (a flaky one, a delayed one) and images beside.
//! Defaults are scaled so it runs in about a minute: 300 marketing emails and a 10-second
//! window. `-- --full` runs the figures: 10,000 emails, 100 per minute (about
//! 100 minutes). See README.md beside this file.

mod scenario;
#[path = "../common/servers.rs"]
mod shared;
#[path = "../../src/bin/jobwarden/testkit.rs"]
mod testkit;

use std::time::Duration;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let full = std::env::args().any(|a| a == "--full");
    let servers = shared::Servers::start()?;
    let settings = scenario::Settings {
        jobwarden: shared::jobwarden_binary()?,
        database_url: servers.pg.url(),
        nats_url: servers.nats.url(),
        schema: "saas_example".into(),
        marketing: if full { 10_000 } else { 300 },
        resets: if full { 50 } else { 12 },
        bounces: 3,
        window: Duration::from_secs(if full { 60 } else { 10 }),
        pods: 3,
        log_dir: servers.dir("saas-logs"),
    };
    let report = scenario::run(&settings).await?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    let ok = report.max_sends_per_window <= 100
        && report.resets_after_backlog == 0
        && report.max_concurrent_emails <= 5
        && report.dead_alerts == settings.bounces;
    println!(
        "{} emails sent, at most {} in any {} s; {} password resets, none after the marketing \
         backlog drained ({} late), slowest {:.1} s; {} bounces dead-lettered and announced: {}",
        report.emails_sent,
        report.max_sends_per_window,
        report.window_seconds,
        report.resets_sent,
        report.resets_after_backlog,
        report.slowest_reset_seconds,
        report.dead_alerts,
        if ok { "OK" } else { "FAILED" }
    );
    std::process::exit(if ok { 0 } else { 1 });
}
