//! `cargo run --example order_pipeline`: 12 orders, each `charge → invoice PDF → email`,
//! on throwaway servers with two workers; one card declined (then fixed and retried), one
//! pipeline cancelled mid-way, a PDF step that crashes once on every 4th order. Prints the
//! figures and one pipeline as SQL and the dashboard show it.
//! Exits 1 if any order was charged twice. See README.md beside this file.

mod scenario;
#[path = "../common/servers.rs"]
mod shared;
#[path = "../../src/bin/jobwarden/testkit.rs"]
mod testkit;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let servers = shared::Servers::start()?;
    let settings = scenario::Settings {
        database_url: servers.pg.url(),
        nats_url: servers.nats.url(),
        schema: "orders_example".into(),
        orders: 12,
        workers: 2,
        dashboard: true,
    };
    let report = scenario::run(&settings).await?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    println!("\nSELECT id, queue, status, attempts FROM jobs WHERE pipeline = 'order-4':");
    for (id, queue, status, attempts) in &report.sample_pipeline {
        println!("  {id:<12} {queue:<6} {status:<10} {attempts}");
    }
    let ok = report.duplicate_charges == 0
        && report.other_steps_rerun == 0
        && report.emails_with_their_invoice == report.emails
        && report.unexplained_runs.is_empty();
    println!(
        "\n{} orders: {} pipelines completed, {} charges ({} duplicate), {} PDF steps retried \
         alone, {} of {} emails with the invoice their PDF step made from their charge, {} \
         handler calls ({} unexplained): {}",
        report.orders,
        report.completed,
        report.charges,
        report.duplicate_charges,
        report.pdf_retried,
        report.emails_with_their_invoice,
        report.emails,
        report.handler_calls,
        report.unexplained_runs.len(),
        if ok { "OK" } else { "FAILED" }
    );
    std::process::exit(if ok { 0 } else { 1 });
}
