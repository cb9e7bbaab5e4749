//! The web dashboard (`[dashboard] listen`): server-rendered pages over the same tables the
//! CLI reads, every list a page of at most 50 rows with a link to the next (queues, jobs,
//! dead letters, workers, scheduled jobs, cron schedules, a job's attempts, a pipeline), read
//! through an index and stopped at [`DASHBOARD_QUERY_LIMIT`] (a text search that matches
//! nothing would walk the whole table: the page says so and how to narrow it), assets inline
//! (no CDN). Served by [`super::listener`], forms at most 64 KiB.
//!
//! - `/` overview per queue, refreshed every 2 s from `/fragments/overview`;
//! - `/jobs` filter by queue, status and text in the id or last error; `/job?id=` a job with
//!   its payload, every attempt, progress, owner and heartbeat, and what it waits for;
//! - `/dead` the dead-letter queue, with retry and discard, one, several or a whole queue;
//! - `/workers`, `/scheduled` (scheduled jobs and cron schedules with their next fires);
//! - `/jobs/bulk` (admin) cancel, retry or discard every job the `/jobs` filter matches,
//!   after a count, recorded with the admin token's name;
//! - `/charts` per queue the last hour or day as small SVG charts (completed, failed, wait).
//!
//! Read-only unless `dashboard.admin_token` is set and the visitor gave it (`POST /login`
//! sets an HttpOnly, SameSite=Strict cookie; API clients may send `Authorization: Bearer`).
//!
//! Every page is a [`maud`] template: a value put in one is escaped, whatever it holds (a job
//! id, a payload, an error, a queue or worker name), so no page depends on someone
//! remembering to escape. Who may act is an extractor ([`auth::Admin`]): an action handler
//! that takes one cannot run for a visitor who is not an admin.
//!
//! - [`auth`]: the admin session, login and logout, [`auth::Admin`] and [`auth::Viewer`];
//! - [`layout`]: the page around every view, banners, paging links;
//! - [`pages`]: one module per view;
//! - [`actions`]: retry, discard and cancel, and what they say back.
//!
//! [`DASHBOARD_QUERY_LIMIT`]: crate::store::DASHBOARD_QUERY_LIMIT

mod actions;
mod auth;
mod bulk;
mod layout;
mod pages;

use super::Shared;
use axum::extract::FromRef;
use axum::routing::{get, post};
use axum::Router;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Rows on one page of any list.
const PAGE: i64 = 50;

/// What every handler can ask for: the worker's shared state, and the admin session's
/// settings (read once from the configuration).
#[derive(Clone)]
struct Dash {
    shared: Arc<Shared>,
    auth: auth::Auth,
}

impl FromRef<Dash> for Arc<Shared> {
    fn from_ref(d: &Dash) -> Arc<Shared> {
        d.shared.clone()
    }
}

impl FromRef<Dash> for auth::Auth {
    fn from_ref(d: &Dash) -> auth::Auth {
        d.auth.clone()
    }
}

pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    shared: Arc<Shared>,
    cancel: CancellationToken,
) {
    super::listener::serve("dashboard", listener, router(shared), cancel).await;
}

/// Every route of the dashboard.
fn router(shared: Arc<Shared>) -> Router {
    let auth = auth::Auth::new(&shared.config.dashboard.named_admin_tokens());
    Router::new()
        .route("/", get(pages::overview::page))
        .route("/fragments/overview", get(pages::overview::fragment))
        .route("/charts", get(pages::charts::page))
        .route("/jobs", get(pages::jobs::jobs))
        .route("/jobs/bulk", post(bulk::bulk))
        .route("/job", get(pages::job::page))
        .route("/job/retry", post(actions::job_retry))
        .route("/job/cancel", post(actions::job_cancel))
        .route("/job/skip", post(actions::job_skip))
        .route("/pipeline", get(pages::pipeline::page))
        .route("/pipeline/cancel", post(actions::pipeline_cancel))
        .route("/dead", get(pages::jobs::dead))
        .route("/dead/retry", post(actions::dead_retry))
        .route("/dead/discard", post(actions::dead_discard))
        .route("/queue/pause", post(actions::queue_pause))
        .route("/queue/resume", post(actions::queue_resume))
        .route("/workers", get(pages::workers::page))
        .route("/scheduled", get(pages::scheduled::page))
        .route("/login", post(auth::login))
        .route("/logout", post(auth::logout))
        .with_state(Dash { shared, auth })
}

/// Escapes text for a URL query value (the template then escapes the URL for its attribute).
fn q(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_query_value_is_percent_encoded() {
        assert_eq!(super::q("a b/c&d"), "a+b%2Fc%26d");
    }
}
