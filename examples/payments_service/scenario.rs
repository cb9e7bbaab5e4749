//! The payments service: `POST /payments` → `202 Accepted` → a worker charges once.
//!
//! The application writes the payment and enqueues its charge in one transaction (the
//! outbox: SQL `enqueue()` through `Client::enqueue_in`), deduplicates on the
//! `Idempotency-Key` header, and answers 202 at once. Workers (`jobwarden run` processes, as
//! pods would run them) hand each charge to the application's `POST /jobs/charge`, which
//! calls the payment gateway with the job id as the gateway's idempotency key: a retry of
//! the same job, on any worker, after any crash, is the same charge.
//!
//! The gateway here is a fake that keeps every charge it made, replays a charge for a key
//! it has seen, and fails some calls *after* charging (the worst kind of transient error:
//! the money moved, the caller does not know). `Report::duplicate_charges` counts payments
//! charged more than once; the scenario fails if it is not 0. That ledger is idempotent, so
//! it would hide jobwarden running a job twice: the gateway also counts every call per job,
//! and `Report::unexplained_runs` names the jobs whose calls jobwarden's record of claims,
//! retries and reclaims does not explain (see examples/common/runs.rs).
//!
//! 3-D Secure: a payment of a customer whose key starts with `3ds-` needs the cardholder's
//! confirmation. The gateway takes the charge, answers `requires_action`, and calls the
//! application's webhook later with the job's completion token (passed along with the
//! charge); the charge handler answers `202` with `Jobwarden-Defer`, so the job waits as
//! `awaiting` (its slot freed) until the webhook completes it (`Client::complete`, SQL
//! `complete()`). The gateway loses one webhook: the deadline retries that job, the retry's
//! call is a replay with a new token, and its webhook lands. A forged webhook is refused, and
//! a worker is killed while jobs await: their completions still land.
//!
//! Used by `cargo run --example payments_service` and `tests/scenarios.rs`.

#[path = "../common/pod.rs"]
mod pod;
#[path = "../common/runs.rs"]
mod runs;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use jobwarden::client::{Client, EnqueueOptions};
use jobwarden::store::Store;
use pod::Pod;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub struct Settings {
    /// The `jobwarden` binary the workers run.
    pub jobwarden: PathBuf,
    pub database_url: String,
    pub nats_url: String,
    /// A fresh schema for this run.
    pub schema: String,
    /// Payments per burst (15 in the figures).
    pub burst: usize,
    /// Worker processes ("pods").
    pub workers: usize,
    /// Every n-th new charge the gateway makes is answered 503 after charging.
    pub fail_every: usize,
    /// Where the workers' logs go.
    pub log_dir: PathBuf,
    /// How long a 3-D Secure charge waits for its webhook before it is retried.
    pub confirm_deadline: Duration,
}

#[derive(Debug, Default, serde::Serialize)]
pub struct Report {
    pub payments: usize,
    /// First burst: 202 with a new payment.
    pub accepted: usize,
    /// Second burst, same keys: 202 naming the same payment, nothing enqueued.
    pub deduplicated: usize,
    pub charge_jobs: i64,
    /// Charges the gateway made.
    pub charges: usize,
    /// Payments the gateway charged more than once (must be 0).
    pub duplicate_charges: usize,
    /// Calls the gateway answered with an earlier charge (a retry with the same key).
    pub replayed_calls: usize,
    /// Calls the gateway failed after charging.
    pub transient_failures: usize,
    /// Worker processes killed with SIGKILL mid-charge.
    pub workers_killed: usize,
    /// Charge attempts taken back from killed workers (restarted / owner_dead).
    pub attempts_recovered: i64,
    /// Payments whose status is `charged`.
    pub charged: i64,
    /// Calls that reached the gateway, replays included (every run of a charge job).
    pub gateway_calls: usize,
    /// Jobs whose gateway calls jobwarden's record does not explain (must be empty): called
    /// more often than claimed, or claimed again with no recorded end of the attempt before.
    pub unexplained_runs: Vec<String>,
    /// 3-D Secure payments (third burst), and those charged: completed by their webhook.
    pub confirmations: usize,
    pub confirmed: i64,
    /// Charge jobs the gateway's webhook completed (`awaiting` → `completed`).
    pub completed_by_webhook: i64,
    /// Webhooks the gateway lost (never sent), and the retries their deadline made.
    pub webhooks_lost: usize,
    pub deadline_retries: i64,
    /// Forged webhooks the application refused (the token was not issued for the job), and
    /// the refusals jobwarden recorded.
    pub forged_refused: usize,
    pub refusals_recorded: i64,
    /// Charge jobs awaiting their webhook when a worker was killed.
    pub awaiting_when_killed: i64,
    pub seconds: f64,
}

