//! The sidecar's local API, for the application beside it:
//!
//! - `POST /v1/jobs/{id}/progress?lease=N` `{"progress":0.4,"stage":"render","message":"page
//!   3"}` — records progress for one attempt of a job this worker runs (the job's
//!   `progress_url` names it; the lease is the attempt's fencing token) and keeps its message
//!   alive. `200` recorded; `404` that attempt does not run here (any more); `409` taken from
//!   this worker (stop work); `400` malformed body or no lease. A report from an attempt that
//!   was stopped never counts for a later attempt of the same job.
//! - `POST /v1/jobs/{id}/complete` `{"token": "<completion_token>", "result": …}` and
//!   `POST /v1/jobs/{id}/fail` `{"token": "…", "error": "…", "permanent": false,
//!   "retry_after": "30s"}` — end an awaiting job (its handler deferred it) from outside, on
//!   any worker: `200 {"status": …}`; `404` unknown job; `403` a token not issued for it;
//!   `409` an attempt that cannot be ended so (stale, not deferred, cancelled, past its
//!   deadline, ended); `413` a result over the limit (see [`crate::completion`]).
//! - `POST /v1/drain` (here and on the ops listener) — stop taking jobs, let running ones
//!   finish within `worker.shutdown_grace`, give back the rest; answers when done with
//!   `{"finished": n, "released": m}`. The process keeps running, for a stop signal that
//!   should follow; if none comes within `worker.drained_exit_after` it exits (status 0) so
//!   the orchestrator starts it again, serving. A browser's request from another site is
//!   refused (`403`): a web page cannot drain a worker.
//! - `GET /v1/drain` — `405` with `Allow: POST`, unless it carries `X-Jobwarden-Drain:
//!   preStop`: a Kubernetes `preStop` hook can only make a GET (its `httpGet` has headers but
//!   no method), and it reaches the pod's address, hence the ops listener. A browser cannot
//!   send a custom header to another site without a CORS preflight, which nothing here
//!   approves, so an `<img>` or a link cannot drain a worker. Anyone who can reach the ops
//!   port can still drain it: keep the port inside the cluster (a NetworkPolicy in `k8s/`).
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
//! the metrics and the drain; progress reports stay on the local address. Every listener
//! has the limits of [`super::listener`]; a progress report's body is at most
//! [`PROGRESS_BODY_LIMIT`] bytes.

use super::listener::{self, LimitedBody, NotCrossSite};
use super::Shared;
use crate::handler::Progress;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tracing::info;

/// The largest progress report accepted (progress, stage and message fit in far less).
pub(crate) const PROGRESS_BODY_LIMIT: usize = 16 * 1024;
/// The largest completion accepted: a result of the contract's largest size, a token, and
/// room for JSON's escapes (a larger result is refused by `complete()` with its size).
pub(crate) const COMPLETION_BODY_LIMIT: usize = 2 * crate::contract::MAX_RESULT_BYTES + 64 * 1024;

/// The header (and its value) that lets a `GET /v1/drain` drain: what a Kubernetes `preStop`
/// hook sends (`httpGet.httpHeaders`). Header names are case-insensitive.
pub(crate) const DRAIN_HEADER: (&str, &str) = ("X-Jobwarden-Drain", "preStop");

pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    shared: Arc<Shared>,
    cancel: CancellationToken,
) {
    let app = ops_routes()
        .route("/v1/jobs/{id}/progress", post(progress))
        .route("/v1/jobs/{id}/complete", post(complete))
        .route("/v1/jobs/{id}/fail", post(fail))
        .with_state(shared);
    listener::serve("local API", listener, app, cancel).await;
}

/// Metrics, probes and the drain, on their own listener.
pub(crate) async fn serve_ops(
    listener: tokio::net::TcpListener,
    shared: Arc<Shared>,
    cancel: CancellationToken,
) {
    let app = ops_routes().with_state(shared);
    listener::serve("metrics and probes", listener, app, cancel).await;
}

fn ops_routes() -> Router<Arc<Shared>> {
    Router::new()
        .route("/livez", get(live))
        .route("/healthz", get(live))
        .route("/readyz", get(ready))
        .route("/metrics", get(metrics))
        .route("/v1/drain", get(drain_get).post(drain))
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
    LimitedBody(body): LimitedBody<PROGRESS_BODY_LIMIT>,
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

/// `POST /v1/jobs/{id}/complete` `{"token": "<completion_token>", "result": <any JSON>}`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct CompleteBody {
    token: String,
    #[serde(default)]
    result: Option<serde_json::Value>,
}

/// `POST /v1/jobs/{id}/fail` `{"token": "…", "error": "…", "permanent": false,
/// "retry_after": "30s"}` (all but the token optional).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FailBody {
    token: String,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    permanent: bool,
    /// Seconds, or a duration (`30s`, `5m`); none: the queue's backoff.
    #[serde(default)]
    retry_after: Option<serde_json::Value>,
}

