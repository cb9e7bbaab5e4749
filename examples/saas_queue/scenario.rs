//! The SaaS task queue: emails, PDFs, webhooks and images, 100K jobs a day.
//!
//! Three worker processes ("pods", `jobwarden run`) hand jobs to one application (an HTTP
//! server here; in production one beside each pod) that does the work: it sends email
//! through an SMTP server, renders PDFs, calls webhooks, resizes images. The queues have
//! the policies of the issue (concurrency, rate limits, timeouts, attempts, backoff) and are
//! shared by the pods: the email rate limit and concurrency are cluster-wide. The fake SMTP
//! server counts what it accepts per window, so a burst of marketing email can be shown to
//! stay under the provider's limit while password resets (priority 0) overtake the backlog
//! (priority 8). Bounced addresses end dead, and an alert subscriber on
//! `jobwarden.dead.>` hears each one.
//!
//! Used by `cargo run --example saas_queue` and `tests/scenarios.rs`, with the rate window
//! and the burst scaled (see `Settings`).

#[path = "../common/pod.rs"]
mod pod;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use futures::StreamExt;
use jobwarden::client::{Client, EnqueueOptions};
use pod::Pod;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

pub struct Settings {
    pub jobwarden: PathBuf,
    pub database_url: String,
    pub nats_url: String,
    pub schema: String,
    /// Marketing emails in the burst (10,000 in the issue).
    pub marketing: usize,
    /// Password resets sent while the burst drains.
    pub resets: usize,
    /// Marketing addresses that bounce (dead-lettered).
    pub bounces: usize,
    /// The email rate limit's window (1 minute in production; scaled in tests): at most 100
    /// sends per window.
    pub window: Duration,
    pub pods: usize,
    pub log_dir: PathBuf,
}

#[derive(Debug, Default, serde::Serialize)]
pub struct Report {
    pub emails_sent: usize,
    /// The most sends the SMTP server accepted in any window-long span (must be ≤ 100).
    pub max_sends_per_window: usize,
    pub window_seconds: f64,
    pub smtp_connections: usize,
    pub marketing_sent: usize,
    pub resets_sent: usize,
    /// Resets that started after the last marketing email was sent (must be 0), and the
    /// slowest reset from enqueue to send.
    pub resets_after_backlog: usize,
    pub slowest_reset_seconds: f64,
    pub burst_seconds: f64,
    /// Bounced addresses: dead jobs, and alerts heard on jobwarden.dead.email.
    pub dead_emails: i64,
    pub dead_alerts: usize,
    /// The dashboard's list of dead email jobs (rows).
    pub dashboard_dead_rows: usize,
    /// Other queues: completed jobs, the flaky webhook's attempts, the delayed job's wait.
    pub pdf_completed: i64,
    pub images_completed: i64,
    pub webhooks_completed: i64,
    pub flaky_webhook_attempts: i32,
    pub delayed_webhook_waited_seconds: f64,
    /// Most emails being sent at once (must be ≤ 5).
    pub max_concurrent_emails: usize,
}

/// What the fake SMTP server saw: accepted messages (time, recipient) and connections.
#[derive(Default)]
struct Smtp {
    sent: Vec<(Instant, String)>,
    connections: usize,
    open: usize,
    max_open: usize,
}

/// A minimal SMTP server: HELO/EHLO, MAIL, RCPT (550 for `bounce-…` recipients), DATA,
/// QUIT. Each accepted message is recorded with its time.
async fn smtp_server(state: Arc<Mutex<Smtp>>) -> anyhow::Result<u16> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            let state = state.clone();
            tokio::spawn(async move {
                {
                    let mut s = state.lock().unwrap();
                    s.connections += 1;
                    s.open += 1;
                    s.max_open = s.max_open.max(s.open);
                }
                let _ = smtp_session(sock, &state).await;
                state.lock().unwrap().open -= 1;
            });
        }
    });
    Ok(port)
}

