//! The course queue's capstone: an order pipeline, `charge → invoice PDF → email`, chained.
//!
//! Each order is written with its whole pipeline in one transaction (SQL `enqueue()` with
//! `then_jobs`): the charge job, and the PDF and email jobs it creates when it completes.
//! Every step is a job of its own, with its queue's concurrency, timeout and retries, so a
//! failure in the middle (the PDF renderer crashes on some orders) retries only that step:
//! the card is charged once, the email sent once. The charge step gives the gateway the
//! job id as its idempotency key (the attempt goes along for the audit trail). A declined
//! charge ends the pipeline dead; retrying it from the dead-letter queue resumes it. A
//! cancelled pipeline runs nothing more. Results flow down the chain: the PDF step makes the
//! invoice number from the charge step's result (the charge id), and the email step reads it
//! from the PDF step's result (`JobContext::parents`). Each pipeline's state is one SQL query
//! (`WHERE pipeline = 'order-7'`), `jobwarden jobs pipeline order-7`, and one dashboard view
//! (`/pipeline?id=order-7`).
//!
//! The gateway's ledger is idempotent, so it would hide a step run twice: every handler call
//! is also counted per job and checked against jobwarden's record of claims, retries and
//! reclaims (`Report::unexplained_runs`, see examples/common/runs.rs).
//!
//! Used by `cargo run --example order_pipeline` and `tests/scenarios.rs`.

#[path = "../common/runs.rs"]
mod runs;

use jobwarden::config::Config;
use jobwarden::handler::{from_fn, JobError};
use jobwarden::store::Store;
use jobwarden::worker::{RunningWorker, Worker};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

pub struct Settings {
    pub database_url: String,
    pub nats_url: String,
    pub schema: String,
    /// Orders placed (one of them is declined, one cancelled mid-pipeline).
    pub orders: usize,
    /// Worker processes' worth of in-process workers.
    pub workers: usize,
    /// Serve the dashboard (on a free local port) from the first worker.
    pub dashboard: bool,
}

#[derive(Debug, Default, serde::Serialize)]
pub struct Report {
    pub orders: usize,
    /// Pipelines whose email was sent.
    pub completed: usize,
    /// Charges the gateway made, and orders charged more than once (must be 0).
    pub charges: usize,
    pub duplicate_charges: usize,
    /// Charge handler runs (a replayed call is a run but not a charge).
    pub charge_runs: usize,
    /// Orders whose PDF step failed once and ran again.
    pub pdf_retried: usize,
    /// Of those, orders whose charge or email ran more than once (must be 0).
    pub other_steps_rerun: usize,
    pub emails: usize,
    /// Emails that carried the invoice number the PDF step made from their order's own
    /// charge (both passed down the chain as results): must be every email sent.
    pub emails_with_their_invoice: usize,
    /// The declined order: dead at the charge, no PDF or email job created; after the card
    /// was fixed and the job retried from the dead-letter queue, completed.
    pub declined_dead_without_followers: bool,
    pub declined_completed_after_retry: bool,
    /// The cancelled order: its jobs cancelled, its email never created or sent.
    pub cancelled_jobs: usize,
    pub cancelled_email_created: bool,
    /// One retried order's pipeline, as the SQL query returns it: (id, queue, status, attempts).
    pub sample_pipeline: Vec<(String, String, String, i32)>,
    pub dashboard: Option<String>,
    /// Rows of that pipeline in the dashboard's pipeline view (`/pipeline?id=order-4`).
    pub dashboard_pipeline_rows: usize,
    /// Handler calls of every step, per job.
    pub handler_calls: usize,
    /// Jobs whose handler calls jobwarden's record does not explain (must be empty).
    pub unexplained_runs: Vec<String>,
    pub seconds: f64,
}

#[derive(Default)]
struct World {
    /// Gateway: idempotency key → charge id; charges made per order.
    by_key: HashMap<String, String>,
    charges: HashMap<i64, usize>,
    charge_runs: usize,
    pdf_runs: HashMap<i64, usize>,
    email_runs: HashMap<i64, usize>,
    /// The invoice number each order's email was given (from the PDF step's result).
    email_invoices: HashMap<i64, String>,
    charge_runs_by_order: HashMap<i64, usize>,
    /// Every handler call of every step, per job id.
    calls: HashMap<String, usize>,
}

/// Counts one handler call of `job`.
fn called(w: &Mutex<World>, job: &jobwarden::handler::JobContext) {
    *w.lock().unwrap().calls.entry(job.id.clone()).or_default() += 1;
}

const QUEUES: &str = r#"
[queues.charge]
concurrency = 4
max_attempts = 3
timeout = "30s"
backoff = { kind = "fixed", base = "100ms" }
handler = { kind = "rust", name = "charge" }

[queues.pdf]
concurrency = 3
max_attempts = 2
timeout = "2m"
backoff = { kind = "fixed", base = "200ms" }
handler = { kind = "rust", name = "pdf" }

