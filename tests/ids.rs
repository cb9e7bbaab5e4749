//! Every id the job contract accepts round-trips through every place an id travels: the
//! `Nats-Msg-Id` header (the job's id when the body has none), the progress URL the
//! application posts to, the worker's log lines, the dashboard's links and forms, and CLI
//! arguments — with ids holding every character class the contract allows (invariant 13).

mod common;

use common::{text, wait_for, ChildWorker, TestEnv};
use serde_json::{json, Value};
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Ids of every class the contract allows: URL-special characters (`%`, `\`, `;`, `:`, `@`,
/// `+`, `=`), HTML-special ones (`<`, `>`, `&`, quotes), shell-special ones, letters of other
/// scripts, emoji, a leading `-` (an option, to a careless CLI), dots, and the longest ids
/// in one-byte and two-byte characters.
fn ids() -> Vec<String> {
    let mut ids: Vec<String> = [
        "plain-1",
        "pct%41%2F",
        "back\\slash",
        "semi;colon:at@plus+eq=",
        "quote\"s'and<b>&amp;",
        "ü-unicode-日本-عربي",
        "emoji-🦀-😀",
        "-leading-dash",
        "a.b...",
        "~tilde!$*()[]{}|^`,",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    ids.push("x".repeat(jobwarden::contract::MAX_ID_BYTES));
    ids.push("é".repeat(jobwarden::contract::MAX_ID_BYTES / 2));
    for id in &ids {
        jobwarden::contract::check_id(id).unwrap_or_else(|e| panic!("{id:?}: {e}"));
    }
    ids
}

/// The application: reports progress to the job's `progress_url`, records the answer, then
/// refuses the job for good (HTTP 400), so every job ends dead and is logged.
async fn app(seen: Arc<Mutex<Vec<(String, u16)>>>) -> String {
    let client = reqwest::Client::new();
    let router = axum::Router::new().route(
        "/jobs",
        axum::routing::post(move |body: axum::body::Bytes| {
            let seen = seen.clone();
            let client = client.clone();
            async move {
                let job: Value = serde_json::from_slice(&body).unwrap();
                let url = job["progress_url"].as_str().unwrap().to_string();
                let status = client
                    .post(&url)
                    .json(&json!({"progress": 0.5, "stage": "round-trip"}))
                    .send()
                    .await
                    .map(|r| r.status().as_u16())
                    .unwrap_or(0);
                let id = job["id"].as_str().unwrap().to_string();
                seen.lock().unwrap().push((id, status));
                (axum::http::StatusCode::BAD_REQUEST, "no")
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    format!("http://{addr}/jobs")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn unescape(html: &str) -> String {
    html.replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

#[tokio::test]
async fn every_valid_id_round_trips_through_headers_urls_logs_pages_forms_and_the_cli() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let url = app(seen.clone()).await;
    let dash = free_port();
    let env = TestEnv::new(&format!(
        "[queues.email]\nmax_attempts = 1\nhandler = {{ kind = \"http\", url = \"{url}\" }}\n\
         [dashboard]\nlisten = \"127.0.0.1:{dash}\"\nadmin_token = \"round-trip-token\"\n"
    ))
    .await;
    let log = std::env::temp_dir().join(format!("jobwarden-ids-{}.log", std::process::id()));
    let mut cfg = env.config.clone();
    cfg.worker.api_listen = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    // The child inherits these (its config file has the token redacted).
    std::env::set_var("CHILD_LOG", "info");
    std::env::set_var("JOBWARDEN_DASHBOARD__ADMIN_TOKEN", "round-trip-token");
    let _worker = ChildWorker::spawn_logged(&cfg, "ids", &log);
    let ids = ids();
    // Header: the id of a plain message is its Nats-Msg-Id.
    for id in &ids {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(
            async_nats::header::NATS_MESSAGE_ID,
            async_nats::HeaderValue::from_str(id).unwrap(),
        );
        env.broker
            .js
            .publish_with_headers("jobs.email", headers, json!({"n": 1}).to_string().into())
            .await
            .unwrap()
            .await
            .unwrap();
    }
    for id in &ids {
        assert!(
            env.wait_status(id, "dead", 30).await,
            "{id:?}: {:?}",
            env.status_of(id).await
        );
    }
    // URL: the application's progress report reached the attempt (200), for every id.
    let answers = seen.lock().unwrap().clone();
    for id in &ids {
        let got: Vec<u16> = answers
            .iter()
            .filter(|(i, _)| i == id)
            .map(|(_, s)| *s)
            .collect();
        assert_eq!(got, vec![200], "{id:?}");
    }
    // Log: each id whole, on the line that says it died.
    let logged = wait_for(Duration::from_secs(10), || async {
        let lines = std::fs::read_to_string(&log).unwrap_or_default();
        ids.iter().all(|id| {
            lines
                .lines()
                .any(|l| l.contains("job dead-lettered") && l.contains(id.as_str()))
        })
    })
    .await;
    assert!(
        logged,
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    // Dashboard: the dead-letter page links to each job; following the link shows it, and
    // its retry form names it.
    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{dash}");
    let dead_page = http
        .get(format!("{base}/jobs?status=dead"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for id in &ids {
        let href = format!(
            "/job?id={}",
            form_urlencoded::byte_serialize(id.as_bytes()).collect::<String>()
        );
        assert!(dead_page.contains(&href), "{id:?}: no link {href}");
        let page = http
            .get(format!("{base}{href}"))
            .header("Authorization", "Bearer round-trip-token")
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let marker = "action=\"/job/retry\"><input type=\"hidden\" name=\"id\" value=\"";
        let at = page
            .find(marker)
            .unwrap_or_else(|| panic!("{id:?}: no retry form"))
            + marker.len();
        let value = unescape(&page[at..at + page[at..].find('"').unwrap()]);
        assert_eq!(&value, id);
        let retried = http
            .post(format!("{base}/job/retry"))
            .header("Authorization", "Bearer round-trip-token")
            .header("Content-Type", "application/x-www-form-urlencoded")
            .body(
                form_urlencoded::Serializer::new(String::new())
                    .append_pair("id", &value)
                    .finish(),
            )
            .send()
            .await
            .unwrap();
        assert!(
            retried.status().is_success() || retried.status().is_redirection(),
            "{id:?}: {}",
            retried.status()
        );
    }
    // The retries ran the same jobs again (a second progress report each, and dead again).
    assert!(
        wait_for(Duration::from_secs(30), || async {
            let a = seen.lock().unwrap().clone();
            ids.iter()
                .all(|id| a.iter().filter(|(i, s)| i == id && *s == 200).count() == 2)
        })
        .await,
        "{:?}",
        seen.lock().unwrap()
    );
    // CLI: `jobs show <id>` finds each, as given on the command line.
    for id in &ids {
        let out = env.cli(&["jobs", "show", id, "--json"]);
        assert!(out.status.success(), "{id:?}: {}", text(&out));
        let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            shown["job"]["id"].as_str(),
            Some(id.as_str()),
            "{}",
            text(&out)
        );
    }
    let _ = std::fs::remove_file(&log);
}
