//! `/workers`: every worker process that has not stopped, with its heartbeat and the jobs it
//! holds, a page at a time.

use super::super::auth::Viewer;
use super::super::layout::{more_link, page as layout, rows_of};
use super::super::{q, PAGE};
use crate::view::secs;
use crate::worker::Shared;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use maud::html;
use std::collections::HashMap;
use std::sync::Arc;

pub(crate) async fn page(
    viewer: Viewer,
    State(shared): State<Arc<Shared>>,
    Query(p): Query<HashMap<String, String>>,
) -> Response {
    let after = p.get("after").cloned().unwrap_or_default();
    let read = shared.store.dashboard_workers(&after, PAGE).await;
    let rows = match rows_of(viewer, "workers", "Workers", read) {
        Ok(r) => r,
        Err(refused) => return *refused,
    };
    let next = rows
        .last()
        .map(|w| format!("/workers?after={}", q(&w.id)))
        .unwrap_or_default();
    let body = html! {
        table id="workers" {
            thead {
                tr {
                    th { "worker" } th { "host" } th class="n" { "pid" } th { "version" }
                    th class="n" { "up" } th class="n" { "heartbeat" }
                    th class="n" { "jobs in flight" } th { "state" }
                }
            }
            tbody {
                @for w in &rows {
                    @let state = w.state();
                    tr data-id=(w.id) {
                        td { (w.id) }
                        td { (w.hostname) }
                        td class="n" { (w.pid) }
                        td { (w.version) }
                        td class="n" { (secs(Some(w.up_seconds))) }
                        td class="n" data-field="heartbeat" { (secs(Some(w.heartbeat_age_seconds))) " ago" }
                        td class="n" data-field="in_flight" { (w.in_flight) }
                        td class=[(state != "alive").then_some("bad")] { (state) }
                    }
                }
                @if rows.is_empty() {
                    tr { td colspan="8" class="muted" { "no worker is running" } }
                }
            }
        }
        (more_link("next", rows.len() as i64 >= PAGE, &next, &format!("next {PAGE} workers")))
    };
    layout(viewer, "workers", "Workers", body).into_response()
}
