//! `/pipeline?id=`: every job chained with `then` and `depends_on` to the one named, a page
//! at a time, with its state, parents and result (what the jobs after it receive); a summary
//! per status; for an admin, the button
//! that cancels every unfinished job of it.

use super::super::auth::Viewer;
use super::super::layout::{flash, more_link, page as layout, rows_of, status_badge};
use super::super::{q, PAGE};
use super::job::no_such_job;
use crate::job::JobStatus;
use crate::store::PipelineJob;
use crate::view::{cut, RESULT_SHOWN};
use crate::worker::Shared;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use maud::{html, Markup};
use std::collections::HashMap;
use std::sync::Arc;

/// A `<us>:<id>` page key (a time in microseconds since the epoch, and an id).
pub(super) fn time_key(p: &HashMap<String, String>, name: &str) -> Option<(i64, String)> {
    let (us, id) = p.get(name)?.split_once(':')?;
    Some((us.parse().ok()?, id.to_string()))
}

pub(crate) async fn page(
    viewer: Viewer,
    State(shared): State<Arc<Shared>>,
    Query(p): Query<HashMap<String, String>>,
) -> Response {
    let id = p.get("id").cloned().unwrap_or_default();
    let after = time_key(&p, "after");
    let title = format!("Pipeline of {id}");
    let read = shared
        .store
        .dashboard_pipeline(&id, after.as_ref().map(|(us, a)| (*us, a.as_str())), PAGE)
        .await;
    let page_rows = match rows_of(viewer, "jobs", &title, read) {
        Ok(r) => r,
        Err(refused) => return *refused,
    };
    let read = shared.store.dashboard_pipeline_counts(&id).await;
    let counts = match rows_of(viewer, "jobs", &title, read) {
        Ok(r) => r,
        Err(refused) => return *refused,
    };
    if counts.is_empty() {
        return no_such_job(viewer, &id);
    }
    let next = page_rows
        .last()
        .map(|(us, j)| {
            format!(
                "/pipeline?id={}&after={}",
                q(&id),
                q(&format!("{us}:{}", j.id))
            )
        })
        .unwrap_or_default();
    let unfinished = counts
        .iter()
        .any(|(s, _)| JobStatus::parse(s).is_some_and(|s| !s.is_terminal()));
    let total: i64 = counts.iter().map(|(_, n)| n).sum();
    let body = html! {
        (flash(&p))
        p id="pipeline-summary" {
            (total) " jobs: "
            @for (i, (s, n)) in counts.iter().enumerate() {
                @if i > 0 { ", " }
                (n) " " (status_badge(s))
            }
        }
        (jobs_table(page_rows.iter().map(|(_, j)| j)))
        (more_link("next", page_rows.len() as i64 >= PAGE, &next, &format!("next {PAGE} jobs of the pipeline")))
        @if unfinished && viewer.admin {
            div class="actions" {
                form method="post" action="/pipeline/cancel" {
                    input type="hidden" name="id" value=(id);
                    button class="danger" id="cancel-pipeline" { "Cancel every unfinished job" }
                }
            }
        }
    };
    layout(viewer, "jobs", &title, body).into_response()
}

/// The pipeline's jobs with the ones each waits for ("after").
fn jobs_table<'a>(jobs: impl Iterator<Item = &'a PipelineJob>) -> Markup {
    html! {
        table id="pipeline" {
            thead {
                tr {
                    th { "job" } th { "queue" } th { "status" } th class="n" { "attempts" }
                    th { "after" } th { "result" } th { "created (UTC)" } th { "finished (UTC)" }
                    th { "last error" }
                }
            }
            tbody {
                @for j in jobs {
                    tr data-id=(j.id) {
                        td { a href={ "/job?id=" (q(&j.id)) } { (j.id) } }
                        td { (j.queue) }
                        td { (status_badge(&j.status)) }
                        td class="n" { (j.attempts) "/" (j.max_attempts) }
                        td { (after(j)) }
                        td class="result" {
                            @if let Some(r) = &j.result {
                                code title=(cut(&r.to_string(), 4096)) { (cut(&r.to_string(), RESULT_SHOWN)) }
                            }
                        }
                        td { (j.created_at) }
                        td { (j.completed_at.as_deref().unwrap_or("")) }
                        td class="err" { (j.last_error.as_deref().unwrap_or("")) }
                    }
                }
            }
        }
    }
}

/// The parents a job waits for (links), and the `then` jobs not created yet.
fn after(j: &PipelineJob) -> Markup {
    html! {
        @for (i, p) in j.parents.iter().enumerate() {
            @if i > 0 { ", " }
            a href={ "/job?id=" (q(p)) } { (p) }
        }
        @if j.pending_then > 0 {
            " "
            span class="muted" { "(then " (j.pending_then) " more)" }
        }
    }
}
