//! `/scheduled`: jobs waiting for their time (soonest first) and the cron schedules of the
//! configuration with their last and next fires, each a page at a time.

use super::super::auth::Viewer;
use super::super::layout::{more_link, page as layout, rows_of};
use super::super::{q, PAGE};
use super::pipeline::time_key;
use crate::cron::{CronConfig, Schedule};
use crate::store::{Bounded, ScheduledJob};
use crate::view::{secs, utc};
use crate::worker::Shared;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use maud::{html, Markup};
use std::collections::HashMap;
use std::sync::Arc;

pub(crate) async fn page(
    viewer: Viewer,
    State(shared): State<Arc<Shared>>,
    Query(p): Query<HashMap<String, String>>,
) -> Response {
    let after = time_key(&p, "after");
    let read = shared
        .store
        .dashboard_scheduled(after.as_ref().map(|(us, id)| (*us, id.as_str())), PAGE)
        .await;
    let rows = match rows_of(viewer, "scheduled", "Scheduled", read) {
        Ok(r) => r,
        Err(refused) => return *refused,
    };
    let cron_after = p.get("cron_after").cloned().unwrap_or_default();
    let next = rows
        .last()
        .map(|s| {
            format!(
                "/scheduled?after={}&cron_after={}",
                q(&format!("{}:{}", s.due_us, s.id)),
                q(&cron_after)
            )
        })
        .unwrap_or_default();
    let cron_table = crons(&shared, &cron_after).await;
    let body = html! {
        (scheduled_table(&rows))
        (more_link("next", rows.len() as i64 >= PAGE, &next, &format!("next {PAGE} scheduled jobs")))
        (cron_table)
    };
    layout(viewer, "scheduled", "Scheduled", body).into_response()
}

fn scheduled_table(rows: &[ScheduledJob]) -> Markup {
    html! {
        table id="scheduled" {
            thead {
                tr {
                    th { "id" } th { "queue" } th { "due (UTC)" } th class="n" { "due in" }
                    th class="n" { "attempts" } th { "last error" }
                }
            }
            tbody {
                @for s in rows {
                    tr data-id=(s.id) {
                        td { a href={ "/job?id=" (q(&s.id)) } { (s.id) } }
                        td { (s.queue) }
                        td { (s.due_at) }
                        td class="n" {
                            @if s.due_in_seconds <= 0.0 { "due" } @else { (secs(Some(s.due_in_seconds))) }
                        }
                        td class="n" { (s.attempts) "/" (s.max_attempts) }
                        td class="err" { (s.last_error.as_deref().unwrap_or("")) }
                    }
                }
                @if rows.is_empty() {
                    tr { td colspan="6" class="muted" { "nothing scheduled" } }
                }
            }
        }
    }
}

/// The cron schedules after `cron_after`: they come from the configuration (a BTreeMap: in
/// name order), a page at a time too; their last fires are read for the page's names only.
async fn crons(shared: &Shared, cron_after: &str) -> Markup {
    let crons: Vec<(&String, &CronConfig)> = shared
        .config
        .cron
        .iter()
        .filter(|(name, _)| name.as_str() > cron_after)
        .take(PAGE as usize)
        .collect();
    let names: Vec<&str> = crons.iter().map(|(n, _)| n.as_str()).collect();
    let last: HashMap<String, String> = match shared.store.dashboard_cron_fires(&names).await {
        Ok(Bounded::Done(fires)) => fires.into_iter().map(|(n, t)| (n, utc(t))).collect(),
        Ok(Bounded::TooSlow) | Err(_) => HashMap::new(),
    };
    let now = chrono::Utc::now();
    let next_fires = |name: &str, c: &CronConfig| {
        Schedule::new(name, c)
            .map(|s| {
                s.next_fires(now, 3)
                    .into_iter()
                    .map(utc)
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default()
    };
    let next = crons
        .last()
        .map(|(n, _)| format!("/scheduled?cron_after={}", q(n)))
        .unwrap_or_default();
    html! {
        h2 { "Cron schedules" }
        table id="cron" {
            thead {
                tr {
                    th { "name" } th { "schedule" } th { "time zone" } th { "queue" }
                    th { "last fire (UTC)" } th { "next fires (UTC)" }
                }
            }
            tbody {
                @for (name, c) in &crons {
                    tr data-id=(name) {
                        td { (name) }
                        td { code { (c.schedule) } }
                        td { (c.timezone) }
                        td { (c.queue) }
                        td { (last.get(name.as_str()).map(String::as_str).unwrap_or("never")) }
                        td { (next_fires(name, c)) }
                    }
                }
                @if crons.is_empty() {
                    tr { td colspan="6" class="muted" { "no cron schedule configured" } }
                }
            }
        }
        (more_link("next-cron", crons.len() as i64 >= PAGE, &next, &format!("next {PAGE} cron schedules")))
    }
}
