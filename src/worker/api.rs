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
//! - `GET /healthz` — the process is alive (liveness: never checks the servers).
//! - `GET /readyz` — PostgreSQL and NATS answer and the worker is not draining (readiness).

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
    let app = Router::new()
        .route("/v1/jobs/{id}/progress", post(progress))
        .route("/v1/drain", post(drain))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready))
        .with_state(shared);
    let shutdown = async move { cancel.cancelled().await };
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
    {
        warn!(cause = %e, "local API stopped");
    }
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
    if shared.draining.load(std::sync::atomic::Ordering::SeqCst) {
        return (StatusCode::SERVICE_UNAVAILABLE, "draining".to_string());
    }
    let pg = shared.store.ping().await;
    let nats = shared.broker.client.connection_state();
    let nats_ok = matches!(nats, async_nats::connection::State::Connected);
    match (pg, nats_ok) {
        (Ok(()), true) => (StatusCode::OK, "ready".to_string()),
        (pg, _) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "postgres: {}; nats: {nats:?}",
                pg.map(|_| "ok".to_string())
                    .unwrap_or_else(|e| e.to_string())
            ),
        ),
    }
}
