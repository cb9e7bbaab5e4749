//! `/jobs` (filtered by queue, status and text in the id or last error) and `/dead`, the
//! dead-letter queue, where an admin retries or discards some dead jobs or a whole queue's.

use super::super::auth::Viewer;
use super::super::layout::{flash, job_table, page, rows_of};
use super::super::{q, PAGE};
use crate::job::JobStatus;
use crate::store::{JobFilter, JobSummary};
use crate::worker::Shared;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use maud::{html, Markup};
use std::collections::HashMap;
use std::sync::Arc;

/// The statuses the filter offers, in the order a job meets them.
const STATUSES: [JobStatus; 7] = [
    JobStatus::Queued,
    JobStatus::Scheduled,
    JobStatus::Processing,
    JobStatus::Awaiting,
    JobStatus::Completed,
    JobStatus::Dead,
    JobStatus::Cancelled,
];

/// The filter a query asks for (blank values are no filter).
fn filter_of(p: &HashMap<String, String>) -> JobFilter {
    let get = |k: &str| {
        p.get(k)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    JobFilter {
        queue: get("queue"),
        status: get("status"),
        text: get("q"),
        after: get("after"),
    }
}

/// The link to the next page (when this one is full), with the same filter.
fn next_link(base: &str, f: &JobFilter, rows: &[JobSummary]) -> Markup {
    let last = rows.last().map(|r| r.id.as_str()).unwrap_or("");
    let href = format!(
        "{base}?queue={}&status={}&q={}&after={}",
        q(f.queue.as_deref().unwrap_or("")),
        q(f.status.as_deref().unwrap_or("")),
        q(f.text.as_deref().unwrap_or("")),
        q(last)
    );
    html! {
        @if rows.len() as i64 >= PAGE {
            p { a id="next" href=(href) { "next " (PAGE) " →" } }
        }
    }
}

pub(crate) async fn jobs(
    viewer: Viewer,
    State(shared): State<Arc<Shared>>,
    Query(p): Query<HashMap<String, String>>,
) -> Response {
    let f = filter_of(&p);
    let read = shared.store.dashboard_jobs(&f, PAGE).await;
    let rows = match rows_of(viewer, "jobs", "Jobs", read) {
        Ok(r) => r,
        Err(refused) => return *refused,
    };
    let mut queues: Vec<&String> = shared.config.queues.keys().collect();
    queues.sort();
    let body = html! {
        (flash(&p))
        form class="filters" method="get" action="/jobs" {
            select name="queue" aria-label="queue" {
                option value="" { "any queue" }
                @for name in queues {
                    option selected[f.queue.as_ref() == Some(name)] { (name) }
                }
            }
            select name="status" aria-label="status" {
                option value="" { "any status" }
                @for s in STATUSES {
                    option selected[f.status.as_deref() == Some(s.as_str())] { (s.as_str()) }
                }
            }
            input name="q" placeholder="text in id or error" value=(f.text.as_deref().unwrap_or("")) aria-label="text";
            button { "Filter" }
        }
        @if viewer.admin {
            (super::super::bulk::form(f.queue.as_deref(), f.status.as_deref(), f.text.as_deref()))
        }
        (job_table(&rows, false))
        (next_link("/jobs", &f, &rows))
    };
    page(viewer, "jobs", "Jobs", body).into_response()
}

pub(crate) async fn dead(
    viewer: Viewer,
    State(shared): State<Arc<Shared>>,
    Query(p): Query<HashMap<String, String>>,
) -> Response {
    let mut f = filter_of(&p);
    f.status = Some(JobStatus::Dead.as_str().into());
    let read = shared.store.dashboard_jobs(&f, PAGE).await;
    let rows = match rows_of(viewer, "dead", "Dead letters", read) {
        Ok(r) => r,
        Err(refused) => return *refused,
    };
    let queue = f.queue.clone().unwrap_or_default();
    let body = html! {
        (flash(&p))
        form class="filters" method="get" action="/dead" {
            input name="queue" placeholder="queue" value=(queue) aria-label="queue";
            input name="q" placeholder="text in id or error" value=(f.text.as_deref().unwrap_or("")) aria-label="text";
            button { "Filter" }
        }
        @if viewer.admin {
            (dead_form(&queue, &f, &rows))
        } @else {
            (job_table(&rows, false))
            @if viewer.can_log_in {
                p class="muted" { "Log in with the admin token to retry or discard." }
            }
        }
        (next_link("/dead", &f, &rows))
    };
    page(viewer, "dead", "Dead letters", body).into_response()
}

/// The admin's dead-letter table: a checkbox per job, and the buttons that act on the
/// checked ones or (for a queue, without a text filter) on every dead job of the queue.
fn dead_form(queue: &str, f: &JobFilter, rows: &[JobSummary]) -> Markup {
    // Acting on a whole queue ignores the text filter: offered only without one.
    let all = !queue.is_empty() && f.text.is_none();
    html! {
        form method="post" id="dead-form" {
            input type="hidden" name="queue" value=(queue);
            div class="actions" {
                button formaction="/dead/retry" id="retry-selected" { "Retry selected" }
                button class="danger" formaction="/dead/discard" id="discard-selected" { "Discard selected" }
                @if all {
                    button name="all" value="1" formaction="/dead/retry" id="retry-all" {
                        "Retry every dead job of " (queue)
                    }
                    button class="danger" name="all" value="1" formaction="/dead/discard" id="discard-all" {
                        "Discard every dead job of " (queue)
                    }
                }
            }
            (job_table(rows, true))
        }
    }
}
