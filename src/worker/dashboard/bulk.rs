//! `POST /jobs/bulk`: an admin cancels, retries or discards every job matching the `/jobs`
//! filter (queue, status, text) and a range of enqueue times. The first post counts and asks
//! to confirm, showing the count; the confirming post carries that count, and the action
//! takes at most that many jobs, in batches, recorded in `bulk_actions` under the admin
//! token's name (`dashboard:<name>`).

use super::actions::{back, ActionForm, Done};
use super::auth::{Admin, Viewer};
use super::layout::{failed, page};
use super::q;
use crate::job::JobStatus;
use crate::store::{parse_when, BulkAction, BulkFilter};
use crate::worker::Shared;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::{html, Markup};
use serde::Deserialize;
use std::sync::Arc;
use std::time::SystemTime;
use tracing::info;

/// The bulk form (the `/jobs` filter's fields, the action, the times, the count confirmed).
#[derive(Deserialize, Default)]
pub(super) struct BulkForm {
    #[serde(default)]
    action: String,
    #[serde(default)]
    status: String,
    #[serde(default)]
    queue: String,
    #[serde(default)]
    q: String,
    #[serde(default)]
    since: String,
    #[serde(default)]
    until: String,
    /// The count the admin confirmed (absent: count and ask).
    #[serde(default)]
    expect: Option<i64>,
}

fn some(s: &str) -> Option<String> {
    Some(s.trim().to_string()).filter(|s| !s.is_empty())
}

impl BulkForm {
    /// The action and filter the form names, or what is wrong with it.
    fn read(&self) -> Result<(BulkAction, BulkFilter), String> {
        let action = BulkAction::parse(&self.action).ok_or_else(|| {
            format!(
                "action {:?} is not one of cancel, retry, discard",
                clip(&self.action)
            )
        })?;
        let status = JobStatus::parse(self.status.trim()).ok_or_else(|| {
            format!(
                "pick a status in the filter first ({:?} is not one): a bulk {} takes {}",
                clip(&self.status),
                action.as_str(),
                action
                    .statuses()
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(" or ")
            )
        })?;
        action.check(status)?;
        let now = SystemTime::now();
        let when = |field: &str, v: &str| {
            some(v)
                .map(|t| parse_when(&t, now).map_err(|e| format!("{field}: {e}")))
                .transpose()
        };
        let since = when("enqueued from", &self.since)?;
        let until = when("enqueued before", &self.until)?;
        if let (Some(s), Some(u)) = (since, until) {
            if s >= u {
                return Err(
                    "\"enqueued from\" is not before \"enqueued before\": no job can match".into(),
                );
            }
        }
        Ok((
            action,
            BulkFilter {
                status,
                queue: some(&self.queue),
                since,
                until,
                text: some(&self.q),
            },
        ))
    }

    /// The `/jobs` page of this filter.
    fn jobs_page(&self) -> String {
        format!(
            "/jobs?queue={}&status={}&q={}",
            q(self.queue.trim()),
            q(self.status.trim()),
            q(self.q.trim())
        )
    }
}

/// A value from the form, shortened for a message.
fn clip(s: &str) -> String {
    s.chars().take(40).collect()
}

pub(super) async fn bulk(
    admin: Admin,
    State(shared): State<Arc<Shared>>,
    ActionForm(f): ActionForm<BulkForm>,
) -> Response {
    let viewer = Viewer {
        admin: true,
        can_log_in: true,
    };
    let (action, filter) = match f.read() {
        Ok(a) => a,
        Err(why) => return refuse(viewer, &format!("{why}; nothing changed")),
    };
    let matched = match shared.store.bulk_count(&filter).await {
        Ok(n) => n,
        Err(e) => return failed(e),
    };
    if matched == 0 {
        return refuse(
            viewer,
            &format!(
                "no job matches {}: nothing to {}; nothing changed",
                filter.describe(),
                action.as_str()
            ),
        );
    }
    let Some(expect) = f.expect else {
        return page(
            viewer,
            "jobs",
            "Bulk action",
            confirm(&f, action, &filter, matched),
        )
        .into_response();
    };
    let by = admin.who();
    match shared
        .store
        .bulk_run(action, &filter, &by, expect.clamp(0, matched))
        .await
    {
        Ok(r) => {
            info!(bulk_action = r.id, action = action.as_str(), %by, matched = r.matched,
                  changed = r.changed, "dashboard: bulk action");
            back(&f.jobs_page(), Done::Bulk, r.changed as usize)
        }
        Err(e) => failed(e),
    }
}

/// The page that asks to confirm, with the count.
fn confirm(f: &BulkForm, action: BulkAction, filter: &BulkFilter, matched: i64) -> Markup {
    html! {
        div class="msg" id="bulk-count" data-matched=(matched) {
            (matched) " jobs match " (filter.describe()) "."
        }
        form method="post" action="/jobs/bulk" class="actions" {
            input type="hidden" name="action" value=(action.as_str());
            input type="hidden" name="status" value=(f.status.trim());
            input type="hidden" name="queue" value=(f.queue.trim());
            input type="hidden" name="q" value=(f.q.trim());
            input type="hidden" name="since" value=(f.since.trim());
            input type="hidden" name="until" value=(f.until.trim());
            input type="hidden" name="expect" value=(matched);
            button id="bulk-confirm" class="danger" {
                (action.as_str()) " " (matched) " jobs"
            }
            a href=(f.jobs_page()) { "back, nothing changed" }
        }
        p class="muted" {
            "At most " (matched) " jobs are taken, in batches of " (crate::store::BULK_BATCH)
            "; the action is recorded in bulk_actions with your token's name."
        }
    }
}

fn refuse(viewer: Viewer, why: &str) -> Response {
    let body = html! { div class="msg bad" id="bulk-refused" { (why) } };
    (
        StatusCode::BAD_REQUEST,
        page(viewer, "jobs", "Bulk action", body),
    )
        .into_response()
}

/// The admin's bulk form under the `/jobs` filter: acts on every job the filter matches
/// (not only the page), after a count.
pub(super) fn form(queue: Option<&str>, status: Option<&str>, text: Option<&str>) -> Markup {
    html! {
        form method="post" action="/jobs/bulk" class="filters" id="bulk" {
            input type="hidden" name="queue" value=(queue.unwrap_or(""));
            input type="hidden" name="status" value=(status.unwrap_or(""));
            input type="hidden" name="q" value=(text.unwrap_or(""));
            select name="action" aria-label="bulk action" {
                option value="cancel" { "cancel" }
                option value="retry" { "retry" }
                option value="discard" { "discard" }
            }
            " every job matching this filter, enqueued from "
            input name="since" placeholder="e.g. 2h or 2026-11-27T14:00:00Z" aria-label="enqueued from";
            " before "
            input name="until" placeholder="(now)" aria-label="enqueued before";
            button { "Count…" }
        }
    }
}