async fn smtp_session(sock: tokio::net::TcpStream, state: &Mutex<Smtp>) -> std::io::Result<()> {
    let (r, mut w) = sock.into_split();
    let mut lines = BufReader::new(r).lines();
    w.write_all(b"220 smtp.test ESMTP\r\n").await?;
    let mut rcpt = String::new();
    while let Some(line) = lines.next_line().await? {
        let cmd = line.to_ascii_uppercase();
        if cmd.starts_with("HELO") || cmd.starts_with("EHLO") || cmd.starts_with("MAIL") {
            w.write_all(b"250 ok\r\n").await?;
        } else if cmd.starts_with("RCPT") {
            rcpt = line[8..]
                .trim()
                .trim_matches(|c| c == '<' || c == '>')
                .to_string();
            if rcpt.starts_with("bounce-") {
                w.write_all(b"550 5.1.1 no such mailbox\r\n").await?;
            } else {
                w.write_all(b"250 ok\r\n").await?;
            }
        } else if cmd == "DATA" {
            w.write_all(b"354 go ahead\r\n").await?;
            while let Some(l) = lines.next_line().await? {
                if l == "." {
                    break;
                }
            }
            state
                .lock()
                .unwrap()
                .sent
                .push((Instant::now(), rcpt.clone()));
            w.write_all(b"250 queued\r\n").await?;
        } else if cmd == "QUIT" {
            w.write_all(b"221 bye\r\n").await?;
            return Ok(());
        } else {
            w.write_all(b"502 unknown\r\n").await?;
        }
    }
    Ok(())
}

type Lines = tokio::io::Lines<BufReader<tokio::net::tcp::OwnedReadHalf>>;

/// Reads the server's next reply; `Err((permanent, reason))` unless it has `code`.
async fn reply(lines: &mut Lines, code: &str) -> Result<(), (bool, String)> {
    let l = lines
        .next_line()
        .await
        .map_err(|e| (false, format!("smtp: {e}")))?
        .unwrap_or_default();
    if l.starts_with(code) {
        Ok(())
    } else {
        Err((l.starts_with('5'), format!("smtp said: {l}")))
    }
}

/// Sends one message; `Err((permanent, reason))` on a refusal.
async fn smtp_send(port: u16, to: &str, subject: &str) -> Result<(), (bool, String)> {
    let io = |e: std::io::Error| (false, format!("smtp: {e}"));
    let sock = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(io)?;
    let (r, mut w) = sock.into_split();
    let mut lines = BufReader::new(r).lines();
    reply(&mut lines, "220").await?;
    for (cmd, code) in [
        ("HELO app.test".to_string(), "250"),
        ("MAIL FROM:<noreply@app.test>".to_string(), "250"),
        (format!("RCPT TO:<{to}>"), "250"),
        ("DATA".to_string(), "354"),
        (format!("Subject: {subject}\r\n\r\nHello.\r\n."), "250"),
        ("QUIT".to_string(), "221"),
    ] {
        w.write_all(format!("{cmd}\r\n").as_bytes())
            .await
            .map_err(io)?;
        reply(&mut lines, code).await?;
    }
    Ok(())
}

#[derive(Clone)]
struct App {
    smtp_port: u16,
    /// Email jobs being sent right now.
    sending: Arc<Mutex<(usize, usize)>>,
}

/// The application's job endpoint: the worker POSTs each job here.
async fn work(State(app): State<App>, Json(job): Json<Value>) -> (StatusCode, Json<Value>) {
    let p = &job["payload"];
    match job["queue"].as_str().unwrap_or_default() {
        "email" => {
            {
                let mut s = app.sending.lock().unwrap();
                s.0 += 1;
                s.1 = s.1.max(s.0);
            }
            let to = p["to"].as_str().unwrap_or_default();
            let sent = smtp_send(app.smtp_port, to, p["template"].as_str().unwrap_or("")).await;
            app.sending.lock().unwrap().0 -= 1;
            match sent {
                Ok(()) => (StatusCode::OK, Json(json!({"sent": to}))),
                // A bounce will not get better: a 4xx makes the job dead at once.
                Err((true, why)) => (
                    StatusCode::UNPROCESSABLE_ENTITY,
                    Json(json!({"error": why})),
                ),
                Err((false, why)) => (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"error": why}))),
            }
        }
        "pdf" | "images" => {
            tokio::time::sleep(Duration::from_millis(100)).await;
            (StatusCode::OK, Json(json!({"ok": true})))
        }
        "webhooks" => {
            // The "flaky" endpoint fails its first two calls.
            if p["flaky"] == json!(true) && job["attempt"].as_i64().unwrap_or(1) < 3 {
                return (
                    StatusCode::BAD_GATEWAY,
                    Json(json!({"error": "endpoint said 502"})),
                );
            }
            (StatusCode::OK, Json(json!({"delivered": true})))
        }
        other => (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": format!("no such queue {other}")})),
        ),
    }
}

