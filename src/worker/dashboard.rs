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
//! - `/workers`, `/scheduled` (scheduled jobs and cron schedules with their next fires).
//!
//! Read-only unless `dashboard.admin_token` is set and the visitor gave it (`POST /login`
//! sets an HttpOnly, SameSite=Strict cookie; API clients may send `Authorization: Bearer`).

use super::listener::{cross_site, LimitedBody};
use super::Shared;
use crate::store::{
    Bounded, JobFilter, JobSummary, QueueOverview, StoreError, DASHBOARD_QUERY_LIMIT,
};
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

const PAGE: i64 = 50;
/// The largest form accepted (a dead-letter page's 50 selected ids fit with room to spare).
const FORM_BODY_LIMIT: usize = 64 * 1024;
const COOKIE: &str = "jobwarden_admin";

pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    shared: Arc<Shared>,
    cancel: CancellationToken,
) {
    let app = Router::new()
        .route("/", get(overview))
        .route("/fragments/overview", get(overview_fragment))
        .route("/jobs", get(jobs))
        .route("/job", get(job))
        .route("/job/retry", post(job_retry))
        .route("/job/cancel", post(job_cancel))
        .route("/pipeline", get(pipeline))
        .route("/pipeline/cancel", post(pipeline_cancel))
        .route("/dead", get(dead))
        .route("/dead/retry", post(dead_retry))
        .route("/dead/discard", post(dead_discard))
        .route("/workers", get(workers))
        .route("/scheduled", get(scheduled))
        .route("/login", post(login))
        .route("/logout", post(logout))
        .with_state(shared);
    super::listener::serve("dashboard", listener, app, cancel).await;
}

/// Escapes text for HTML content and attribute values.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Escapes text for a URL query value.
fn q(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// `1.2 s`, `35 ms`, `4 min`, `3 h`, `2 d`.
fn secs(v: Option<f64>) -> String {
    match v {
        None => "–".into(),
        Some(s) if s < 1.0 => format!("{:.0} ms", s * 1000.0),
        Some(s) if s < 120.0 => format!("{s:.1} s"),
        Some(s) if s < 7200.0 => format!("{:.0} min", s / 60.0),
        Some(s) if s < 172_800.0 => format!("{:.0} h", s / 3600.0),
        Some(s) => format!("{:.0} d", s / 86400.0),
    }
}

/// Is this request from an admin (the configured token, as cookie or bearer)?
fn is_admin(shared: &Shared, headers: &HeaderMap) -> bool {
    let Some(token) = shared.config.dashboard.admin_token.as_deref() else {
        return false;
    };
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let cookie = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v);
    bearer.is_some_and(|b| same(b.as_bytes(), token.as_bytes()))
        || cookie.is_some_and(|c| same(c.as_bytes(), session(token).as_bytes()))
}

/// The cookie an admin gets: a digest of the token, so the token itself never travels in
/// cookies (which every service on the same host would receive).
fn session(token: &str) -> String {
    use sha2::{Digest, Sha256};
    let d = Sha256::digest(format!("jobwarden dashboard session\n{token}").as_bytes());
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// Compares in time independent of where the inputs differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

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

fn page(shared: &Shared, headers: &HeaderMap, nav: &str, title: &str, body: &str) -> Html<String> {
    let links = [
        ("overview", "/", "Overview"),
        ("jobs", "/jobs", "Jobs"),
        ("dead", "/dead", "Dead letters"),
        ("workers", "/workers", "Workers"),
        ("scheduled", "/scheduled", "Scheduled"),
    ];
    let mut nav_html = String::new();
    for (key, href, label) in links {
        let on = if key == nav { " class=\"on\"" } else { "" };
        let _ = write!(nav_html, "<a href=\"{href}\"{on}>{label}</a>");
    }
    let who = match (
        shared.config.dashboard.admin_token.is_some(),
        is_admin(shared, headers),
    ) {
        (false, _) => "<span class=\"who\">read-only (no admin_token configured)</span>".to_string(),
        (true, true) => "<form method=\"post\" action=\"/logout\"><span class=\"who\">admin</span><button>Log out</button></form>".to_string(),
        (true, false) => "<form method=\"post\" action=\"/login\"><input type=\"password\" name=\"token\" placeholder=\"admin token\" aria-label=\"admin token\"><button>Log in</button></form>".to_string(),
    };
    Html(format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\
         <title>{t} · jobwarden</title><style>{STYLE}</style></head><body>\
         <header><b>jobwarden</b>{nav_html}{who}</header><main><h1>{t}</h1>{body}</main></body></html>",
        t = esc(title)
    ))
}

/// What an action did, as a code and a count in the redirect's query (never free text from
/// the URL, so nobody can put their own words in the banner).
#[derive(Clone, Copy, PartialEq, Debug)]
enum Done {
    Retried,
    Discarded,
    NotDead,
    Cancelled,
    AlreadyFinished,
    NoneSelected,
    NoQueue,
    WrongToken,
}

const DONE: [(Done, &str); 8] = [
    (Done::Retried, "retried"),
    (Done::Discarded, "discarded"),
    (Done::NotDead, "not-dead"),
    (Done::Cancelled, "cancelled"),
    (Done::AlreadyFinished, "finished"),
    (Done::NoneSelected, "none-selected"),
    (Done::NoQueue, "no-queue"),
    (Done::WrongToken, "wrong-token"),
];