/// A body that is not what the route takes: `400` naming the route's fields.
fn bad_body(route: &str, fields: &str, e: impl std::fmt::Display) -> Response {
    (
        StatusCode::BAD_REQUEST,
        Json(json!({"error": format!("{route}: the body must be a JSON object {fields}: {e}")})),
    )
        .into_response()
}

/// What a completion or failure from outside came to, as the API answers it.
fn ended(id: &str, answer: Result<crate::store::EndResult, crate::store::StoreError>) -> Response {
    match answer {
        Ok(Ok(how)) => (
            StatusCode::OK,
            Json(json!({"id": id, "status": how.as_str()})),
        )
            .into_response(),
        Ok(Err(refused)) => (
            StatusCode::from_u16(refused.refusal.http_status()).unwrap_or(StatusCode::CONFLICT),
            Json(json!({"error": refused.message})),
        )
            .into_response(),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"error": format!("{e}; nothing was changed: try again")})),
        )
            .into_response(),
    }
}

/// `POST /v1/jobs/{id}/complete`: completes an awaiting job (one whose handler deferred it)
/// with the attempt's token, on any worker (the write is checked and fenced in PostgreSQL).
/// `200 {"status": "completed"}` (or `"already completed"` for a repeat with the same token);
/// `404` no such job; `403` a token not issued for it; `409` its attempt cannot be completed
/// (stale token, not deferred, cancelled, past its deadline, ended); `413` a result over the
/// limit; `400` a malformed body. Refusals of a token are recorded in the job's attempts.
async fn complete(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    LimitedBody(body): LimitedBody<COMPLETION_BODY_LIMIT>,
) -> Response {
    let req: CompleteBody =
        match serde_json::from_slice(&body) {
            Ok(r) => r,
            Err(e) => return bad_body(
                "POST /v1/jobs/<id>/complete",
                "{\"token\": \"<the attempt's completion_token>\", \"result\": <optional JSON>}",
                e,
            ),
        };
    let who = format!("api:{}", shared.worker_id);
    let answer = shared
        .store
        .complete_job(&id, &req.token, req.result.as_ref(), &who)
        .await;
    ended(&id, answer)
}

/// `POST /v1/jobs/{id}/fail`: fails an awaiting job: retried after its backoff (or
/// `retry_after`), dead when `permanent` or out of attempts. Answers as `complete` does
/// (`"status"`: `retry scheduled`, `dead`, or `already failed`).
async fn fail(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    LimitedBody(body): LimitedBody<PROGRESS_BODY_LIMIT>,
) -> Response {
    const FIELDS: &str =
        "{\"token\": \"…\", \"error\": \"why\", \"permanent\": false, \"retry_after\": \"30s\"}";
    let route = "POST /v1/jobs/<id>/fail";
    let req: FailBody = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return bad_body(route, FIELDS, e),
    };
    let retry_after = match &req.retry_after {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::Number(n)) => match n.as_u64() {
            Some(s) => Some(std::time::Duration::from_secs(s)),
            None => {
                return bad_body(
                    route,
                    FIELDS,
                    format!("retry_after {n} is not a whole number of seconds"),
                )
            }
        },
        Some(serde_json::Value::String(t)) => match humantime::parse_duration(t) {
            Ok(d) => Some(d),
            Err(e) => return bad_body(route, FIELDS, format!("retry_after {t:?}: {e}")),
        },
        Some(other) => {
            return bad_body(
                route,
                FIELDS,
                format!("retry_after {other} is not seconds or a duration"),
            )
        }
    };
    let who = format!("api:{}", shared.worker_id);
    let error = req.error.unwrap_or_default();
    let answer = shared
        .store
        .fail_job(&id, &req.token, &error, req.permanent, retry_after, &who)
        .await;
    ended(&id, answer)
}

/// `POST /v1/drain` (and the `preStop` hook's GET): drains, answers when done, and arms the
/// drained exit (see [`Shared::drained`](super::Shared)).
async fn drain(_: NotCrossSite, State(shared): State<Arc<Shared>>) -> Response {
    info!("drain requested");
    let report = shared.drain(shared.config.worker.shutdown_grace).await;
    shared.drained.cancel();
    Json(json!({"finished": report.finished, "released": report.released})).into_response()
}

/// `GET /v1/drain`: drains only for the `preStop` hook's header; anything else (a link, an
/// `<img>`, a crawler) is told to POST.
async fn drain_get(site: NotCrossSite, state: State<Arc<Shared>>, headers: HeaderMap) -> Response {
    let (name, value) = DRAIN_HEADER;
    if headers.get(name).and_then(|v| v.to_str().ok()) == Some(value) {
        return drain(site, state).await;
    }
    (
        StatusCode::METHOD_NOT_ALLOWED,
        [(header::ALLOW, "POST")],
        format!(
            "a drain changes state: send POST /v1/drain (curl -X POST …), or, from a \
             Kubernetes preStop httpGet hook (which can only GET), add the header \
             {name}: {value}"
        ),
    )
        .into_response()
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
