//! `/job?id=`: one job ([`JobView`], what `jobwarden jobs show` prints too) with what it
//! waits for, its progress, owner and heartbeat, its times, every attempt (a page at a time),
//! its payload and result, and for an admin the buttons to retry or cancel it.

use super::super::auth::Viewer;
use super::super::layout::{failed, flash, more_link, page as layout, status_badge};
use super::super::{q, PAGE};
use crate::store::{AttemptRow, Bounded, Store, DASHBOARD_QUERY_LIMIT};
use crate::view::{pretty, JobView};
use crate::worker::Shared;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::{html, Markup};
use std::collections::HashMap;
use std::sync::Arc;
use tracing::warn;

pub(crate) async fn page(
    viewer: Viewer,
    State(shared): State<Arc<Shared>>,
    Query(p): Query<HashMap<String, String>>,
) -> Response {
    let id = p.get("id").cloned().unwrap_or_default();
    let store = &shared.store;
    let job = match store.job_get(&id).await {
        Ok(Some(j)) => j,
        Ok(None) => return no_such_job(viewer, &id),
        Err(e) => return failed(e),
    };
    let attempts_after: i64 = p
        .get("attempts_after")
        .and_then(|a| a.parse().ok())
        .unwrap_or(0);
    let worker = job.worker_id.as_deref();
    let (parts, missing) = read_parts(store, &id, worker, attempts_after).await;
    let Parts {
        keys,
        rows,
        waiting,
        owner,
    } = parts;
    // An ordered queue of this worker's: its dead jobs may hold their keys.
    let ordered = shared
        .queues
        .get(&job.queue)
        .and_then(|p| p.keys)
        .is_some_and(|k| k.ordered);
    let mut v = JobView::new(job, rows, waiting, owner.as_ref());
    if let Some((b, progress)) = v.batch.as_mut() {
        // A member's batch and its progress (members by status over the batch's own index).
        *progress = store
            .batch_progress(b)
            .await
            .ok()
            .flatten()
            .map(|p| p.summary());
    }
    let next = keys
        .last()
        .map(|key| format!("/job?id={}&attempts_after={key}", q(&id)))
        .unwrap_or_default();
    let body = html! {
        (flash(&p))
        @for m in &missing {
            div class="msg" { "not read: " (m) }
        }
        (facts(&v))
        @if viewer.admin {
            (actions(&v, &id, ordered))
        }
        (attempts_table(&v))
        (more_link("next-attempts", keys.len() as i64 >= PAGE, &next, &format!("next {PAGE} attempts")))
        h2 { "Payload" }
        pre id="payload" { (pretty(&v.payload)) }
        @if let Some(r) = &v.result {
            h2 { "Result" }
            pre id="result" { (pretty(r)) }
        }
    };
    layout(viewer, "jobs", &format!("Job {id}"), body).into_response()
}

/// The `404` page for a job id (or a pipeline's) that names no job.
pub(super) fn no_such_job(viewer: Viewer, id: &str) -> Response {
    let body = html! { p { "No job has the id " code { (id) } "." } };
    let page = layout(viewer, "jobs", "No such job", body);
    (StatusCode::NOT_FOUND, page).into_response()
}

/// What the page shows beside the job's own row.
struct Parts {
    /// Each attempt's page key, in the order of `rows`.
    keys: Vec<i64>,
    rows: Vec<AttemptRow>,
    waiting: Option<String>,
    owner: Option<crate::store::WorkerRow>,
}

/// The job's attempts (a page), what it waits for and its owner's row; a part PostgreSQL did
/// not answer is said to be missing (second value), never shown as empty.
async fn read_parts(
    store: &Store,
    id: &str,
    worker: Option<&str>,
    attempts_after: i64,
) -> (Parts, Vec<String>) {
    let mut missing: Vec<String> = Vec::new();
    let mut note = |what: &str, e: &dyn std::fmt::Display| {
        warn!(job.id = %id, cause = %e, "dashboard: could not read the job's {what}");
        missing.push(format!("{what}: {e}"));
    };
    let attempts = match store.dashboard_attempts(id, attempts_after, PAGE).await {
        Ok(Bounded::Done(a)) => a,
        Ok(Bounded::TooSlow) => {
            let why = format!("not read within {} s", DASHBOARD_QUERY_LIMIT.as_secs());
            note("attempts", &why);
            Vec::new()
        }
        Err(e) => {
            note("attempts", &e);
            Vec::new()
        }
    };
    let waiting = store.job_explain(id).await.unwrap_or_else(|e| {
        note("wait", &e);
        None
    });
    let owner = match worker {
        Some(w) => store.worker(w).await.unwrap_or_else(|e| {
            note("owner", &e);
            None
        }),
        None => None,
    };
    let (keys, rows) = attempts.into_iter().unzip();
    let parts = Parts {
        keys,
        rows,
        waiting,
        owner,
    };
    (parts, missing)
}

