//! The page around every view (header, navigation, the admin's log-in or log-out form), and
//! the pieces several views share: the action banner, the paging link, the job table, the
//! answers for a database that failed or was too slow.

use super::actions::Done;
use super::auth::Viewer;
use super::q;
use crate::store::{Bounded, JobSummary, StoreError, DASHBOARD_QUERY_LIMIT};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::{html, Markup, PreEscaped, DOCTYPE};
use std::collections::HashMap;

/// The dashboard's style sheet, inline (no CDN).
const STYLE: &str = r#"
*{box-sizing:border-box}body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:10px 20px;display:flex;gap:18px;align-items:center;flex-wrap:wrap}
header a{color:#cfd6e4;text-decoration:none}header a.on,header a:hover{color:#fff}header b{margin-right:10px}
header form{margin-left:auto;display:flex;gap:6px}header .who{margin-left:auto;color:#9fb0c8}
main{padding:16px 20px;max-width:1400px}h1{font-size:20px;margin:4px 0 14px}h2{font-size:16px;margin:20px 0 8px}
table{border-collapse:collapse;width:100%;background:#fff;box-shadow:0 1px 2px rgba(0,0,0,.06)}
th,td{padding:6px 10px;border-bottom:1px solid #e7e9ee;text-align:left;vertical-align:top}
th{background:#eef0f4;font-weight:600;white-space:nowrap}td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}
tr:hover td{background:#fafbfd}a{color:#2456c9}pre{background:#fff;border:1px solid #e7e9ee;padding:10px;overflow:auto;max-height:420px}
.s{display:inline-block;padding:1px 7px;border-radius:9px;font-size:12px;background:#e7e9ee}
.s-completed{background:#d8f3df}.s-dead{background:#fbd9d9}.s-processing{background:#dce7fb}.s-queued{background:#fdf0cf}
.s-scheduled{background:#ece1fb}.s-cancelled{background:#e2e2e2}.bad{color:#b42318;font-weight:600}
.err{color:#b42318;max-width:520px;overflow:hidden;text-overflow:ellipsis}
form.filters{display:flex;gap:8px;margin-bottom:12px;flex-wrap:wrap}input,select,button{font:inherit;padding:4px 8px}
button{background:#2456c9;color:#fff;border:0;border-radius:4px;cursor:pointer}button.danger{background:#b42318}
.msg{background:#fff7d6;border:1px solid #f0d98c;padding:8px 12px;margin-bottom:12px}
dl{display:grid;grid-template-columns:max-content 1fr;gap:4px 16px;background:#fff;padding:12px;margin:0}dt{color:#5b6474}
.muted{color:#8a93a3}.actions{display:flex;gap:8px;margin:10px 0}
"#;

/// The navigation: key, address, label.
const LINKS: [(&str, &str, &str); 6] = [
    ("overview", "/", "Overview"),
    ("charts", "/charts", "Charts"),
    ("jobs", "/jobs", "Jobs"),
    ("dead", "/dead", "Dead letters"),
    ("workers", "/workers", "Workers"),
    ("scheduled", "/scheduled", "Scheduled"),
];

/// A whole page: `nav` is the key of the navigation link to mark.
pub(super) fn page(viewer: Viewer, nav: &str, title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width,initial-scale=1";
                title { (title) " · jobwarden" }
                // Not escaped: STYLE is this file's own constant, nothing from a request.
                style { (PreEscaped(STYLE)) }
            }
            body {
                header {
                    b { "jobwarden" }
                    @for (key, href, label) in LINKS {
                        a href=(href) class=[(key == nav).then_some("on")] { (label) }
                    }
                    (who(viewer))
                }
                main {
                    h1 { (title) }
                    (body)
                }
            }
        }
    }
}

/// The header's right end: who the visitor is, and the form to log in or out.
fn who(viewer: Viewer) -> Markup {
    html! {
        @if !viewer.can_log_in {
            span class="who" { "read-only (no admin_token configured)" }
        } @else if viewer.admin {
            form method="post" action="/logout" {
                span class="who" { "admin" }
                button { "Log out" }
            }
        } @else {
            form method="post" action="/login" {
                input type="password" name="token" placeholder="admin token" aria-label="admin token";
                button { "Log in" }
            }
        }
    }
}

/// The banner saying what the action that sent the visitor here did (`done` and `n` in the
/// query; any other text in the URL is never shown).
pub(super) fn flash(params: &HashMap<String, String>) -> Markup {
    let Some(done) = params.get("done").and_then(|c| Done::from_code(c)) else {
        return html! {};
    };
    let n = params.get("n").and_then(|n| n.parse().ok()).unwrap_or(0);
    html! { div class="msg" id="msg" { (done.text(n)) } }
}

/// The answer when PostgreSQL failed.
pub(super) fn failed(e: impl std::fmt::Display) -> Response {
    let body = html! { p { "PostgreSQL did not answer: " (e.to_string()) } };
    (StatusCode::SERVICE_UNAVAILABLE, body).into_response()
}

/// The page for a list PostgreSQL stopped at the time limit (a text search that matches
/// nothing walks the whole table).
fn too_slow(viewer: Viewer, nav: &str, title: &str) -> Response {
    let body = html! {
        div class="msg" id="too-slow" {
            "This list took longer than " (DASHBOARD_QUERY_LIMIT.as_secs()) " s to read and was \
             stopped. Narrow it: pick a queue or a status, or search for a longer text."
        }
    };
    let page = page(viewer, nav, title, body);
    (StatusCode::SERVICE_UNAVAILABLE, page).into_response()
}

/// A page's rows, or the response to send instead (PostgreSQL failed, or was too slow).
pub(super) fn rows_of<T>(
    viewer: Viewer,
    nav: &str,
    title: &str,
    read: Result<Bounded<T>, StoreError>,
) -> Result<T, Box<Response>> {
    match read {
        Ok(Bounded::Done(rows)) => Ok(rows),
        Ok(Bounded::TooSlow) => Err(Box::new(too_slow(viewer, nav, title))),
        Err(e) => Err(Box::new(failed(e))),
    }
}

/// The link to the next page of a list: shown when this page is full.
pub(super) fn more_link(id: &str, full: bool, href: &str, label: &str) -> Markup {
    html! {
        @if full {
            p { a id=(id) href=(href) { (label) " →" } }
        }
    }
}

/// A job's status as a coloured badge.
pub(super) fn status_badge(s: &str) -> Markup {
    html! { span class={ "s s-" (s) } { (s) } }
}

/// A list of jobs (`check`: with a checkbox per row, for the dead-letter form).
pub(super) fn job_table(rows: &[JobSummary], check: bool) -> Markup {
    html! {
        table id="jobs" {
            thead {
                tr {
                    @if check { th {} }
                    th { "id" } th { "queue" } th { "status" } th class="n" { "priority" }
                    th class="n" { "attempts" } th { "worker" } th { "last error" }
                    th { "updated (UTC)" }
                }
            }
            tbody {
                @for j in rows {
                    tr data-id=(j.id) {
                        @if check {
                            td { input type="checkbox" name="id" value=(j.id) aria-label="select"; }
                        }
                        td { a href={ "/job?id=" (q(&j.id)) } { (j.id) } }
                        td { (j.queue) }
                        td { (status_badge(&j.status)) }
                        td class="n" { (j.priority) }
                        td class="n" { (j.attempts) "/" (j.max_attempts) }
                        td { (j.worker_id.as_deref().unwrap_or("")) }
                        td class="err" { (j.last_error.as_deref().unwrap_or("")) }
                        td { (j.updated_at) }
                    }
                }
                @if rows.is_empty() {
                    tr { td colspan="9" class="muted" { "no jobs match" } }
                }
            }
        }
    }
}
