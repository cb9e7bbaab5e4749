//! `/`: one row per queue (counts, throughput and failure rate of the last minute, run
//! times, the oldest waiting job), redrawn every 2 s from `/fragments/overview`.

use super::super::auth::Viewer;
use super::super::layout::{failed, flash, more_link, page as layout, rows_of};
use super::super::{q, PAGE};
use crate::store::{Bounded, BusyKey, Pause, QueueOverview, BUSIEST_KEYS};
use crate::view::secs;
use crate::worker::Shared;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::{html, Markup, PreEscaped};
use std::collections::HashMap;
use std::sync::Arc;

/// Fetches the table's rows every 2 s and puts them in place (the same query string, so the
/// same page of queues).
const REFRESH: &str = "setInterval(async()=>{try{const r=await fetch('/fragments/overview'+location.search);\
if(r.ok){document.querySelector('#overview tbody').innerHTML=await r.text();\
document.getElementById('updated').textContent='updated '+new Date().toLocaleTimeString();}}catch(e){}},2000);";

pub(crate) async fn page(
    viewer: Viewer,
    State(shared): State<Arc<Shared>>,
    Query(p): Query<HashMap<String, String>>,
) -> Response {
    let after = p.get("after").cloned().unwrap_or_default();
    let read = shared.store.dashboard_overview(&after, PAGE).await;
    let rows = match rows_of(viewer, "overview", "Queues", read) {
        Ok(r) => r,
        Err(refused) => return *refused,
    };
    let next = rows
        .last()
        .map(|r| format!("/?after={}", q(&r.queue)))
        .unwrap_or_default();
    let full = rows.len() as i64 >= PAGE;
    let paused = match shared.store.paused_queues().await {
        Ok(p) => p,
        Err(e) => return failed(e),
    };
    let busiest = match shared.store.key_busiest(None, BUSIEST_KEYS).await {
        Ok(b) => b,
        Err(e) => return failed(e),
    };
    let body = html! {
        (flash(&p))
        table id="overview" {
            thead {
                tr {
                    th { "queue" } th class="n" { "queued" } th class="n" { "scheduled" }
                    th class="n" { "running" } th class="n" { "throughput (last min)" }
                    th class="n" { "failure rate" } th class="n" { "p50 run" }
                    th class="n" { "p95 run" } th class="n" { "dead" }
                    th class="n" { "oldest waiting" }
                }
            }
            tbody { (overview_rows(&rows, &paused, viewer.admin)) }
        }
        (more_link("next", full, &next, &format!("next {PAGE} queues")))
        (busiest_keys(&busiest))
        p class="muted" id="updated" { "updated live every 2 s" }
        // Not escaped: REFRESH is this file's own constant script, nothing from a request.
        script { (PreEscaped(REFRESH)) }
    };
    layout(viewer, "overview", "Queues", body).into_response()
}

/// The overview's rows alone, for the page's own refresh.
pub(crate) async fn fragment(
    viewer: Viewer,
    State(shared): State<Arc<Shared>>,
    Query(p): Query<HashMap<String, String>>,
) -> Response {
    let after = p.get("after").cloned().unwrap_or_default();
    let paused = match shared.store.paused_queues().await {
        Ok(p) => p,
        Err(e) => return failed(e),
    };
    match shared.store.dashboard_overview(&after, PAGE).await {
        Ok(Bounded::Done(rows)) => overview_rows(&rows, &paused, viewer.admin).into_response(),
        Ok(Bounded::TooSlow) => (StatusCode::SERVICE_UNAVAILABLE, "too slow").into_response(),
        Err(e) => failed(e),
    }
}

fn overview_rows(rows: &[QueueOverview], paused: &[Pause], admin: bool) -> Markup {
    html! {
        @if rows.is_empty() {
            tr { td colspan="10" class="muted" { "no jobs yet" } }
        }
        @for r in rows {
            @let pause = paused.iter().find(|p| p.queue == r.queue);
            tr {
                td {
                    a href={ "/jobs?queue=" (q(&r.queue)) } { (r.queue) }
                    @if let Some(p) = pause {
                        " " span class="bad paused" data-queue=(r.queue) {
                            "paused " (crate::view::ago(p.for_seconds)) " ago by " (p.by)
                            @if let Some(why) = &p.reason { ": " (why) }
                        }
                    }
                    @if admin {
                        (pause_form(&r.queue, pause.is_some()))
                    }
                }
                (cell(r, "queued", html! { (r.queued) }))
                (cell(r, "scheduled", html! { (r.scheduled) }))
                (cell(r, "running", html! { (r.running) }))
                (cell(r, "throughput", html! { (format!("{:.1}/s", r.throughput())) }))
                (cell(r, "failure_rate", failure_rate(r.failure_rate())))
                (cell(r, "p50", html! { (secs(r.p50_run_seconds)) }))
                (cell(r, "p95", html! { (secs(r.p95_run_seconds)) }))
                (cell(r, "dead", dead(r)))
                (cell(r, "oldest_queued", html! { (secs(r.oldest_queued_seconds)) }))
            }
        }
    }
}

/// The busiest keys of each keyed queue (the longest backlog first), as the page was drawn.
fn busiest_keys(rows: &[BusyKey]) -> Markup {
    html! {
        @if !rows.is_empty() {
            h2 { "Busiest keys" }
            table id="busiest-keys" {
                thead {
                    tr { th { "queue" } th { "key" } th class="n" { "parked" } th class="n" { "running" } }
                }
                tbody {
                    @for b in rows {
                        tr data-queue=(b.queue) data-key=(b.key) {
                            td { (b.queue) }
                            td {
                                @if b.key.is_empty() {
                                    span class="muted" { "(no key)" }
                                } @else {
                                    (b.key)
                                }
                            }
                            td class="n" data-field="parked" { (b.parked) }
                            td class="n" data-field="running" { (b.running) }
                        }
                    }
                }
            }
        }
    }
}

/// The admin's button that pauses a queue (with a reason) or resumes it.
fn pause_form(queue: &str, paused: bool) -> Markup {
    html! {
        @if paused {
            form method="post" action="/queue/resume" class="inline" {
                input type="hidden" name="queue" value=(queue);
                button data-queue=(queue) { "Resume" }
            }
        } @else {
            form method="post" action="/queue/pause" class="inline" {
                input type="hidden" name="queue" value=(queue);
                input type="text" name="reason" placeholder="why" aria-label="why pause";
                button data-queue=(queue) { "Pause" }
            }
        }
    }
}

/// One number of a queue's row, named for the tests and the refresh.
fn cell(r: &QueueOverview, field: &str, v: Markup) -> Markup {
    html! { td class="n" data-queue=(r.queue) data-field=(field) { (v) } }
}

fn failure_rate(rate: f64) -> Markup {
    html! {
        @if rate > 0.0 {
            span class="bad" { (format!("{:.1}%", rate * 100.0)) }
        } @else {
            "0%"
        }
    }
}

/// The dead count, a link to the queue's dead letters when there are any.
fn dead(r: &QueueOverview) -> Markup {
    html! {
        @if r.dead > 0 {
            a class="bad" href={ "/dead?queue=" (q(&r.queue)) } { (r.dead) }
        } @else {
            "0"
        }
    }
}
