//! `cargo run --example repo_analyzer`: long analysis jobs with stages on throwaway servers
//! and three worker processes; a 45-second job with stale_after 15 s, a pod killed and
//! restarted under its name, a pod killed for good. Prints the recovery times and each
//! job's trail. Pass `-- --long 600` for the 10-minute job. See README.md beside this file.

mod scenario;
#[path = "../common/servers.rs"]
mod shared;
#[path = "../../src/bin/jobwarden/testkit.rs"]
mod testkit;

use std::time::Duration;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let long = args
        .iter()
        .position(|a| a == "--long")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(45u64);
    let servers = shared::Servers::start()?;
    let settings = scenario::Settings {
        jobwarden: shared::jobwarden_binary()?,
        database_url: servers.pg.url(),
        nats_url: servers.nats.url(),
        schema: "analyzer_example".into(),
        long_job: Duration::from_secs(long),
        stale_after: Duration::from_secs(15),
        dead_after: Duration::from_secs(8),
        log_dir: servers.dir("analyzer-logs"),
    };
    let report = scenario::run(&settings).await?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    println!("jobwarden jobs show repo-gone:\n{}", report.jobs_show);
    let ok = report.all_completed
        && report.long_job_attempts == 1
        && report.long_job_stale_entries == 0
        && report.restarted_recovery_seconds < 10.0
        && report.gone_recovery_seconds < report.dead_after_seconds + 10.0;
    println!(
        "{long} s job with stale_after 15 s: {} attempt(s), never reclaimed; pod restarted: \
         job running again after {:.1} s; pod gone: after {:.1} s (dead_after {} s): {}",
        report.long_job_attempts,
        report.restarted_recovery_seconds,
        report.gone_recovery_seconds,
        report.dead_after_seconds,
        if ok { "OK" } else { "FAILED" }
    );
    std::process::exit(if ok { 0 } else { 1 });
}