fn done_text(d: Done, n: u64) -> String {
    match d {
        Done::Retried => format!("{n} dead job(s) retried"),
        Done::Discarded => format!("{n} dead job(s) discarded"),
        Done::NotDead => "not retried: the job is not dead".into(),
        Done::Cancelled if n > 1 => format!("{n} jobs cancelled"),
        Done::Cancelled => "cancelled".into(),
        Done::AlreadyFinished => "not cancelled: the job had already finished".into(),
        Done::NoneSelected => "select at least one job".into(),
        Done::NoQueue => "pick a queue to act on all of its dead jobs".into(),
        Done::WrongToken => "wrong admin token".into(),
    }
}

fn flash(params: &HashMap<String, String>) -> String {
    let Some(d) = params
        .get("done")
        .and_then(|c| DONE.iter().find(|(_, code)| code == c))
        .map(|(d, _)| *d)
    else {
        return String::new();
    };
    let n = params.get("n").and_then(|n| n.parse().ok()).unwrap_or(0);
    format!(
        "<div class=\"msg\" id=\"msg\">{}</div>",
        esc(&done_text(d, n))
    )
}

fn failed(e: impl std::fmt::Display) -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Html(format!(
            "<p>PostgreSQL did not answer: {}</p>",
            esc(&e.to_string())
        )),
    )
        .into_response()
}

/// The page for a list PostgreSQL stopped at the time limit (a text search that matches
/// nothing walks the whole table).
fn too_slow(shared: &Shared, headers: &HeaderMap, nav: &str, title: &str) -> Response {
    let body = format!(
        "<div class=\"msg\" id=\"too-slow\">This list took longer than {} s to read and was \
         stopped. Narrow it: pick a queue or a status, or search for a longer text.</div>",
        DASHBOARD_QUERY_LIMIT.as_secs()
    );
    (
        StatusCode::SERVICE_UNAVAILABLE,
        page(shared, headers, nav, title, &body),
    )
        .into_response()
}

/// A page's rows, or the response to send instead (PostgreSQL failed, or was too slow).
fn rows_of<T>(
    shared: &Shared,
    headers: &HeaderMap,
    nav: &str,
    title: &str,
    read: Result<Bounded<T>, StoreError>,
) -> Result<T, Box<Response>> {
    match read {
        Ok(Bounded::Done(rows)) => Ok(rows),
        Ok(Bounded::TooSlow) => Err(Box::new(too_slow(shared, headers, nav, title))),
        Err(e) => Err(Box::new(failed(e))),
    }
}

/// A `<us>:<id>` page key (a time in microseconds since the epoch, and an id).
fn time_key(p: &HashMap<String, String>, name: &str) -> Option<(i64, String)> {
    let (us, id) = p.get(name)?.split_once(':')?;
    Some((us.parse().ok()?, id.to_string()))
}

/// The link to the next page of a list: shown when this page is full.
fn more_link(id: &str, full: bool, href: &str, label: &str) -> String {
    if full {
        format!("<p><a id=\"{id}\" href=\"{}\">{label} →</a></p>", esc(href))
    } else {
        String::new()
    }
}

fn overview_rows(rows: &[QueueOverview]) -> String {
    let mut out = String::new();
    if rows.is_empty() {
        out.push_str("<tr><td colspan=\"10\" class=\"muted\">no jobs yet</td></tr>");
    }
    for r in rows {
        let qn = esc(&r.queue);
        let uq = q(&r.queue);
        let cell = |field: &str, v: String| {
            format!("<td class=\"n\" data-queue=\"{qn}\" data-field=\"{field}\">{v}</td>")
        };
        let rate = r.failure_rate();
        let _ = write!(
            out,
            "<tr><td><a href=\"/jobs?queue={uq}\">{qn}</a></td>{}{}{}{}{}{}{}{}{}</tr>",
            cell("queued", r.queued.to_string()),
            cell("scheduled", r.scheduled.to_string()),
            cell("running", r.running.to_string()),
            cell("throughput", format!("{:.1}/s", r.throughput())),
            cell(
                "failure_rate",
                if rate > 0.0 {
                    format!("<span class=\"bad\">{:.1}%</span>", rate * 100.0)
                } else {
                    "0%".into()
                }
            ),
            cell("p50", secs(r.p50_run_seconds)),
            cell("p95", secs(r.p95_run_seconds)),
            cell(
                "dead",
                if r.dead > 0 {
                    format!("<a class=\"bad\" href=\"/dead?queue={uq}\">{}</a>", r.dead)
                } else {
                    "0".into()
                }
            ),
            cell("oldest_queued", secs(r.oldest_queued_seconds)),
        );
    }
    out
}

async fn overview(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Query(p): Query<HashMap<String, String>>,
) -> Response {
    let after = p.get("after").cloned().unwrap_or_default();
    let read = shared.store.dashboard_overview(&after, PAGE).await;
    let rows = match rows_of(&shared, &headers, "overview", "Queues", read) {
        Ok(r) => r,
        Err(refused) => return *refused,
    };
    let next = rows
        .last()
        .map(|r| format!("/?after={}", q(&r.queue)))
        .unwrap_or_default();
    let body = format!(
        "<table id=\"overview\"><thead><tr><th>queue</th><th class=\"n\">queued</th>\
         <th class=\"n\">scheduled</th><th class=\"n\">running</th>\
         <th class=\"n\">throughput (last min)</th><th class=\"n\">failure rate</th>\
         <th class=\"n\">p50 run</th><th class=\"n\">p95 run</th><th class=\"n\">dead</th>\
         <th class=\"n\">oldest waiting</th></tr></thead><tbody>{}</tbody></table>{}\
         <p class=\"muted\" id=\"updated\">updated live every 2 s</p>\
         <script>setInterval(async()=>{{try{{const r=await fetch('/fragments/overview'+location.search);\
         if(r.ok){{document.querySelector('#overview tbody').innerHTML=await r.text();\
         document.getElementById('updated').textContent='updated '+new Date().toLocaleTimeString();}}}}catch(e){{}}}},2000);</script>",
        overview_rows(&rows),
        more_link("next", rows.len() as i64 >= PAGE, &next, &format!("next {PAGE} queues"))
    );
    page(&shared, &headers, "overview", "Queues", &body).into_response()
}