fn queues(app: &str, window: Duration) -> String {
    let ms = |d: Duration| format!("{}ms", d.as_millis());
    format!(
        r#"
[queues.email]
concurrency = 5
global_concurrency = 5
rate_limit = "100/{window}"
timeout = "30s"
max_attempts = 3
backoff = {{ kind = "exponential", base = "5s" }}
handler = {{ kind = "http", url = "{app}/work" }}

[queues.pdf]
concurrency = 3
timeout = "120s"
max_attempts = 2
backoff = {{ kind = "fixed", base = "10s" }}
handler = {{ kind = "http", url = "{app}/work" }}

[queues.webhooks]
concurrency = 10
rate_limit = "50/{ten_s}"
timeout = "15s"
max_attempts = 5
backoff = {{ kind = "exponential", base = "1s" }}
handler = {{ kind = "http", url = "{app}/work" }}

[queues.images]
concurrency = 4
timeout = "60s"
max_attempts = 2
backoff = {{ kind = "fixed", base = "5s" }}
handler = {{ kind = "http", url = "{app}/work" }}
"#,
        window = ms(window),
        ten_s = ms(window / 6),
    )
}

pub async fn run(s: &Settings) -> anyhow::Result<Report> {
    std::fs::create_dir_all(&s.log_dir)?;
    let (store, broker) = pod::connect(&s.database_url, &s.schema, &s.nats_url).await?;
    // The alert subscriber: every dead-lettered job is announced on jobwarden.dead.<queue>.
    let mut alerts = broker.client.subscribe("jobwarden.dead.>").await?;
    let heard = Arc::new(Mutex::new(Vec::<String>::new()));
    let h = heard.clone();
    tokio::spawn(async move {
        while let Some(m) = alerts.next().await {
            h.lock()
                .unwrap()
                .push(String::from_utf8_lossy(&m.payload).into_owned());
        }
    });
    let client = Client::new(store.clone(), broker.clone());

    let smtp = Arc::new(Mutex::new(Smtp::default()));
    let smtp_port = smtp_server(smtp.clone()).await?;
    let app_state = App {
        smtp_port,
        sending: Arc::new(Mutex::new((0, 0))),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let app = format!("http://{}", listener.local_addr()?);
    let router = Router::new()
        .route("/work", post(work))
        .with_state(app_state.clone());
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });

    let dashboard_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        l.local_addr()?.port()
    };
    let config = s.log_dir.join("jobwarden.toml");
    std::fs::write(
        &config,
        format!(
            "[database]\nurl = {:?}\nschema = {:?}\npool_size = 6\n[nats]\nurl = {:?}\n\
             [worker]\napi_listen = \"127.0.0.1:0\"\nops_listen = \"off\"\n{}",
            s.database_url,
            s.schema,
            s.nats_url,
            queues(&app, s.window)
        ),
    )?;
    let mut pods = Vec::new();
    let dashboard = format!("127.0.0.1:{dashboard_port}");
    for i in 0..s.pods.max(1) {
        // The first pod also serves the dashboard.
        let env: &[(&str, &str)] = if i == 0 {
            &[("JOBWARDEN_DASHBOARD__LISTEN", &dashboard)]
        } else {
            &[]
        };
        pods.push(Pod::start_with(
            &s.jobwarden,
            &config,
            &s.log_dir,
            &format!("saas-{i}"),
            env,
        )?);
    }

    // The other queues: a few jobs each, a flaky webhook, a delayed one.
    let opts = |id: &str| EnqueueOptions {
        id: Some(id.into()),
        ..Default::default()
    };
    for i in 0..5 {
        client
            .enqueue("pdf", json!({"invoice": i}), opts(&format!("pdf-{i}")))
            .await?;
        client
            .enqueue("images", json!({"image": i}), opts(&format!("img-{i}")))
            .await?;
        client
            .enqueue("webhooks", json!({"event": i}), opts(&format!("hook-{i}")))
            .await?;
    }
    client
        .enqueue("webhooks", json!({"flaky": true}), opts("hook-flaky"))
        .await?;
    let delay = Duration::from_secs(2);
    client
        .enqueue(
            "webhooks",
            json!({"event": "later"}),
            EnqueueOptions {
                delay: Some(delay),
                ..opts("hook-delayed")
            },
        )
        .await?;

    // The burst: marketing at priority 8, all at once (a few bounce).
    let burst_began = Instant::now();
    for i in 0..s.marketing {
        let to = if i < s.bounces {
            format!("bounce-{i}@invalid.test")
        } else {
            format!("user{i}@example.test")
        };
        client
            .enqueue(
                "email",
                json!({"to": to, "template": "spring-sale"}),
                EnqueueOptions {
                    priority: Some(8),
                    ..opts(&format!("mkt-{i}"))
                },
            )
            .await?;
    }
    // A trickle of password resets at priority 0 while the backlog drains.
    let mut resets = Vec::new();
    for i in 0..s.resets {
        tokio::time::sleep(s.window / 10).await;
        let to = format!("reset{i}@example.test");
        client
            .enqueue(
                "email",
                json!({"to": to, "template": "password-reset"}),
                EnqueueOptions {
                    priority: Some(0),
                    ..opts(&format!("reset-{i}"))
                },
            )
            .await?;
        resets.push((to, Instant::now()));
    }
    // Wait for everything.
    let expect = s.marketing - s.bounces + s.resets;
    let until =
        Instant::now() + s.window * (2 + (s.marketing / 100) as u32) + Duration::from_secs(30);
    while smtp.lock().unwrap().sent.len() < expect && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut report = Report {
        window_seconds: s.window.as_secs_f64(),
        burst_seconds: burst_began.elapsed().as_secs_f64(),
        ..Report::default()
    };
    let settled = Instant::now() + Duration::from_secs(20);
    let c = store.raw().await?;
    let count = |sql: &'static str| {
        let c = &c;
        async move { c.query_one(sql, &[]).await.map(|r| r.get::<_, i64>(0)) }
    };
    while Instant::now() < settled
        && (count("SELECT count(*) FROM jobs WHERE queue = 'email' AND status = 'dead'").await?
            < s.bounces as i64
            || count("SELECT count(*) FROM jobs WHERE queue <> 'email' AND status <> 'completed'")
                .await?
                > 0)
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    {
        let smtp = smtp.lock().unwrap();
        report.emails_sent = smtp.sent.len();
        report.smtp_connections = smtp.connections;
        let times: Vec<Instant> = smtp.sent.iter().map(|(t, _)| *t).collect();
        report.max_sends_per_window = times
            .iter()
            .enumerate()
            .map(|(i, t)| {
                times[i..]
                    .iter()
                    .take_while(|u| u.duration_since(*t) < s.window)
                    .count()
            })
            .max()
            .unwrap_or(0);
        let last_marketing = smtp
            .sent
            .iter()
            .filter(|(_, to)| to.starts_with("user"))
            .map(|(t, _)| *t)
            .max();
        report.marketing_sent = smtp
            .sent
            .iter()
            .filter(|(_, to)| to.starts_with("user"))
            .count();
        report.resets_sent = smtp
            .sent
            .iter()
            .filter(|(_, to)| to.starts_with("reset"))
            .count();
        for (to, enqueued) in &resets {
            match smtp.sent.iter().find(|(_, r)| r == to) {
                Some((t, _)) => {
                    report.slowest_reset_seconds = report
                        .slowest_reset_seconds
                        .max(t.duration_since(*enqueued).as_secs_f64());
                    if last_marketing.is_some_and(|m| *t > m) {
                        report.resets_after_backlog += 1;
                    }
                }
                None => report.resets_after_backlog += 1,
            }
        }
    }
    report.max_concurrent_emails = app_state.sending.lock().unwrap().1;
    report.dead_emails =
        count("SELECT count(*) FROM jobs WHERE queue = 'email' AND status = 'dead'").await?;
    report.dead_alerts = heard
        .lock()
        .unwrap()
        .iter()
        .filter(|a| a.contains("\"queue\":\"email\""))
        .count();
    report.pdf_completed =
        count("SELECT count(*) FROM jobs WHERE queue = 'pdf' AND status = 'completed'").await?;
    report.images_completed =
        count("SELECT count(*) FROM jobs WHERE queue = 'images' AND status = 'completed'").await?;
    report.webhooks_completed =
        count("SELECT count(*) FROM jobs WHERE queue = 'webhooks' AND status = 'completed'")
            .await?;
    report.flaky_webhook_attempts = store
        .job_get("hook-flaky")
        .await?
        .map(|j| j.attempts)
        .unwrap_or(0);
    if let Some(j) = store.job_get("hook-delayed").await? {
        if let Some(started) = j.started_at {
            let started = chrono::DateTime::parse_from_rfc3339(&started)?;
            let created = chrono::DateTime::parse_from_rfc3339(&j.created_at)?;
            report.delayed_webhook_waited_seconds =
                (started - created).num_milliseconds() as f64 / 1000.0;
        }
    }
    let html = reqwest::Client::builder()
        .no_proxy()
        .build()?
        .get(format!(
            "http://127.0.0.1:{dashboard_port}/jobs?queue=email&status=dead"
        ))
        .send()
        .await?
        .text()
        .await?;
    report.dashboard_dead_rows = html.matches("<tr data-id=").count();
    for p in &mut pods {
        p.stop();
    }
    Ok(report)
}
