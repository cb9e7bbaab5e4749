//! The payment flow (seed design 4) on jobwarden's transactional enqueue.
//!
//! `POST /orders {"amount_cents": 1999}` writes the order and enqueues its payment job in
//! **one transaction**, then answers `202 Accepted`. A worker charges the order once: the
//! job never exists if the order's transaction rolls back, survives a crash between the
//! commit and the publish, and a second run of the same job (its worker died after charging)
//! finds the charge already made — the payment provider's idempotency key is the order.
//!
//! ```text
//! cargo run --example payments                 # serves 127.0.0.1:8088
//! curl -si -XPOST localhost:8088/orders -d '{"amount_cents":1999}' -H 'content-type: application/json'
//! curl -s localhost:8088/orders/1
//! cargo run --example payments -- --self-test  # 20 orders (one rolled back), checks, exits
//! ```
//!
//! The provider's ledger is idempotent, so it would hide a job run twice: the self-test also
//! counts every call that reached the provider per job (`shop_provider_calls`) and checks
//! each against jobwarden's record (examples/common/runs.rs).
//!
//! Connections come from the usual settings (`JOBWARDEN_DATABASE__URL`,
//! `JOBWARDEN_NATS__URL`, `JOBWARDEN_DATABASE__SCHEMA`; defaults: the local servers).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use jobwarden::client::{Client, EnqueueOptions};
use jobwarden::config::Config;
use jobwarden::handler::{from_fn, JobError};
use jobwarden::store::Store;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

#[path = "common/runs.rs"]
mod runs;

/// The shop's own tables, next to jobwarden's in the same schema.
const SHOP_TABLES: &str = "
CREATE TABLE IF NOT EXISTS shop_orders (
    id           serial PRIMARY KEY,
    amount_cents integer NOT NULL CHECK (amount_cents > 0),
    status       text    NOT NULL DEFAULT 'pending'
);
-- The payment provider, as far as this example goes: one charge per order, whatever
-- happens (its idempotency key is the order).
CREATE TABLE IF NOT EXISTS shop_charges (
    order_id     integer PRIMARY KEY REFERENCES shop_orders (id),
    amount_cents integer NOT NULL,
    job_id       text    NOT NULL,
    charged_at   timestamptz NOT NULL DEFAULT now()
);
-- Every call that reached the provider, whether it charged or found the charge made.
CREATE TABLE IF NOT EXISTS shop_provider_calls (
    id       bigserial PRIMARY KEY,
    order_id integer NOT NULL,
    job_id   text    NOT NULL,
    attempt  integer NOT NULL,
    at       timestamptz NOT NULL DEFAULT now()
);";

struct Shop {
    db: tokio_postgres::Client,
    jobs: Client,
}

type Shared = Arc<tokio::sync::Mutex<Shop>>;

/// POST /orders: the order and its payment job commit together, or neither does.
async fn create_order(
    State(shop): State<Shared>,
    Json(body): Json<Value>,
) -> Result<(StatusCode, Json<Value>), (StatusCode, String)> {
    let amount = body["amount_cents"].as_i64().unwrap_or(0) as i32;
    let fail = |e: String| (StatusCode::BAD_REQUEST, e);
    let mut shop = shop.lock().await;
    let Shop { db, jobs } = &mut *shop;
    let tx = db.transaction().await.map_err(|e| fail(e.to_string()))?;
    let order: i32 = tx
        .query_one(
            "INSERT INTO shop_orders (amount_cents) VALUES ($1) RETURNING id",
            &[&amount],
        )
        .await
        .map_err(|e| fail(format!("amount_cents must be a positive number: {e}")))?
        .get(0);
    let job = jobs
        .enqueue_in(
            &tx,
            "payments",
            json!({"order": order, "amount_cents": amount}),
            EnqueueOptions {
                idempotency_key: Some(format!("order-{order}")),
                ..Default::default()
            },
        )
        .await
        .map_err(|e| fail(e.to_string()))?;
    // A rolled-back order leaves no job behind (the self-test does this on purpose).
    if body["rollback"].as_bool() == Some(true) {
        tx.rollback().await.map_err(|e| fail(e.to_string()))?;
        return Ok((StatusCode::OK, Json(json!({"rolled_back": order}))));
    }
    tx.commit().await.map_err(|e| fail(e.to_string()))?;
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({"order": order, "job": job, "status": "pending"})),
    ))
}