async fn overview_fragment(
    State(shared): State<Arc<Shared>>,
    Query(p): Query<HashMap<String, String>>,
) -> Response {
    let after = p.get("after").cloned().unwrap_or_default();
    match shared.store.dashboard_overview(&after, PAGE).await {
        Ok(Bounded::Done(rows)) => Html(overview_rows(&rows)).into_response(),
        Ok(Bounded::TooSlow) => (StatusCode::SERVICE_UNAVAILABLE, "too slow").into_response(),
        Err(e) => failed(e),
    }
}

fn status_badge(s: &str) -> String {
    format!("<span class=\"s s-{0}\">{0}</span>", esc(s))
}

fn job_rows(rows: &[JobSummary], check: bool) -> String {
    let mut out = String::new();
    for j in rows {
        let _ = write!(
            out,
            "<tr data-id=\"{id}\">{cb}<td><a href=\"/job?id={uid}\">{id}</a></td><td>{queue}</td><td>{st}</td>\
             <td class=\"n\">{p}</td><td class=\"n\">{a}/{m}</td><td>{w}</td><td class=\"err\">{e}</td><td>{u}</td></tr>",
            cb = if check {
                format!("<td><input type=\"checkbox\" name=\"id\" value=\"{}\" aria-label=\"select\"></td>", esc(&j.id))
            } else {
                String::new()
            },
            id = esc(&j.id),
            uid = q(&j.id),
            queue = esc(&j.queue),
            st = status_badge(&j.status),
            p = j.priority,
            a = j.attempts,
            m = j.max_attempts,
            w = esc(j.worker_id.as_deref().unwrap_or("")),
            e = esc(j.last_error.as_deref().unwrap_or("")),
            u = esc(&j.updated_at),
        );
    }
    if rows.is_empty() {
        out.push_str("<tr><td colspan=\"9\" class=\"muted\">no jobs match</td></tr>");
    }
    out
}

fn job_table(rows: &[JobSummary], check: bool) -> String {
    format!(
        "<table id=\"jobs\"><thead><tr>{}<th>id</th><th>queue</th><th>status</th><th class=\"n\">priority</th>\
         <th class=\"n\">attempts</th><th>worker</th><th>last error</th><th>updated (UTC)</th></tr></thead>\
         <tbody>{}</tbody></table>",
        if check { "<th></th>" } else { "" },
        job_rows(rows, check)
    )
}

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

/// The link to the next page (when this one is full).
fn next_link(base: &str, f: &JobFilter, rows: &[JobSummary]) -> String {
    if (rows.len() as i64) < PAGE {
        return String::new();
    }
    let last = rows.last().map(|r| r.id.as_str()).unwrap_or("");
    format!(
        "<p><a id=\"next\" href=\"{base}?queue={}&status={}&q={}&after={}\">next {PAGE} →</a></p>",
        q(f.queue.as_deref().unwrap_or("")),
        q(f.status.as_deref().unwrap_or("")),
        q(f.text.as_deref().unwrap_or("")),
        q(last)
    )
}

async fn jobs(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Query(p): Query<HashMap<String, String>>,
) -> Response {
    let f = filter_of(&p);
    let read = shared.store.dashboard_jobs(&f, PAGE).await;
    let rows = match rows_of(&shared, &headers, "jobs", "Jobs", read) {
        Ok(r) => r,
        Err(refused) => return *refused,
    };
    let mut queues: Vec<&String> = shared.config.queues.keys().collect();
    queues.sort();
    let mut qopts = String::from("<option value=\"\">any queue</option>");
    for name in queues {
        let sel = if f.queue.as_ref() == Some(name) {
            " selected"
        } else {
            ""
        };
        let _ = write!(qopts, "<option{sel}>{}</option>", esc(name));
    }
    let mut sopts = String::from("<option value=\"\">any status</option>");
    for s in [
        "queued",
        "scheduled",
        "processing",
        "completed",
        "dead",
        "cancelled",
    ] {
        let sel = if f.status.as_deref() == Some(s) {
            " selected"
        } else {
            ""
        };
        let _ = write!(sopts, "<option{sel}>{s}</option>");
    }
    let body = format!(
        "{}<form class=\"filters\" method=\"get\" action=\"/jobs\"><select name=\"queue\" aria-label=\"queue\">{qopts}</select>\
         <select name=\"status\" aria-label=\"status\">{sopts}</select>\
         <input name=\"q\" placeholder=\"text in id or error\" value=\"{}\" aria-label=\"text\"><button>Filter</button></form>{}{}",
        flash(&p),
        esc(f.text.as_deref().unwrap_or("")),
        job_table(&rows, false),
        next_link("/jobs", &f, &rows)
    );
    page(&shared, &headers, "jobs", "Jobs", &body).into_response()
}