[queues.email]
concurrency = 5
max_attempts = 3
timeout = "30s"
backoff = { kind = "exponential", base = "1s" }
handler = { kind = "rust", name = "email" }
"#;

/// The order whose card is declined, and the one cancelled mid-pipeline.
pub const DECLINED: i64 = 3;
pub const CANCELLED: i64 = 5;

fn order_of(job: &Value) -> i64 {
    job["order"].as_i64().unwrap_or(-1)
}

pub async fn run(s: &Settings) -> anyhow::Result<Report> {
    let started = Instant::now();
    let config = Config::from_toml(&format!(
        "[database]\nurl = {:?}\nschema = {:?}\n[nats]\nurl = {:?}\n\
         [worker]\napi_listen = \"127.0.0.1:0\"\nops_listen = \"off\"\nscheduler_every = \"100ms\"\n\
         {QUEUES}",
        s.database_url, s.schema, s.nats_url
    ))
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    let store = Store::connect(&config.database).await?;
    store.migrate().await?;
    store
        .raw()
        .await?
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS orders (
                 id integer PRIMARY KEY, amount_cents integer NOT NULL,
                 created_at timestamptz NOT NULL DEFAULT now())",
        )
        .await?;

    let world = Arc::new(Mutex::new(World::default()));
    let card_fixed = Arc::new(AtomicBool::new(false));
    let w = world.clone();
    let fixed = card_fixed.clone();
    let charge = from_fn(move |job| {
        let (w, fixed) = (w.clone(), fixed.clone());
        async move {
            called(&w, &job);
            let order = order_of(&job.payload);
            // The gateway: 50 ms per call; the job id is the idempotency key.
            tokio::time::sleep(Duration::from_millis(50)).await;
            if order == DECLINED && !fixed.load(Ordering::SeqCst) {
                return Err(JobError::permanent("card declined (insufficient funds)"));
            }
            let mut w = w.lock().unwrap();
            w.charge_runs += 1;
            *w.charge_runs_by_order.entry(order).or_default() += 1;
            let made = w.by_key.len() + 1;
            let charge = w
                .by_key
                .entry(job.id.clone())
                .or_insert_with(|| format!("ch_{made}"))
                .clone();
            if charge == format!("ch_{made}") {
                *w.charges.entry(order).or_default() += 1;
            }
            Ok(Some(json!({"charge": charge, "attempt": job.attempt})))
        }
    });
    let w = world.clone();
    let pdf = from_fn(move |job| {
        let w = w.clone();
        async move {
            called(&w, &job);
            let order = order_of(&job.payload);
            let runs = {
                let mut w = w.lock().unwrap();
                let n = w.pdf_runs.entry(order).or_default();
                *n += 1;
                *n
            };
            if order == CANCELLED {
                // A big invoice: still rendering when the pipeline is cancelled.
                tokio::select! {
                    _ = job.cancel.cancelled() => return Err(JobError::retry("stopped")),
                    _ = tokio::time::sleep(Duration::from_secs(60)) => {}
                }
            }
            if order % 4 == 0 && runs == 1 {
                return Err(JobError::retry("renderer crashed (out of memory)"));
            }
            // The charge step's result, passed down: the invoice names the charge.
            let charge = job
                .parents
                .as_ref()
                .and_then(|p| p[format!("order-{order}")]["charge"].as_str())
                .ok_or_else(|| JobError::permanent("no charge in the charge step's result"))?;
            Ok(Some(json!({
                "pages": 1 + order % 3,
                "invoice": format!("INV-{order}-{charge}"),
            })))
        }
    });
    let w = world.clone();
    let email = from_fn(move |job| {
        let w = w.clone();
        async move {
            called(&w, &job);
            let order = order_of(&job.payload);
            // The PDF step's result, passed down: the invoice number to attach.
            let invoice = job
                .parents
                .as_ref()
                .and_then(|p| p[format!("order-{order}.1")]["invoice"].as_str())
                .ok_or_else(|| JobError::permanent("no invoice in the PDF step's result"))?
                .to_string();
            let mut w = w.lock().unwrap();
            *w.email_runs.entry(order).or_default() += 1;
            w.email_invoices.insert(order, invoice.clone());
            Ok(Some(json!({ "sent_with": invoice })))
        }
    });

    let mut workers: Vec<RunningWorker> = Vec::new();
    for i in 0..s.workers.max(1) {
        let mut c = config.clone();
        c.worker.hostname = Some(format!("orders-{i}"));
        if i == 0 && s.dashboard {
            c.dashboard.listen = Some("127.0.0.1:0".parse().unwrap());
        }
        let worker = Worker::new(c)
            .rust_handler("charge", charge.clone())
            .rust_handler("pdf", pdf.clone())
            .rust_handler("email", email.clone())
            .start(CancellationToken::new())
            .await?;
        workers.push(worker);
    }
    let mut report = Report {
        orders: s.orders,
        dashboard: workers[0].dashboard_addr.map(|a| format!("http://{a}/")),
        ..Report::default()
    };

    // Each order and its whole pipeline in one transaction.
    for order in 1..=s.orders as i64 {
        let mut conn = store.raw().await?;
        let tx = conn.transaction().await?;
        tx.execute(
            "INSERT INTO orders (id, amount_cents) VALUES ($1::int8::int4, 1999)",
            &[&order],
        )
        .await?;
        let then = json!([{
            "queue": "pdf", "payload": {"order": order},
            "then": [{"queue": "email", "payload": {"order": order, "template": "receipt"}}]
        }]);
        tx.execute(
            "SELECT enqueue('charge', jsonb_build_object('order', $1::int8, 'amount_cents', 1999), \
             id => 'order-' || $1::int8, then_jobs => $2)",
            &[&order, &then],
        )
        .await?;
        tx.commit().await?;
    }

    let status = |id: String| {
        let store = store.clone();
        async move {
            store
                .job_get(&id)
                .await
                .ok()
                .flatten()
                .map(|j| j.status)
                .unwrap_or_default()
        }
    };
    let wait = |id: String, want: &'static str, secs: u64| {
        let status = &status;
        async move {
            let until = Instant::now() + Duration::from_secs(secs);
            loop {
                if status(id.clone()).await == want {
                    return true;
                }
                if Instant::now() > until {
                    return false;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };

    // The cancelled order: cancel its pipeline while the PDF renders.
    let cancelled = format!("order-{CANCELLED}");
    if wait(format!("{cancelled}.1"), "processing", 30).await {
        report.cancelled_jobs = store.pipeline_cancel(&cancelled).await?.len();
    }
    // Every other order but the declined one completes.
    for order in 1..=s.orders as i64 {
        if order != DECLINED && order != CANCELLED {
            wait(format!("order-{order}.1.1"), "completed", 60).await;
        }
    }
    // The declined order: dead, nothing after it; fixed and retried, it completes.
    let declined = format!("order-{DECLINED}");
    let dead = wait(declined.clone(), "dead", 30).await;
    let followers = store.pipeline_jobs(&declined).await?.len();
    report.declined_dead_without_followers = dead && followers == 1;
    card_fixed.store(true, Ordering::SeqCst);
    store
        .job_retry_dead(Some(std::slice::from_ref(&declined)), None)
        .await?;
    report.declined_completed_after_retry = wait(format!("{declined}.1.1"), "completed", 60).await;

    let c = store.raw().await?;
    report.completed = c
        .query_one(
            "SELECT count(*) FROM jobs WHERE queue = 'email' AND status = 'completed'",
            &[],
        )
        .await?
        .get::<_, i64>(0) as usize;
    report.cancelled_email_created = c
        .query_one(
            "SELECT count(*) FROM jobs WHERE id = $1",
            &[&format!("{cancelled}.1.1")],
        )
        .await?
        .get::<_, i64>(0)
        > 0;
    let sample = "order-4";
    report.sample_pipeline = c
        .query(
            "SELECT id, queue, status, attempts FROM jobs WHERE pipeline = $1 ORDER BY created_at",
            &[&sample],
        )
        .await?
        .into_iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    if let Some(base) = &report.dashboard {
        let html = reqwest::Client::builder()
            .no_proxy()
            .build()?
            .get(format!("{base}pipeline?id={sample}"))
            .send()
            .await?
            .text()
            .await?;
        report.dashboard_pipeline_rows = html.matches("<tr data-id=").count();
    }
    {
        let w = world.lock().unwrap();
        report.charges = w.charges.values().sum();
        report.duplicate_charges = w.charges.values().filter(|n| **n > 1).count();
        report.charge_runs = w.charge_runs;
        report.emails = w.email_runs.values().sum();
        report.emails_with_their_invoice = w
            .email_invoices
            .iter()
            .filter(|(order, invoice)| {
                let charge = w.by_key.get(&format!("order-{order}"));
                charge.is_some_and(|c| **invoice == format!("INV-{order}-{c}"))
            })
            .count();
        let retried: Vec<i64> = w
            .pdf_runs
            .iter()
            .filter(|(o, n)| **n > 1 && **o != CANCELLED)
            .map(|(o, _)| *o)
            .collect();
        report.pdf_retried = retried.len();
        report.other_steps_rerun = retried
            .iter()
            .filter(|o| {
                w.charge_runs_by_order.get(o).copied().unwrap_or(0) != 1
                    || w.email_runs.get(o).copied().unwrap_or(0) != 1
            })
            .count();
    }
    for w in workers {
        w.shutdown().await;
    }
    // After the shutdown: every attempt has ended and is on record.
    let calls = world.lock().unwrap().calls.clone();
    report.handler_calls = calls.values().sum();
    report.unexplained_runs =
        runs::unexplained_runs(&c, &["charge", "pdf", "email"], &calls).await?;
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}