/// GET /orders/{id}
async fn show_order(
    State(shop): State<Shared>,
    Path(id): Path<i32>,
) -> Result<Json<Value>, StatusCode> {
    let shop = shop.lock().await;
    let row = shop
        .db
        .query_opt(
            "SELECT o.status, c.charged_at IS NOT NULL FROM shop_orders o \
             LEFT JOIN shop_charges c ON c.order_id = o.id WHERE o.id = $1",
            &[&id],
        )
        .await
        .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?
        .ok_or(StatusCode::NOT_FOUND)?;
    Ok(Json(
        json!({"order": id, "status": row.get::<_, String>(0), "charged": row.get::<_, bool>(1)}),
    ))
}

async fn connect(url: &str, schema: &str) -> anyhow::Result<tokio_postgres::Client> {
    let mut cfg: tokio_postgres::Config = url.parse()?;
    cfg.options(format!("-c search_path={schema}"));
    let (client, conn) = cfg.connect(tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    Ok(client)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,jobwarden=info".into()),
        )
        .init();
    let self_test = std::env::args().any(|a| a == "--self-test");
    let mut config = Config::load_connections(None)?;
    let queue = Config::from_toml(
        "[queues.payments]\nmax_attempts = 10\nhandler = { kind = \"rust\", name = \"charge\" }\n",
    )?
    .queues["payments"]
        .clone();
    config.queues.insert("payments".into(), queue);
    config.worker.api_listen = "127.0.0.1:0".parse().map_err(anyhow::Error::msg)?;
    config.worker.ops_listen = "127.0.0.1:0".parse().map_err(anyhow::Error::msg)?;
    let schema = config.database.schema.clone();

    let store = Store::connect(&config.database).await?;
    store.migrate().await?;
    let broker = jobwarden::broker::Broker::connect(&config.nats).await?;
    let db = connect(&config.database.url, &schema).await?;
    db.batch_execute(SHOP_TABLES).await?;

    // The worker: charges each order once.
    let worker_db = Arc::new(connect(&config.database.url, &schema).await?);
    let charge = from_fn(move |job| {
        let db = worker_db.clone();
        async move {
            let order = job.payload["order"].as_i64().unwrap_or(0) as i32;
            let amount = job.payload["amount_cents"].as_i64().unwrap_or(0) as i32;
            // The provider call: idempotent by order, so a second run charges nothing. Every
            // call is counted first (the self-test checks runs against jobwarden's record).
            db.execute(
                "INSERT INTO shop_provider_calls (order_id, job_id, attempt) VALUES ($1, $2, $3)",
                &[&order, &job.id, &(job.attempt as i32)],
            )
            .await
            .map_err(|e| JobError::retry(format!("payment provider: {e}")))?;
            db.execute(
                "INSERT INTO shop_charges (order_id, amount_cents, job_id) VALUES ($1, $2, $3) \
                 ON CONFLICT (order_id) DO NOTHING",
                &[&order, &amount, &job.id],
            )
            .await
            .map_err(|e| JobError::retry(format!("payment provider: {e}")))?;
            db.execute(
                "UPDATE shop_orders SET status = 'paid' WHERE id = $1",
                &[&order],
            )
            .await
            .map_err(|e| JobError::retry(e.to_string()))?;
            Ok(Some(json!({"charged": order})))
        }
    });
    let worker = jobwarden::Worker::new(config.clone())
        .rust_handler("charge", charge)
        .start(CancellationToken::new())
        .await?;

    let shop: Shared = Arc::new(tokio::sync::Mutex::new(Shop {
        db,
        jobs: Client::new(store.clone(), broker),
    }));
    let app = Router::new()
        .route("/orders", post(create_order))
        .route("/orders/{id}", get(show_order))
        .with_state(shop.clone());
    let listen = if self_test {
        "127.0.0.1:0"
    } else {
        "127.0.0.1:8088"
    };
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    println!("payments example on http://{addr} (schema {schema})");
    if !self_test {
        tokio::signal::ctrl_c().await?;
        worker.shutdown().await;
        return Ok(());
    }

    // Self-test: 20 orders through HTTP, one more rolled back on purpose.
    let http = reqwest::Client::new();
    let mut orders = Vec::new();
    for i in 0..21 {
        let body = json!({"amount_cents": 1000 + i, "rollback": i == 7});
        let r = http
            .post(format!("http://{addr}/orders"))
            .json(&body)
            .send()
            .await?;
        let status = r.status();
        let v: Value = r.json().await?;
        if i == 7 {
            anyhow::ensure!(status == StatusCode::OK, "rollback answered {status}");
        } else {
            anyhow::ensure!(
                status == StatusCode::ACCEPTED,
                "order answered {status}: {v}"
            );
            orders.push(v["order"].as_i64().unwrap_or(0) as i32);
        }
    }
    let start = Instant::now();
    let check = loop {
        let shop = shop.lock().await;
        let row = shop
            .db
            .query_one(
                "SELECT (SELECT count(*) FROM shop_orders WHERE status = 'paid' AND id = ANY($1)),
                        (SELECT count(*) FROM shop_charges WHERE order_id = ANY($1)),
                        (SELECT count(*) FROM shop_charges),
                        (SELECT count(*) FROM shop_orders)",
                &[&orders],
            )
            .await?;
        let (paid, charged, charges, all): (i64, i64, i64, i64) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        if paid == orders.len() as i64 || start.elapsed() > Duration::from_secs(30) {
            break (paid, charged, charges, all);
        }
        drop(shop);
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let (paid, charged, charges, all) = check;
    println!(
        "self-test: {} orders accepted, {paid} paid, {charged} charged ({charges} charges in \
         all, {all} orders stored: the rolled-back one left neither order nor job) in {:?}",
        orders.len(),
        start.elapsed()
    );
    worker.shutdown().await;
    // Every call that reached the provider, per job, against jobwarden's record of claims.
    let shop = shop.lock().await;
    let mut calls = std::collections::HashMap::new();
    for r in shop
        .db
        .query(
            "SELECT job_id, count(*) FROM shop_provider_calls GROUP BY job_id",
            &[],
        )
        .await?
    {
        calls.insert(r.get::<_, String>(0), r.get::<_, i64>(1) as usize);
    }
    let row = shop
        .db
        .query_one(
            "SELECT count(*), COALESCE(sum(lease), 0)::int8 FROM jobs WHERE queue = 'payments'",
            &[],
        )
        .await?;
    let (jobs, claims): (i64, i64) = (row.get(0), row.get(1));
    let unexplained = runs::unexplained_runs(&shop.db, &["payments"], &calls).await?;
    let called: usize = calls.values().sum();
    println!(
        "runs: {called} provider calls, {claims} claims of {jobs} payment jobs, {} unexplained",
        unexplained.len()
    );
    anyhow::ensure!(
        unexplained.is_empty(),
        "payment jobs ran more often than jobwarden's record explains:\n{}",
        unexplained.join("\n")
    );
    anyhow::ensure!(
        called as i64 == claims,
        "{called} provider calls for {claims} claims: every claim of a healthy worker runs its \
         handler once"
    );
    anyhow::ensure!(paid == orders.len() as i64, "not every order was paid");
    anyhow::ensure!(
        charges == orders.len() as i64,
        "an order was charged twice or not at all"
    );
    anyhow::ensure!(
        all == orders.len() as i64,
        "the rolled-back order was stored"
    );
    Ok(())
}