/// The fake payment gateway.
#[derive(Default)]
struct Gateway {
    /// Idempotency key → charge id.
    by_key: HashMap<String, String>,
    /// Every charge made: (payment id, charge id).
    charges: Vec<(String, String)>,
    /// Every call, replayed or not, per idempotency key (the job id).
    calls: HashMap<String, usize>,
    replayed: usize,
    failed: usize,
    fail_every: usize,
    /// Where 3-D Secure confirmations are sent (the application's webhook).
    webhook: String,
    /// The next confirmation is lost (the gateway never sends it).
    lose_next: bool,
    lost: usize,
}

/// Sends a confirmation to the application's webhook after the cardholder took their time,
/// retrying until the application answers (a `4xx` is final: a refused confirmation).
fn confirm_later(gw: Shared<Gateway>, body: Value) {
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let url = gw.lock().unwrap().webhook.clone();
        let http = reqwest::Client::new();
        for _ in 0..100 {
            match http.post(&url).json(&body).send().await {
                Ok(r) if r.status().is_success() || r.status().is_client_error() => return,
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    });
}

type Shared<T> = Arc<Mutex<T>>;

async fn gateway_charge(
    State(gw): State<Shared<Gateway>>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> (StatusCode, Json<Value>) {
    let Some(key) = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
    else {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": "Idempotency-Key required"})),
        );
    };
    *gw.lock().unwrap().calls.entry(key.clone()).or_default() += 1;
    // A real gateway takes a while: long enough for a worker to be killed mid-charge.
    tokio::time::sleep(Duration::from_millis(150)).await;
    let mut g = gw.lock().unwrap();
    let payment = body["payment_id"].as_str().unwrap_or_default().to_string();
    // 3-D Secure: the charge waits for the cardholder; the webhook carries the token.
    let confirm = (body["three_ds"] == json!(true))
        .then(|| json!({"job_id": key, "payment_id": payment, "token": body["completion_token"]}));
    if let Some(charge) = g.by_key.get(&key).cloned() {
        g.replayed += 1;
        if let Some(mut c) = confirm {
            c["charge"] = json!(charge);
            drop(g);
            confirm_later(gw.clone(), c);
            return (
                StatusCode::OK,
                Json(json!({"charge": charge, "replayed": true, "status": "requires_action"})),
            );
        }
        return (
            StatusCode::OK,
            Json(json!({"charge": charge, "replayed": true})),
        );
    }
    let charge = format!("ch_{}", g.charges.len() + 1);
    g.by_key.insert(key, charge.clone());
    g.charges.push((payment.clone(), charge.clone()));
    if let Some(mut c) = confirm {
        c["charge"] = json!(charge);
        if g.lose_next {
            // This confirmation never comes: the job's deadline retries it.
            g.lose_next = false;
            g.lost += 1;
        } else {
            drop(g);
            confirm_later(gw.clone(), c);
        }
        return (
            StatusCode::OK,
            Json(json!({"charge": charge, "status": "requires_action"})),
        );
    }
    if g.fail_every > 0 && g.charges.len() % g.fail_every == 0 {
        // Charged, but the answer is lost.
        g.failed += 1;
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"error": "upstream timeout"})),
        );
    }
    (StatusCode::OK, Json(json!({"charge": charge})))
}