/// The job's facts, as a definition list.
fn facts(v: &JobView) -> Markup {
    html! {
        dl id="job" {
            dt { "status" } dd data-field="status" { (status_badge(&v.status)) }
            dt { "queue" } dd { (v.queue) }
            @if let Some(k) = &v.key {
                dt { "key" } dd data-field="key" { (k) }
            }
            dt { "priority" } dd { (v.priority) }
            dt { "attempts" } dd data-field="attempts" { (v.attempts) }
            @if let Some(w) = &v.waiting {
                dt { "waiting for" } dd data-field="waiting" { (w) }
            }
            @if let Some(p) = &v.progress {
                dt { "progress" } dd data-field="progress" { (p) }
            }
            @if let Some(w) = &v.worker {
                dt { (w.label) } dd data-field="owner" { (w.text()) }
            }
            @for (label, t) in v.times() {
                dt { (label) } dd { (t) }
            }
            @if let Some(k) = &v.idempotency_key {
                dt { "idempotency key" } dd { (k) }
            }
            @if let Some(e) = &v.last_error {
                dt { "last error" } dd class="err" { (e) }
            }
            @if let Some((b, progress)) = &v.batch {
                dt { "batch" }
                dd data-field="batch" {
                    (b)
                    @if let Some(p) = progress { " · " (p) }
                }
            }
            @if let Some(p) = &v.pipeline {
                dt { "pipeline" }
                dd { a id="pipeline-link" href={ "/pipeline?id=" (q(p)) } { (p) } }
            }
        }
    }
}

/// An admin's buttons: retry a dead job (or, in an ordered queue, skip it in its key's order),
/// cancel one that has not ended.
fn actions(v: &JobView, id: &str, ordered: bool) -> Markup {
    html! {
        div class="actions" {
            @if v.can_retry() {
                form method="post" action="/job/retry" {
                    input type="hidden" name="id" value=(id);
                    button id="retry" { "Retry" }
                }
            }
            // An ordered key's dead job may hold the key's later jobs: let it go.
            @if ordered && v.can_retry() && v.key.is_some() {
                form method="post" action="/job/skip" {
                    input type="hidden" name="id" value=(id);
                    button id="skip" title="let the key's later jobs run on; the job stays dead" { "Skip in key order" }
                }
            }
            @if v.can_cancel() {
                form method="post" action="/job/cancel" {
                    input type="hidden" name="id" value=(id);
                    button class="danger" id="cancel" { "Cancel" }
                }
            }
        }
    }
}

/// The job's ended attempts (this page of them).
fn attempts_table(v: &JobView) -> Markup {
    html! {
        h2 { "Attempts" }
        table id="attempts" {
            thead {
                tr {
                    th class="n" { "#" } th class="n" { "lease" } th { "worker" }
                    th { "started (UTC)" } th class="n" { "took" } th { "outcome" } th { "error" }
                }
            }
            tbody {
                @for a in &v.history {
                    tr data-id=(a.attempt) {
                        td class="n" { (a.attempt) }
                        td class="n" { (a.lease) }
                        td { (a.worker.as_deref().unwrap_or("")) }
                        td { (a.started_at.as_deref().unwrap_or("")) }
                        td class="n" { (a.took) }
                        td { (a.outcome) }
                        td class="err" { (a.error.as_deref().unwrap_or("")) }
                    }
                }
                @if v.history.is_empty() {
                    tr { td colspan="7" class="muted" { "no attempt finished yet" } }
                }
            }
        }
    }
}
