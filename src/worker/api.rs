//! The sidecar's local API, for the application beside it:
//!
//! - `POST /v1/jobs/{id}/progress?lease=N` `{"progress":0.4,"stage":"render","message":"page
//!   3"}` — records progress for one attempt of a job this worker runs (the job's
//!   `progress_url` names it; the lease is the attempt's fencing token) and keeps its message
//!   alive. `200` recorded; `404` that attempt does not run here (any more); `409` taken from
//!   this worker (stop work); `400` malformed body or no lease. A report from an attempt that
//!   was stopped never counts for a later attempt of the same job.
//! - `POST /v1/drain` — stop taking jobs, let running ones finish within
//!   `worker.shutdown_grace`, give back the rest; answers when done with
//!   `{"finished": n, "released": m}`. The process keeps running (for a Kubernetes `preStop`
//!   hook on the application container, so jobs stop before the application does).
//! - `GET /v1/drain` — the same, on the ops listener too: a Kubernetes `preStop` hook can only
//!   make a GET, and the kubelet reaches the pod's address, not its loopback. Anyone who can
//!   reach the ops port can drain the worker: keep it inside the cluster (a NetworkPolicy in
//!   `k8s/`); a drained worker takes no jobs until it restarts, and loses none.
//! - `GET /livez` (and `/healthz`, its older name) — the process is alive: `200` while every
//!   service runs, `503` naming the failed one once one has failed (the process is then
//!   stopping). Liveness never checks the servers, so an outage of either never restarts
//!   every pod.
//! - `GET /readyz` — PostgreSQL answers with the schema this build needs, NATS is connected,
//!   and the worker is neither draining nor fenced off (readiness); `503` with the reason
//!   otherwise.
//! - `GET /metrics` — Prometheus metrics (see [`super::metrics`]).
//!
//! The ops listener (`worker.ops_listen`, reachable from outside the pod) serves the probes,
//! the metrics and `GET /v1/drain`; progress reports stay on the local address.

use super::Shared;
use crate::handler::Progress;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tracing::warn;

pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    shared: Arc<Shared>,
    cancel: CancellationToken,
) {
    let app = ops_routes()
        .route("/v1/jobs/{id}/progress", post(progress))
        .with_state(shared);
    let shutdown = async move { cancel.cancelled().await };
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
    {
        warn!(cause = %e, "local API stopped");
    }
}

/// Metrics and probes, on their own listener.
pub(crate) async fn serve_ops(
    listener: tokio::net::TcpListener,
    shared: Arc<Shared>,
    cancel: CancellationToken,
) {
    let app = ops_routes().with_state(shared);
    let shutdown = async move { cancel.cancelled().await };
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
    {
        warn!(cause = %e, "metrics and probes listener stopped");
    }
}

fn ops_routes() -> Router<Arc<Shared>> {
    Router::new()
        .route("/livez", get(live))
        .route("/healthz", get(live))
        .route("/readyz", get(ready))
        .route("/metrics", get(metrics))
        .route("/v1/drain", get(drain).post(drain))
}

/// Liveness: `200 ok` while every service runs; `503` naming the failed service once one
/// has failed (the process is stopping: see `supervisor`). Never checks the servers.
async fn live(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    match shared.supervisor.failure() {
        None => (StatusCode::OK, "ok".to_string()),
        Some(f) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{f}; the worker is stopping"),
        ),
    }
}

async fn metrics(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    let body = super::metrics::render(&shared).await;
    (
        [(
            axum::http::header::CONTENT_TYPE,
            super::metrics::CONTENT_TYPE,
        )],
        body,
    )
}

#[derive(serde::Deserialize)]
struct AttemptQuery {
    lease: Option<i64>,
}

async fn progress(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    Query(attempt): Query<AttemptQuery>,
    body: axum::body::Bytes,
) -> impl IntoResponse {
    let Some(lease) = attempt.lease else {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": format!(
                "progress reports must name the attempt: post to the progress_url given with \
                 the job (/v1/jobs/{id}/progress?lease=<lease>; exec handlers get it as \
                 JOB_PROGRESS_URL)"
            )})),
        );
    };
    let report: Progress = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return (
                StatusCode::BAD_REQUEST,
                Json(json!({"error": format!(
                    "body must be a JSON object with optional progress (number), stage and message (strings): {e}"
                )})),
            )
        }
    };
    if shared.ledger.progressed(&id, lease).is_none() {
        return (
            StatusCode::NOT_FOUND,
            Json(
                json!({"error": format!("attempt {lease} of job {id} is not running on this worker; stop working on it")}),
            ),
        );
    }
    match super::executor::report_progress(&shared, &id, lease, &report).await {
        Ok(()) => (StatusCode::OK, Json(json!({"ok": true}))),
        Err(_) => (
            StatusCode::CONFLICT,
            Json(
                json!({"error": format!("job {id} was taken from this worker; stop working on it")}),
            ),
        ),
    }
}

async fn drain(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    let report = shared.drain(shared.config.worker.shutdown_grace).await;
    Json(json!({"finished": report.finished, "released": report.released}))
}

async fn ready(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    use std::sync::atomic::Ordering;
    if shared.draining.load(Ordering::SeqCst) {
        return (StatusCode::SERVICE_UNAVAILABLE, "draining".to_string());
    }
    if shared.fenced.load(Ordering::SeqCst) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "fenced off: this worker cannot renew its heartbeat (or was declared dead) and takes no jobs"
                .to_string(),
        );
    }
    let nats = shared.broker.client.connection_state();
    let nats_ok = matches!(nats, async_nats::connection::State::Connected);
    let need = crate::store::Store::required_version();
    let pg = match tokio::time::timeout(
        std::time::Duration::from_secs(2),
        shared.store.schema_version(),
    )
    .await
    {
        Ok(Ok(v)) if v >= need => Ok(()),
        Ok(Ok(v)) => Err(format!(
            "schema at migration {v}, this build needs {need}: run `jobwarden migrate`"
        )),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("no answer within 2s".to_string()),
    };
    match (pg, nats_ok) {
        (Ok(()), true) => (StatusCode::OK, "ready".to_string()),
        (pg, _) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "postgres: {}; nats: {}",
                pg.err().unwrap_or_else(|| "ok".to_string()),
                if nats_ok {
                    "ok".to_string()
                } else {
                    format!("{nats:?}")
                }
            ),
        ),
    }
}