#[derive(Clone)]
struct App {
    store: Store,
    client: Client,
    gateway: String,
    http: reqwest::Client,
    /// `Jobwarden-Defer` of a charge waiting for its 3-D Secure confirmation (seconds).
    confirm_deadline: u64,
}

/// `POST /payments` with `Idempotency-Key`: one transaction writes the payment and enqueues
/// its charge; the same key again answers with the same payment and enqueues nothing.
async fn create_payment(
    State(app): State<App>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> (StatusCode, Json<Value>) {
    let Some(key) = headers.get("idempotency-key").and_then(|v| v.to_str().ok()) else {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": "send an Idempotency-Key header"})),
        );
    };
    let amount = body["amount_cents"].as_i64().unwrap_or(0) as i32;
    let result: anyhow::Result<(String, bool)> = async {
        let mut conn = app.store.raw().await?;
        let tx = conn.transaction().await?;
        let id = uuid::Uuid::now_v7().to_string();
        let inserted = tx
            .query_opt(
                "INSERT INTO payments (id, idempotency_key, amount_cents, status) \
                 VALUES ($1, $2, $3, 'pending') ON CONFLICT (idempotency_key) DO NOTHING \
                 RETURNING id",
                &[&id, &key, &amount],
            )
            .await?;
        if inserted.is_none() {
            let existing: String = tx
                .query_one(
                    "SELECT id FROM payments WHERE idempotency_key = $1",
                    &[&key],
                )
                .await?
                .get(0);
            tx.rollback().await?;
            return Ok((existing, true));
        }
        // Cards of `3ds-…` customers need the cardholder's confirmation (3-D Secure).
        let three_ds = key.starts_with("3ds-");
        app.client
            .enqueue_in(
                &*tx,
                "charges",
                json!({"payment_id": id, "amount_cents": amount, "three_ds": three_ds}),
                EnqueueOptions {
                    id: Some(format!("charge-{id}")),
                    ..Default::default()
                },
            )
            .await?;
        tx.commit().await?;
        Ok((id, false))
    }
    .await;
    match result {
        Ok((id, duplicate)) => (
            StatusCode::ACCEPTED,
            Json(json!({"payment_id": id, "duplicate": duplicate})),
        ),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            Json(json!({"error": e.to_string()})),
        ),
    }
}