async fn job(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Query(p): Query<HashMap<String, String>>,
) -> Response {
    let id = p.get("id").cloned().unwrap_or_default();
    let store = &shared.store;
    let j = match store.job_get(&id).await {
        Ok(Some(j)) => j,
        Ok(None) => {
            let body = format!("<p>No job has the id <code>{}</code>.</p>", esc(&id));
            return (
                StatusCode::NOT_FOUND,
                page(&shared, &headers, "jobs", "No such job", &body),
            )
                .into_response();
        }
        Err(e) => return failed(e),
    };
    // A part PostgreSQL did not answer is said to be missing, never shown as empty.
    let mut missing: Vec<String> = Vec::new();
    let mut note = |what: &str, e: &dyn std::fmt::Display| {
        warn!(job.id = %id, cause = %e, "dashboard: could not read the job's {what}");
        missing.push(format!("{what}: {e}"));
    };
    let attempts_after: i64 = p
        .get("attempts_after")
        .and_then(|a| a.parse().ok())
        .unwrap_or(0);
    let attempts = match store.dashboard_attempts(&id, attempts_after, PAGE).await {
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
    let waiting = store.job_explain(&id).await.unwrap_or_else(|e| {
        note("wait", &e);
        None
    });
    let owner = match &j.worker_id {
        Some(w) => store.worker(w).await.unwrap_or_else(|e| {
            note("owner", &e);
            None
        }),
        None => None,
    };
    let admin = is_admin(&shared, &headers);
    let mut b = flash(&p);
    for m in &missing {
        let _ = write!(b, "<div class=\"msg\">not read: {}</div>", esc(m));
    }
    let _ = write!(
        b,
        "<dl id=\"job\"><dt>status</dt><dd data-field=\"status\">{}</dd><dt>queue</dt><dd>{}</dd>\
         <dt>priority</dt><dd>{}</dd><dt>attempts</dt><dd data-field=\"attempts\">{} of {}</dd>",
        status_badge(&j.status),
        esc(&j.queue),
        j.priority,
        j.attempts,
        j.max_attempts
    );
    if let Some(w) = &waiting {
        let _ = write!(
            b,
            "<dt>waiting for</dt><dd data-field=\"waiting\">{}</dd>",
            esc(w)
        );
    }
    if j.stage.is_some() || j.progress.is_some() || j.message.is_some() {
        let _ = write!(
            b,
            "<dt>progress</dt><dd data-field=\"progress\">{}{}{}</dd>",
            j.progress
                .map(|p| format!("{:.0}% ", p * 100.0))
                .unwrap_or_default(),
            esc(j.stage.as_deref().unwrap_or("")),
            j.message
                .as_deref()
                .map(|m| format!(" — {}", esc(m)))
                .unwrap_or_default()
        );
    }
    if let Some(w) = &j.worker_id {
        let beat = owner
            .as_ref()
            .map(|o| {
                format!(
                    " · heartbeat {} ago · {}",
                    secs(Some(o.heartbeat_age_seconds)),
                    esc(&o.state())
                )
            })
            .unwrap_or_default();
        let label = if j.status == "processing" {
            "owner"
        } else {
            "last worker"
        };
        let _ = write!(
            b,
            "<dt>{label}</dt><dd data-field=\"owner\">{}{beat} (lease {})</dd>",
            esc(w),
            j.lease
        );
    }
    for (k, v) in [
        ("created", Some(&j.created_at)),
        ("scheduled for", Some(&j.scheduled_at)),
        ("started", j.started_at.as_ref()),
        ("last activity", j.last_activity_at.as_ref()),
        ("finished", j.completed_at.as_ref()),
        ("idempotency key", j.idempotency_key.as_ref()),
    ] {
        if let Some(v) = v {
            let _ = write!(b, "<dt>{k}</dt><dd>{}</dd>", esc(v));
        }
    }
    if let Some(e) = &j.last_error {
        let _ = write!(b, "<dt>last error</dt><dd class=\"err\">{}</dd>", esc(e));
    }
    if let Some(p) = &j.pipeline {
        let _ = write!(
            b,
            "<dt>pipeline</dt><dd><a id=\"pipeline-link\" href=\"/pipeline?id={}\">{}</a></dd>",
            q(p),
            esc(p)
        );
    }
    b.push_str("</dl>");
    if admin {
        let eid = esc(&id);
        b.push_str("<div class=\"actions\">");
        if j.status == "dead" {
            let _ = write!(b, "<form method=\"post\" action=\"/job/retry\"><input type=\"hidden\" name=\"id\" value=\"{eid}\"><button id=\"retry\">Retry</button></form>");
        }
        if matches!(
            j.status.as_str(),
            "waiting" | "queued" | "scheduled" | "processing"
        ) {
            let _ = write!(b, "<form method=\"post\" action=\"/job/cancel\"><input type=\"hidden\" name=\"id\" value=\"{eid}\"><button class=\"danger\" id=\"cancel\">Cancel</button></form>");
        }
        b.push_str("</div>");
    }
    let _ = write!(
        b,
        "<h2>Attempts</h2><table id=\"attempts\"><thead><tr><th class=\"n\">#</th><th class=\"n\">lease</th>\
         <th>worker</th><th>started (UTC)</th><th class=\"n\">took</th><th>outcome</th><th>error</th></tr></thead><tbody>"
    );
    for (_, a) in &attempts {
        let _ = write!(
            b,
            "<tr data-id=\"{}\"><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td><td>{}</td><td class=\"n\">{}</td><td>{}</td><td class=\"err\">{}</td></tr>",
            a.attempt,
            a.attempt,
            a.lease,
            esc(a.worker_id.as_deref().unwrap_or("")),
            esc(a.started_at.as_deref().unwrap_or("")),
            secs(a.duration_ms.map(|ms| ms as f64 / 1000.0)),
            esc(&a.outcome),
            esc(a.error.as_deref().unwrap_or(""))
        );
    }
    if attempts.is_empty() {
        b.push_str("<tr><td colspan=\"7\" class=\"muted\">no attempt finished yet</td></tr>");
    }
    b.push_str("</tbody></table>");
    let next = attempts
        .last()
        .map(|(key, _)| format!("/job?id={}&attempts_after={key}", q(&id)))
        .unwrap_or_default();
    b.push_str(&more_link(
        "next-attempts",
        attempts.len() as i64 >= PAGE,
        &next,
        &format!("next {PAGE} attempts"),
    ));
    let pretty = |v: &serde_json::Value| serde_json::to_string_pretty(v).unwrap_or_default();
    let _ = write!(
        b,
        "<h2>Payload</h2><pre id=\"payload\">{}</pre>",
        esc(&pretty(&j.payload))
    );
    if let Some(r) = &j.result {
        let _ = write!(
            b,
            "<h2>Result</h2><pre id=\"result\">{}</pre>",
            esc(&pretty(r))
        );
    }
    page(&shared, &headers, "jobs", &format!("Job {id}"), &b).into_response()
}

/// A pipeline: every job chained with `then` and `depends_on` to the one named, with its state
/// and parents.
async fn pipeline(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Query(p): Query<HashMap<String, String>>,
) -> Response {
    let id = p.get("id").cloned().unwrap_or_default();
    let after = time_key(&p, "after");
    let title = format!("Pipeline of {id}");
    let read = shared
        .store
        .dashboard_pipeline(&id, after.as_ref().map(|(us, a)| (*us, a.as_str())), PAGE)
        .await;
    let page_rows = match rows_of(&shared, &headers, "jobs", &title, read) {
        Ok(r) => r,
        Err(refused) => return *refused,
    };
    let read = shared.store.dashboard_pipeline_counts(&id).await;
    let counts = match rows_of(&shared, &headers, "jobs", &title, read) {
        Ok(r) => r,
        Err(refused) => return *refused,
    };
    if counts.is_empty() {
        let body = format!("<p>No job has the id <code>{}</code>.</p>", esc(&id));
        return (
            StatusCode::NOT_FOUND,
            page(&shared, &headers, "jobs", "No such job", &body),
        )
            .into_response();
    }
    let jobs: Vec<&crate::store::PipelineJob> = page_rows.iter().map(|(_, j)| j).collect();
    let mut b = flash(&p);
    let total: i64 = counts.iter().map(|(_, n)| n).sum();
    let summary: Vec<String> = counts
        .iter()
        .map(|(s, n)| format!("{n} {}", status_badge(s)))
        .collect();
    let _ = write!(
        b,
        "<p id=\"pipeline-summary\">{total} jobs: {}</p>",
        summary.join(", ")
    );
    b.push_str(
        "<table id=\"pipeline\"><thead><tr><th>job</th><th>queue</th><th>status</th>\
         <th class=\"n\">attempts</th><th>after</th><th>created (UTC)</th><th>finished (UTC)</th>\
         <th>last error</th></tr></thead><tbody>",
    );
    for j in &jobs {
        let parents: Vec<String> = j
            .parents
            .iter()
            .map(|p| format!("<a href=\"/job?id={}\">{}</a>", q(p), esc(p)))
            .collect();
        let mut after = parents.join(", ");
        if j.pending_then > 0 {
            let _ = write!(
                after,
                " <span class=\"muted\">(then {} more)</span>",
                j.pending_then
            );
        }
        let _ = write!(
            b,
            "<tr data-id=\"{}\"><td><a href=\"/job?id={}\">{}</a></td><td>{}</td><td>{}</td>\
             <td class=\"n\">{}/{}</td><td>{after}</td><td>{}</td><td>{}</td><td class=\"err\">{}</td></tr>",
            esc(&j.id),
            q(&j.id),
            esc(&j.id),
            esc(&j.queue),
            status_badge(&j.status),
            j.attempts,
            j.max_attempts,
            esc(&j.created_at),
            esc(j.completed_at.as_deref().unwrap_or("")),
            esc(j.last_error.as_deref().unwrap_or(""))
        );
    }
    b.push_str("</tbody></table>");
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
    b.push_str(&more_link(
        "next",
        page_rows.len() as i64 >= PAGE,
        &next,
        &format!("next {PAGE} jobs of the pipeline"),
    ));
    let unfinished = counts.iter().any(|(status, _)| {
        matches!(
            status.as_str(),
            "waiting" | "queued" | "scheduled" | "processing"
        )
    });
    if unfinished && is_admin(&shared, &headers) {
        let _ = write!(
            b,
            "<div class=\"actions\"><form method=\"post\" action=\"/pipeline/cancel\">\
             <input type=\"hidden\" name=\"id\" value=\"{}\"><button class=\"danger\" \
             id=\"cancel-pipeline\">Cancel every unfinished job</button></form></div>",
            esc(&id)
        );
    }
    page(&shared, &headers, "jobs", &title, &b).into_response()
}

async fn pipeline_cancel(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    LimitedBody(body): LimitedBody<FORM_BODY_LIMIT>,
) -> Response {
    if let Some(refused) = refuse(&shared, &headers) {
        return refused;
    }
    let f = form(&body);
    let id = field(&f, "id").unwrap_or_default().to_string();
    match shared.store.pipeline_cancel(&id).await {
        Ok(ids) => {
            info!(job.id = %id, jobs = ids.len(), "dashboard: pipeline cancelled");
            back(
                &format!("/pipeline?id={}", q(&id)),
                Done::Cancelled,
                ids.len(),
            )
        }
        Err(e) => failed(e),
    }
}

async fn dead(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Query(p): Query<HashMap<String, String>>,
) -> Response {
    let mut f = filter_of(&p);
    f.status = Some("dead".into());
    let read = shared.store.dashboard_jobs(&f, PAGE).await;
    let rows = match rows_of(&shared, &headers, "dead", "Dead letters", read) {
        Ok(r) => r,
        Err(refused) => return *refused,
    };
    let admin = is_admin(&shared, &headers);
    let queue = f.queue.clone().unwrap_or_default();
    let mut b = flash(&p);
    let _ = write!(
        b,
        "<form class=\"filters\" method=\"get\" action=\"/dead\"><input name=\"queue\" placeholder=\"queue\" value=\"{}\" aria-label=\"queue\">\
         <input name=\"q\" placeholder=\"text in id or error\" value=\"{}\" aria-label=\"text\"><button>Filter</button></form>",
        esc(&queue),
        esc(f.text.as_deref().unwrap_or(""))
    );
    if admin {
        // Acting on a whole queue ignores the text filter: offered only without one.
        let all = if queue.is_empty() || f.text.is_some() {
            String::new()
        } else {
            format!(
                "<button name=\"all\" value=\"1\" formaction=\"/dead/retry\" id=\"retry-all\">Retry every dead job of {0}</button>\
                 <button class=\"danger\" name=\"all\" value=\"1\" formaction=\"/dead/discard\" id=\"discard-all\">Discard every dead job of {0}</button>",
                esc(&queue)
            )
        };
        let _ = write!(
            b,
            "<form method=\"post\" id=\"dead-form\"><input type=\"hidden\" name=\"queue\" value=\"{}\">\
             <div class=\"actions\"><button formaction=\"/dead/retry\" id=\"retry-selected\">Retry selected</button>\
             <button class=\"danger\" formaction=\"/dead/discard\" id=\"discard-selected\">Discard selected</button>{all}</div>{}</form>",
            esc(&queue),
            job_table(&rows, true)
        );
    } else {
        b.push_str(&job_table(&rows, false));
        if shared.config.dashboard.admin_token.is_some() {
            b.push_str("<p class=\"muted\">Log in with the admin token to retry or discard.</p>");
        }
    }
    b.push_str(&next_link("/dead", &f, &rows));
    page(&shared, &headers, "dead", "Dead letters", &b).into_response()
}

async fn workers(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Query(p): Query<HashMap<String, String>>,
) -> Response {
    let after = p.get("after").cloned().unwrap_or_default();
    let read = shared.store.dashboard_workers(&after, PAGE).await;
    let rows = match rows_of(&shared, &headers, "workers", "Workers", read) {
        Ok(r) => r,
        Err(refused) => return *refused,
    };
    let mut b = String::from(
        "<table id=\"workers\"><thead><tr><th>worker</th><th>host</th><th class=\"n\">pid</th><th>version</th>\
         <th class=\"n\">up</th><th class=\"n\">heartbeat</th><th class=\"n\">jobs in flight</th><th>state</th></tr></thead><tbody>",
    );
    for w in &rows {
        let state = w.state();
        let _ = write!(
            b,
            "<tr data-id=\"{id}\"><td>{id}</td><td>{}</td><td class=\"n\">{}</td><td>{}</td><td class=\"n\">{}</td>\
             <td class=\"n\" data-field=\"heartbeat\">{} ago</td><td class=\"n\" data-field=\"in_flight\">{}</td><td{}>{}</td></tr>",
            esc(&w.hostname),
            w.pid,
            esc(&w.version),
            secs(Some(w.up_seconds)),
            secs(Some(w.heartbeat_age_seconds)),
            w.in_flight,
            if state == "alive" { "" } else { " class=\"bad\"" },
            esc(&state),
            id = esc(&w.id),
        );
    }
    if rows.is_empty() {
        b.push_str("<tr><td colspan=\"8\" class=\"muted\">no worker is running</td></tr>");
    }
    b.push_str("</tbody></table>");
    let next = rows
        .last()
        .map(|w| format!("/workers?after={}", q(&w.id)))
        .unwrap_or_default();
    b.push_str(&more_link(
        "next",
        rows.len() as i64 >= PAGE,
        &next,
        &format!("next {PAGE} workers"),
    ));
    page(&shared, &headers, "workers", "Workers", &b).into_response()
}

async fn scheduled(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Query(p): Query<HashMap<String, String>>,
) -> Response {
    let after = time_key(&p, "after");
    let read = shared
        .store
        .dashboard_scheduled(after.as_ref().map(|(us, id)| (*us, id.as_str())), PAGE)
        .await;
    let rows = match rows_of(&shared, &headers, "scheduled", "Scheduled", read) {
        Ok(r) => r,
        Err(refused) => return *refused,
    };
    let mut b = String::from(
        "<table id=\"scheduled\"><thead><tr><th>id</th><th>queue</th><th>due (UTC)</th><th class=\"n\">due in</th>\
         <th class=\"n\">attempts</th><th>last error</th></tr></thead><tbody>",
    );
    for s in &rows {
        let _ = write!(
            b,
            "<tr data-id=\"{id}\"><td><a href=\"/job?id={}\">{id}</a></td><td>{}</td><td>{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}/{}</td><td class=\"err\">{}</td></tr>",
            q(&s.id),
            esc(&s.queue),
            esc(&s.due_at),
            if s.due_in_seconds <= 0.0 {
                "due".to_string()
            } else {
                secs(Some(s.due_in_seconds))
            },
            s.attempts,
            s.max_attempts,
            esc(s.last_error.as_deref().unwrap_or("")),
            id = esc(&s.id),
        );
    }
    if rows.is_empty() {
        b.push_str("<tr><td colspan=\"6\" class=\"muted\">nothing scheduled</td></tr>");
    }
    b.push_str("</tbody></table>");
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
    b.push_str(&more_link(
        "next",
        rows.len() as i64 >= PAGE,
        &next,
        &format!("next {PAGE} scheduled jobs"),
    ));
    // Cron schedules come from the configuration (a BTreeMap: in name order), a page at a
    // time too; their last fires are read for the page's names only.
    let crons: Vec<(&String, &crate::cron::CronConfig)> = shared
        .config
        .cron
        .iter()
        .filter(|(name, _)| name.as_str() > cron_after.as_str())
        .take(PAGE as usize)
        .collect();
    let names: Vec<&str> = crons.iter().map(|(n, _)| n.as_str()).collect();
    let last: HashMap<String, String> = match shared.store.dashboard_cron_fires(&names).await {
        Ok(Bounded::Done(fires)) => fires
            .into_iter()
            .map(|(n, t)| (n, t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)))
            .collect(),
        Ok(Bounded::TooSlow) | Err(_) => HashMap::new(),
    };
    b.push_str(
        "<h2>Cron schedules</h2><table id=\"cron\"><thead><tr><th>name</th><th>schedule</th><th>time zone</th><th>queue</th>\
         <th>last fire (UTC)</th><th>next fires (UTC)</th></tr></thead><tbody>",
    );
    let now = chrono::Utc::now();
    for (name, c) in &crons {
        let next = crate::cron::Schedule::new(name, c)
            .map(|s| {
                s.next_fires(now, 3)
                    .iter()
                    .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default();
        let _ = write!(
            b,
            "<tr data-id=\"{n}\"><td>{n}</td><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&c.schedule),
            esc(&c.timezone),
            esc(&c.queue),
            esc(last.get(name.as_str()).map(String::as_str).unwrap_or("never")),
            esc(&next),
            n = esc(name),
        );
    }
    if crons.is_empty() {
        b.push_str("<tr><td colspan=\"6\" class=\"muted\">no cron schedule configured</td></tr>");
    }
    b.push_str("</tbody></table>");
    let next_cron = crons
        .last()
        .map(|(n, _)| format!("/scheduled?cron_after={}", q(n)))
        .unwrap_or_default();
    b.push_str(&more_link(
        "next-cron",
        crons.len() as i64 >= PAGE,
        &next_cron,
        &format!("next {PAGE} cron schedules"),
    ));
    page(&shared, &headers, "scheduled", "Scheduled", &b).into_response()
}

/// The fields of a form body, repeated names kept (`id=a&id=b`).
fn form(body: &[u8]) -> Vec<(String, String)> {
    form_urlencoded::parse(body)
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

fn field<'a>(f: &'a [(String, String)], name: &str) -> Option<&'a str> {
    f.iter()
        .find(|(k, v)| k == name && !v.is_empty())
        .map(|(_, v)| v.as_str())
}

fn back(to: &str, done: Done, n: usize) -> Response {
    let sep = if to.contains('?') { '&' } else { '?' };
    let code = DONE
        .iter()
        .find(|(d, _)| *d == done)
        .map(|(_, c)| *c)
        .unwrap_or("");
    Redirect::to(&format!("{to}{sep}done={code}&n={n}")).into_response()
}

/// Why an action request is refused, if it is: no admin, or (for a browser) a request that
/// another site made (SameSite cookies count every port of a host and every sibling
/// subdomain as the same site, so the origin is checked too).
fn refuse(shared: &Shared, headers: &HeaderMap) -> Option<Response> {
    if !is_admin(shared, headers) {
        let why = if shared.config.dashboard.admin_token.is_some() {
            "log in with the admin token first"
        } else {
            "this dashboard is read-only: set dashboard.admin_token to allow retry, discard and cancel"
        };
        return Some((StatusCode::FORBIDDEN, why).into_response());
    }
    if let Some(why) = cross_site(headers) {
        warn!(%why, "dashboard: an action from another site was refused");
        return Some(
            (
                StatusCode::FORBIDDEN,
                format!("refused: the request came from another site ({why})"),
            )
                .into_response(),
        );
    }
    None
}

/// The job a job form names, and the page to go back to.
fn job_target(body: &[u8]) -> (String, String) {
    let f = form(body);
    let id = field(&f, "id").unwrap_or_default().to_string();
    let to = format!("/job?id={}", q(&id));
    (id, to)
}

async fn job_retry(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    LimitedBody(body): LimitedBody<FORM_BODY_LIMIT>,
) -> Response {
    if let Some(refused) = refuse(&shared, &headers) {
        return refused;
    }
    let (id, to) = job_target(&body);
    match shared
        .store
        .job_retry_dead(Some(std::slice::from_ref(&id)), None)
        .await
    {
        Ok(ids) if ids.is_empty() => back(&to, Done::NotDead, 0),
        Ok(_) => {
            info!(job.id = %id, "dashboard: dead job retried");
            back(&to, Done::Retried, 1)
        }
        Err(e) => failed(e),
    }
}

async fn job_cancel(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    LimitedBody(body): LimitedBody<FORM_BODY_LIMIT>,
) -> Response {
    if let Some(refused) = refuse(&shared, &headers) {
        return refused;
    }
    let (id, to) = job_target(&body);
    match shared.store.job_cancel(&id).await {
        Ok(Some(was)) => {
            info!(job.id = %id, was = %was, "dashboard: job cancelled");
            back(&to, Done::Cancelled, 1)
        }
        Ok(None) => back(&to, Done::AlreadyFinished, 0),
        Err(e) => failed(e),
    }
}

/// The dead jobs a DLQ form names: the checked ids, or with `all`, every dead job of its queue.
fn dead_selection(f: &[(String, String)]) -> Result<(Option<Vec<String>>, Option<String>), Done> {
    let queue = field(f, "queue").map(str::to_string);
    if field(f, "all").is_some() {
        return match queue {
            Some(q) => Ok((None, Some(q))),
            None => Err(Done::NoQueue),
        };
    }
    let ids: Vec<String> = f
        .iter()
        .filter(|(k, v)| k == "id" && !v.is_empty())
        .map(|(_, v)| v.clone())
        .collect();
    if ids.is_empty() {
        return Err(Done::NoneSelected);
    }
    Ok((Some(ids), None))
}

async fn dead_action(
    shared: Arc<Shared>,
    headers: HeaderMap,
    body: &[u8],
    discard: bool,
) -> Response {
    if let Some(refused) = refuse(&shared, &headers) {
        return refused;
    }
    let f = form(body);
    let to = match field(&f, "queue") {
        Some(qn) => format!("/dead?queue={}", q(qn)),
        None => "/dead".to_string(),
    };
    let (ids, queue) = match dead_selection(&f) {
        Ok(s) => s,
        Err(why) => return back(&to, why, 0),
    };
    let store = &shared.store;
    let done = if discard {
        store
            .job_discard_dead(ids.as_deref(), queue.as_deref())
            .await
    } else {
        store.job_retry_dead(ids.as_deref(), queue.as_deref()).await
    };
    match done {
        Ok(ids) => {
            let (verb, done) = if discard {
                ("discarded", Done::Discarded)
            } else {
                ("retried", Done::Retried)
            };
            info!(jobs = ids.len(), "dashboard: dead jobs {verb}");
            back(&to, done, ids.len())
        }
        Err(e) => failed(e),
    }
}

async fn dead_retry(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    LimitedBody(body): LimitedBody<FORM_BODY_LIMIT>,
) -> Response {
    dead_action(shared, headers, &body, false).await
}

async fn dead_discard(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    LimitedBody(body): LimitedBody<FORM_BODY_LIMIT>,
) -> Response {
    dead_action(shared, headers, &body, true).await
}

async fn login(
    State(shared): State<Arc<Shared>>,
    LimitedBody(body): LimitedBody<FORM_BODY_LIMIT>,
) -> Response {
    let f = form(&body);
    let given = field(&f, "token").unwrap_or("");
    match shared.config.dashboard.admin_token.as_deref() {
        Some(t) if same(given.as_bytes(), t.as_bytes()) => (
            [(
                header::SET_COOKIE,
                format!("{COOKIE}={}; Path=/; HttpOnly; SameSite=Strict", session(t)),
            )],
            Redirect::to("/"),
        )
            .into_response(),
        _ => {
            warn!("dashboard: a login with a wrong admin token");
            back("/", Done::WrongToken, 0)
        }
    }
}

async fn logout() -> Response {
    (
        [(
            header::SET_COOKIE,
            format!("{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0"),
        )],
        Redirect::to("/"),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped_for_html_and_urls() {
        assert_eq!(
            esc("<script>alert('x')</script> & \"y\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;y&quot;"
        );
        assert_eq!(q("a b/c&d"), "a+b%2Fc%26d");
    }

    #[test]
    fn a_dead_letter_form_names_ids_or_a_whole_queue() {
        let f = form(b"queue=&id=a&id=b");
        assert_eq!(
            dead_selection(&f),
            Ok((Some(vec!["a".to_string(), "b".to_string()]), None))
        );
        let f = form(b"queue=email&all=1");
        assert_eq!(dead_selection(&f), Ok((None, Some("email".into()))));
        assert!(dead_selection(&form(b"all=1")).is_err());
        assert!(dead_selection(&form(b"queue=email")).is_err());
    }

    #[test]
    fn token_comparison_needs_every_byte() {
        assert!(same(b"0123456789abcdef", b"0123456789abcdef"));
        assert!(!same(b"0123456789abcdef", b"0123456789abcdeg"));
        assert!(!same(b"short", b"0123456789abcdef"));
    }

    #[test]
    fn durations_read_well() {
        assert_eq!(secs(None), "–");
        assert_eq!(secs(Some(0.035)), "35 ms");
        assert_eq!(secs(Some(4.25)), "4.2 s");
        assert_eq!(secs(Some(600.0)), "10 min");
        assert_eq!(secs(Some(3.0 * 86400.0)), "3 d");
    }
}