/// `POST /jobs/charge`: the workers' HTTP handler. The gateway's idempotency key is the job
/// id, the same for every attempt. A charge that needs the cardholder's confirmation (3-D
/// Secure) is deferred: `202` with `Jobwarden-Defer`, and the gateway's webhook completes it.
async fn charge(State(app): State<App>, Json(job): Json<Value>) -> Response {
    let failed = |status: StatusCode, error: String| {
        (status, Json(json!({ "error": error }))).into_response()
    };
    let key = job["id"].as_str().unwrap_or_default();
    let payment = job["payload"]["payment_id"].as_str().unwrap_or_default();
    let mut request = job["payload"].clone();
    // The gateway hands the token back with its 3-D Secure confirmation.
    request["completion_token"] = job["completion_token"].clone();
    let answer = app
        .http
        .post(format!("{}/v1/charges", app.gateway))
        .header("Idempotency-Key", key)
        .header("X-Attempt", job["attempt"].to_string())
        .json(&request)
        .send()
        .await;
    let answer = match answer {
        Ok(r) if r.status().is_success() => r.json::<Value>().await.unwrap_or_default(),
        Ok(r) => {
            let error = format!("gateway answered {}", r.status());
            return failed(StatusCode::SERVICE_UNAVAILABLE, error);
        }
        Err(e) => {
            let error = format!("gateway unreachable: {e}");
            return failed(StatusCode::SERVICE_UNAVAILABLE, error);
        }
    };
    if answer["status"] == "requires_action" {
        // The cardholder confirms later: the webhook completes the job with its token.
        return (
            StatusCode::ACCEPTED,
            [("Jobwarden-Defer", app.confirm_deadline.to_string())],
            Json(json!({"awaiting": "3-D Secure"})),
        )
            .into_response();
    }
    let Some(charge) = answer["charge"].as_str() else {
        return failed(StatusCode::BAD_GATEWAY, "no charge id".into());
    };
    match mark_charged(&app.store, payment, charge).await {
        Ok(()) => (StatusCode::OK, Json(json!({ "charge": charge }))).into_response(),
        Err(e) => failed(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

async fn mark_charged(store: &Store, payment: &str, charge: &str) -> anyhow::Result<()> {
    store
        .raw()
        .await?
        .execute(
            "UPDATE payments SET status = 'charged', charge_id = $2 WHERE id = $1",
            &[&payment, &charge],
        )
        .await?;
    Ok(())
}

/// `POST /webhooks/gateway`: the gateway's 3-D Secure confirmation. Completes the charge job
/// with the token the attempt was handed (refused when it was not issued for the job, or names
/// an attempt that ended), then marks the payment charged. The gateway sends it again until
/// it gets an answer: a repeat finds the job `already completed` and changes nothing.
async fn webhook(State(app): State<App>, Json(hook): Json<Value>) -> Response {
    let (job, token) = (
        hook["job_id"].as_str().unwrap_or_default(),
        hook["token"].as_str().unwrap_or_default(),
    );
    let charge = hook["charge"].as_str().unwrap_or_default();
    let result = json!({ "charge": charge, "confirmed": "3-D Secure" });
    match app.client.complete(job, token, Some(&result)).await {
        Ok(Ok(_completed_or_repeat)) => {
            let payment = hook["payment_id"].as_str().unwrap_or_default();
            match mark_charged(&app.store, payment, charge).await {
                Ok(()) => (StatusCode::OK, Json(json!({"ok": true}))).into_response(),
                Err(e) => {
                    let error = json!({"error": e.to_string()});
                    (StatusCode::SERVICE_UNAVAILABLE, Json(error)).into_response()
                }
            }
        }
        Ok(Err(refused)) => (
            StatusCode::from_u16(refused.refusal.http_status()).unwrap_or(StatusCode::CONFLICT),
            Json(json!({"error": refused.message})),
        )
            .into_response(),
        Err(e) => {
            let error = json!({"error": e.to_string()});
            (StatusCode::SERVICE_UNAVAILABLE, Json(error)).into_response()
        }
    }
}

async fn serve(router: Router) -> anyhow::Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Ok(format!("http://{addr}"))
}

async fn post_burst(
    http: &reqwest::Client,
    app: &str,
    keys: &[String],
) -> anyhow::Result<Vec<(String, bool)>> {
    let calls = keys.iter().map(|key| {
        let http = http.clone();
        let url = format!("{app}/payments");
        let key = key.clone();
        async move {
            let r = http
                .post(url)
                .header("Idempotency-Key", &key)
                .json(&json!({"amount_cents": 1999, "customer": key}))
                .send()
                .await?;
            anyhow::ensure!(r.status() == 202, "POST /payments answered {}", r.status());
            let v: Value = r.json().await?;
            Ok((
                v["payment_id"].as_str().unwrap_or_default().to_string(),
                v["duplicate"] == json!(true),
            ))
        }
    });
    futures::future::join_all(calls).await.into_iter().collect()
}

async fn wait_charged(store: &Store, n: i64, limit: Duration) -> anyhow::Result<i64> {
    let until = Instant::now() + limit;
    loop {
        let charged: i64 = store
            .raw()
            .await?
            .query_one(
                "SELECT count(*) FROM payments WHERE status = 'charged'",
                &[],
            )
            .await?
            .get(0);
        if charged >= n || Instant::now() > until {
            return Ok(charged);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub async fn run(s: &Settings) -> anyhow::Result<Report> {
    let started = Instant::now();
    std::fs::create_dir_all(&s.log_dir)?;
    let (store, broker) = pod::connect(&s.database_url, &s.schema, &s.nats_url).await?;
    store
        .raw()
        .await?
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS payments (
                 id text PRIMARY KEY,
                 idempotency_key text NOT NULL UNIQUE,
                 amount_cents integer NOT NULL,
                 status text NOT NULL,
                 charge_id text,
                 created_at timestamptz NOT NULL DEFAULT now())",
        )
        .await?;

    let gw = Arc::new(Mutex::new(Gateway {
        fail_every: s.fail_every,
        lose_next: true,
        ..Default::default()
    }));
    let gateway = serve(
        Router::new()
            .route("/v1/charges", post(gateway_charge))
            .with_state(gw.clone()),
    )
    .await?;
    let http = reqwest::Client::builder().no_proxy().build()?;
    let app = serve(
        Router::new()
            .route("/payments", post(create_payment))
            .route("/jobs/charge", post(charge))
            .route("/webhooks/gateway", post(webhook))
            .with_state(App {
                store: store.clone(),
                client: Client::new(store.clone(), broker),
                gateway,
                http: http.clone(),
                confirm_deadline: s.confirm_deadline.as_secs().max(1),
            }),
    )
    .await?;
    gw.lock().unwrap().webhook = format!("{app}/webhooks/gateway");

    let config = s.log_dir.join("jobwarden.toml");
    std::fs::write(
        &config,
        format!(
            "[database]\nurl = {:?}\nschema = {:?}\npool_size = 4\n\
             [nats]\nurl = {:?}\n\
             [worker]\napi_listen = \"127.0.0.1:0\"\nops_listen = \"off\"\n\
             heartbeat_every = \"500ms\"\ndead_after = \"3s\"\nshutdown_grace = \"5s\"\n\
             [queues.charges]\nconcurrency = 4\nmax_attempts = 20\ntimeout = \"10s\"\n\
             backoff = {{ kind = \"fixed\", base = \"200ms\" }}\n\
             handler = {{ kind = \"http\", url = \"{app}/jobs/charge\" }}\n",
            s.database_url, s.schema, s.nats_url
        ),
    )?;
    let mut pods = (0..s.workers)
        .map(|i| Pod::start(&s.jobwarden, &config, &s.log_dir, &format!("payments-{i}")))
        .collect::<std::io::Result<Vec<_>>>()?;
    let mut report = Report::default();

    // A burst of new payments, then the same burst again (clients retrying).
    let keys: Vec<String> = (0..s.burst).map(|i| format!("order-{i}")).collect();
    let first = post_burst(&http, &app, &keys).await?;
    report.accepted = first.iter().filter(|(_, dup)| !dup).count();
    let again = post_burst(&http, &app, &keys).await?;
    report.deduplicated = again
        .iter()
        .zip(&first)
        .filter(|((id, dup), (first_id, _))| *dup && id == first_id)
        .count();
    wait_charged(&store, s.burst as i64, Duration::from_secs(60)).await?;

    // Chaos: a burst while workers are killed mid-charge and come back under their names.
    let chaos: Vec<String> = (0..s.burst).map(|i| format!("chaos-{i}")).collect();
    let chaos_burst = post_burst(&http, &app, &chaos);
    let killing = async {
        // Kill while the victims hold charges in the middle of their handler.
        let victims = s.workers.saturating_sub(1).max(1);
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            let busy: i64 = store
                .raw()
                .await?
                .query_one(
                    "SELECT count(*) FROM jobs WHERE queue = 'charges' AND status = 'processing' \
                     AND worker_id LIKE 'payments-0-%'",
                    &[],
                )
                .await?
                .get(0);
            if busy > 0 || Instant::now() > until {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for pod in pods.iter_mut().take(victims) {
            pod.kill9();
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        for pod in pods.iter_mut().take(victims) {
            pod.restart()?;
        }
        anyhow::Ok(victims)
    };
    let (posted, killed) = tokio::join!(chaos_burst, killing);
    posted?;
    report.workers_killed = killed?;
    wait_charged(&store, 2 * s.burst as i64, Duration::from_secs(90)).await?;

    // 3-D Secure: charges wait for the cardholder's confirmation (the gateway's webhook).
    let confirm: Vec<String> = (0..s.burst).map(|i| format!("3ds-{i}")).collect();
    report.confirmations = post_burst(&http, &app, &confirm).await?.len();
    let last = s.workers - 1;
    let awaiting_on = format!(
        "SELECT count(*) FROM jobs WHERE queue = 'charges' AND status = 'awaiting' \
         AND worker_id LIKE 'payments-{last}-%'"
    );
    let until = Instant::now() + Duration::from_secs(20);
    while report.awaiting_when_killed == 0 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
        report.awaiting_when_killed = store
            .raw()
            .await?
            .query_one(&awaiting_on, &[])
            .await?
            .get(0);
    }
    // The worker that deferred them dies; their confirmations must still land.
    pods[last].kill9();
    report.workers_killed += 1;
    // A forged confirmation: right job, token of no attempt.
    let (job, payment): (String, String) = {
        let row = store
            .raw()
            .await?
            .query_one(
                "SELECT id, payload->>'payment_id' FROM jobs WHERE queue = 'charges' \
                 AND payload->>'three_ds' = 'true' ORDER BY id LIMIT 1",
                &[],
            )
            .await?;
        (row.get(0), row.get(1))
    };
    let forged = http
        .post(format!("{app}/webhooks/gateway"))
        .json(
            &json!({"job_id": job, "payment_id": payment, "charge": "ch_forged",
                      "token": format!("1.{}", "0".repeat(32))}),
        )
        .send()
        .await?;
    if forged.status() == StatusCode::FORBIDDEN {
        report.forged_refused += 1;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    pods[last].restart()?;
    report.charged = wait_charged(&store, 3 * s.burst as i64, Duration::from_secs(90)).await?;

    let c = store.raw().await?;
    report.payments = c
        .query_one("SELECT count(*) FROM payments", &[])
        .await?
        .get::<_, i64>(0) as usize;
    report.charge_jobs = c
        .query_one("SELECT count(*) FROM jobs WHERE queue = 'charges'", &[])
        .await?
        .get(0);
    report.attempts_recovered = c
        .query_one(
            "SELECT count(*) FROM job_attempts WHERE outcome IN ('restarted', 'owner_dead')",
            &[],
        )
        .await?
        .get(0);
    report.confirmed = c
        .query_one(
            "SELECT count(*) FROM payments WHERE status = 'charged' AND idempotency_key LIKE '3ds-%'",
            &[],
        )
        .await?
        .get(0);
    report.completed_by_webhook = c
        .query_one(
            "SELECT count(*) FROM jobs WHERE queue = 'charges' AND status = 'completed' \
             AND result->>'confirmed' = '3-D Secure'",
            &[],
        )
        .await?
        .get(0);
    report.deadline_retries = c
        .query_one(
            "SELECT count(*) FROM job_attempts WHERE outcome = 'deadline'",
            &[],
        )
        .await?
        .get(0);
    report.refusals_recorded = c
        .query_one(
            "SELECT count(*) FROM job_attempts WHERE outcome = 'completion_refused'",
            &[],
        )
        .await?
        .get(0);
    report.webhooks_lost = gw.lock().unwrap().lost;
    let calls = gw.lock().unwrap().calls.clone();
    report.gateway_calls = calls.values().sum();
    report.unexplained_runs = runs::unexplained_runs(&c, &["charges"], &calls).await?;
    {
        let g = gw.lock().unwrap();
        report.charges = g.charges.len();
        let mut per_payment: HashMap<&str, usize> = HashMap::new();
        for (payment, _) in &g.charges {
            *per_payment.entry(payment.as_str()).or_default() += 1;
        }
        report.duplicate_charges = per_payment.values().filter(|n| **n > 1).count();
        report.replayed_calls = g.replayed;
        report.transient_failures = g.failed;
    }
    for pod in &mut pods {
        pod.stop();
    }
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}
