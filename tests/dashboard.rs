//! The dashboard in a real headless Chromium (Debian's `chromium`, driven by `chromedriver`
//! over WebDriver): every view against real data from a running worker, numbers checked
//! against SQL, a dead job retried from the dead-letter view and seen to complete, and the
//! read-only mode. Screenshots go to `target/screenshots/`.
//!
//! The browser is `/usr/bin/chromium` and `/usr/bin/chromedriver` (or `JOBWARDEN_CHROMIUM`,
//! `JOBWARDEN_CHROMEDRIVER`); when one is missing the browser tests fail in CI and skip
//! loudly elsewhere ([`common::tools::require_tool`]).

mod common;

use common::{wait_for, TestEnv};
use fantoccini::{Client, ClientBuilder, Locator};
use jobwarden::client::EnqueueOptions;
use jobwarden::handler::{from_fn, JobError};
use serde_json::json;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const TOKEN: &str = "dashboard-test-admin-token-0123";

/// A chromedriver process on a free port, killed on drop.
struct Driver {
    child: Child,
    port: u16,
    profile: tempdir::Dir,
    /// The browser chromedriver starts.
    chromium: PathBuf,
}

/// Debian's chromium and chromium-driver, as the tests expect them; `JOBWARDEN_CHROMIUM` and
/// `JOBWARDEN_CHROMEDRIVER` name other builds (or, pointed at nothing, hide them).
const INSTALL_BROWSER: &str =
    "apt-get install -y chromium chromium-driver (as root; bash scripts/ensure-servers.sh --browser does it)";

/// A browser binary at its default path, or where `env` says.
#[track_caller]
fn browser_binary(name: &str, env: &str, default: &str) -> Option<PathBuf> {
    let path = std::env::var_os(env).map_or_else(|| PathBuf::from(default), PathBuf::from);
    common::tools::require_tool(name, &path, INSTALL_BROWSER)
}

mod tempdir {
    /// A directory removed on drop.
    pub struct Dir(pub std::path::PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

impl Driver {
    /// Starts chromedriver, or `None` when Chromium or chromedriver is missing outside CI
    /// (in CI the test fails: [`common::tools::require_tool`]).
    #[track_caller]
    fn start() -> Option<Driver> {
        let chromium = browser_binary("chromium", "JOBWARDEN_CHROMIUM", CHROMIUM)?;
        let chromedriver = browser_binary("chromedriver", "JOBWARDEN_CHROMEDRIVER", CHROMEDRIVER)?;
        let port = common::testkit::free_port();
        let child = Command::new(&chromedriver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let profile = std::env::temp_dir().join(common::testkit::unique_name("chromium"));
        std::fs::create_dir_all(&profile).unwrap();
        Some(Driver {
            child,
            port,
            profile: tempdir::Dir(profile),
            chromium,
        })
    }

    /// A fresh headless browser (its own profile, so no cookie is shared).
    async fn browser(&self, name: &str) -> Client {
        let profile = self.profile.0.join(name);
        let caps = json!({
            "goog:chromeOptions": {
                "binary": self.chromium,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync",
                    "--window-size=1400,900",
                    format!("--user-data-dir={}", profile.display()),
                ]
            }
        });
        let caps: serde_json::Map<String, serde_json::Value> = caps.as_object().unwrap().clone();
        // chromedriver speaks plain HTTP, but the client's connector wants a TLS provider.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let url = format!("http://127.0.0.1:{}", self.port);
        for _ in 0..50 {
            match ClientBuilder::rustls()
                .expect("rustls")
                .capabilities(caps.clone())
                .connect(&url)
                .await
            {
                Ok(c) => return c,
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        panic!("chromedriver on port {} never took a session", self.port);
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The text at `css`; found again if the page replaced it meanwhile (the overview's rows
/// are redrawn every 2 s).
async fn text(b: &Client, css: &str) -> String {
    let mut last = String::new();
    for _ in 0..10 {
        match b.find(Locator::Css(css)).await {
            Ok(e) => match e.text().await {
                Ok(t) => return t,
                Err(err) => last = err.to_string(),
            },
            Err(err) => last = err.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{css}: {last}");
}

/// Logs in as admin with the form in the page's header.
async fn log_in(b: &Client) {
    b.find(Locator::Css("input[name='token']"))
        .await
        .unwrap()
        .send_keys(TOKEN)
        .await
        .unwrap();
    b.find(Locator::Css("header form button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    // The click only submits the form: wait for the answer (the header names the admin), or
    // the next navigation may go out before the session cookie is set.
    let who = wait_text(b, "header", 10, |t| t.contains("Log out")).await;
    assert!(who.contains("Log out"), "not logged in: {who}");
}

async fn count(b: &Client, css: &str) -> usize {
    b.find_all(Locator::Css(css)).await.unwrap().len()
}

async fn screenshot(b: &Client, name: &str) {
    let png = b.screenshot().await.unwrap();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
}

/// Waits until `cond` holds for the text at `css` (the page updates itself).
async fn wait_text(b: &Client, css: &str, secs: u64, cond: impl Fn(&str) -> bool) -> String {
    let until = std::time::Instant::now() + Duration::from_secs(secs);
    loop {
        let t = text(b, css).await;
        if cond(&t) || std::time::Instant::now() > until {
            return t;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn every_dashboard_view_shows_what_sql_says_and_a_dead_job_is_retried_from_it() {
    let Some(driver) = Driver::start() else {
        return;
    };
    let env = TestEnv::new(&format!(
        "[queues.work]\nhandler = {{ kind = \"rust\", name = \"ok\" }}\n\
         [queues.email]\nmax_attempts = 1\nhandler = {{ kind = \"rust\", name = \"mail\" }}\n\
         [cron.nightly]\nschedule = \"0 3 * * *\"\nqueue = \"work\"\n\
         [dashboard]\nlisten = \"127.0.0.1:0\"\nadmin_token = \"{TOKEN}\"\n"
    ))
    .await;
    // The mail server refuses everything until it is "fixed".
    let fixed = Arc::new(AtomicBool::new(false));
    let f = fixed.clone();
    let mail = from_fn(move |_job| {
        let f = f.clone();
        async move {
            if f.load(Ordering::SeqCst) {
                Ok(None)
            } else {
                Err(JobError::retry("550 mailbox unavailable"))
            }
        }
    });
    let ok = from_fn(|_job| async { Ok(Some(json!({"pages": 3}))) });
    let worker = env.worker(&[("ok", ok), ("mail", mail)]).await;
    let base = format!("http://{}", worker.dashboard_addr.expect("dashboard on"));
    for i in 0..30 {
        env.enqueue_id("work", &format!("report-{i:02}"), json!({"report": i}))
            .await
            .unwrap();
    }
    // Plain messages: the queue's max_attempts (1) applies.
    for i in 0..3 {
        env.publish_raw(
            "email",
            json!({"id": format!("mail-{i}"), "payload": {"to": format!("user{i}@example.com")}})
                .to_string(),
        )
        .await;
    }
    let client = jobwarden::client::Client::new(env.store.clone(), env.broker.clone());
    client
        .enqueue(
            "work",
            json!({"later": true}),
            EnqueueOptions {
                id: Some("later-1".into()),
                delay: Some(Duration::from_secs(3600)),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(env.wait_count("completed", 30, 20).await);
    assert!(env.wait_count("dead", 3, 20).await);

    let b = driver.browser("admin").await;

    // Overview: the numbers are the database's.
    b.goto(&format!("{base}/")).await.unwrap();
    let cell = |q: &str, f: &str| format!("td[data-queue='{q}'][data-field='{f}']");
    let dead_sql = env
        .scalar("SELECT count(*) FROM jobs WHERE queue = 'email' AND status = 'dead'")
        .await;
    assert_eq!(text(&b, &cell("email", "dead")).await, dead_sql.to_string());
    let sched_sql = env
        .scalar("SELECT count(*) FROM jobs WHERE queue = 'work' AND status = 'scheduled'")
        .await;
    assert_eq!(
        text(&b, &cell("work", "scheduled")).await,
        sched_sql.to_string()
    );
    assert_eq!(text(&b, &cell("work", "queued")).await, "0");
    let done_1m = env
        .scalar(
            "SELECT count(*) FROM job_attempts WHERE queue = 'work' AND outcome = 'completed' \
         AND finished_at > now() - interval '60 seconds'",
        )
        .await;
    assert_eq!(done_1m, 30);
    assert_eq!(
        text(&b, &cell("work", "throughput")).await,
        format!("{:.1}/s", done_1m as f64 / 60.0)
    );
    assert_eq!(text(&b, &cell("email", "failure_rate")).await, "100.0%");
    assert_ne!(text(&b, &cell("work", "p50")).await, "–");
    screenshot(&b, "overview").await;
    // It updates live: a fourth dead mail appears without a reload.
    env.publish_raw(
        "email",
        json!({"id": "mail-3", "payload": {"to": "user3@example.com"}}).to_string(),
    )
    .await;
    assert!(env.wait_count("dead", 4, 20).await);
    let live = wait_text(&b, &cell("email", "dead"), 10, |t| t == "4").await;
    assert_eq!(live, "4", "the overview did not update by itself");

    // Jobs: filtered by queue and status, and by text in the error.
    b.goto(&format!("{base}/jobs?queue=work&status=completed"))
        .await
        .unwrap();
    assert_eq!(count(&b, "#jobs tbody tr[data-id]").await, 30);
    b.goto(&format!("{base}/jobs?q=550")).await.unwrap();
    assert_eq!(count(&b, "#jobs tbody tr[data-id]").await, 4);
    // A page holds 50: the 30 completed + 1 scheduled + 4 dead fit in one, so no next link;
    // the filter form keeps the query.
    assert_eq!(count(&b, "#next").await, 0);

    // A job: status, every attempt, payload, and what it waits for.
    b.find(Locator::Css("#jobs a[href='/job?id=mail-0']"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    assert_eq!(text(&b, "dd[data-field='status']").await, "dead");
    let attempts_sql = env
        .scalar("SELECT count(*) FROM job_attempts WHERE job_id = 'mail-0'")
        .await;
    assert_eq!(count(&b, "#attempts tbody tr").await as i64, attempts_sql);
    assert!(text(&b, "#attempts")
        .await
        .contains("550 mailbox unavailable"));
    assert!(text(&b, "#payload").await.contains("user0@example.com"));
    screenshot(&b, "job").await;
    b.goto(&format!("{base}/job?id=report-00")).await.unwrap();
    assert!(text(&b, "#result").await.contains("\"pages\": 3"));
    b.goto(&format!("{base}/job?id=later-1")).await.unwrap();
    let waiting = text(&b, "dd[data-field='waiting']").await;
    assert!(waiting.contains("run_at"), "{waiting}");

    // Workers: this worker, with its heartbeat.
    b.goto(&format!("{base}/workers")).await.unwrap();
    let row = format!("#workers tr[data-id='{}']", worker.id);
    assert!(text(&b, &row).await.ends_with("alive"));
    assert_eq!(
        text(&b, &format!("{row} td[data-field='in_flight']")).await,
        "0"
    );

    // Scheduled jobs and cron schedules with their next fires.
    b.goto(&format!("{base}/scheduled")).await.unwrap();
    assert_eq!(count(&b, "#scheduled tr[data-id='later-1']").await, 1);
    let cron = text(&b, "#cron tr[data-id='nightly']").await;
    assert!(
        cron.contains("0 3 * * *") && cron.contains("T03:00:00Z"),
        "{cron}"
    );

    // The dead-letter queue, as an admin: retry one, then all.
    b.goto(&format!("{base}/dead?queue=email")).await.unwrap();
    assert_eq!(
        count(&b, "input[type='checkbox']").await,
        0,
        "read-only before login"
    );
    log_in(&b).await;
    b.goto(&format!("{base}/dead?queue=email")).await.unwrap();
    assert_eq!(count(&b, "#jobs tbody tr[data-id]").await, 4);
    fixed.store(true, Ordering::SeqCst);
    b.find(Locator::Css("input[value='mail-0']"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    b.find(Locator::Css("#retry-selected"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    assert_eq!(text(&b, "#msg").await, "1 dead job(s) retried");
    screenshot(&b, "dead").await;
    assert!(
        env.wait_status("mail-0", "completed", 20).await,
        "the retried job never completed"
    );
    b.goto(&format!("{base}/dead?queue=email")).await.unwrap();
    assert_eq!(count(&b, "#jobs tbody tr[data-id]").await, 3);
    b.find(Locator::Css("#retry-all"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    assert_eq!(text(&b, "#msg").await, "3 dead job(s) retried");
    assert!(
        wait_for(Duration::from_secs(20), || async {
            env.scalar("SELECT count(*) FROM jobs WHERE queue = 'email' AND status = 'completed'")
                .await
                == 4
        })
        .await
    );

    // Discard: the dead job and its attempts are gone.
    fixed.store(false, Ordering::SeqCst);
    env.publish_raw(
        "email",
        json!({"id": "mail-9", "payload": {"to": "nobody@example.com"}}).to_string(),
    )
    .await;
    assert!(env.wait_status("mail-9", "dead", 20).await);
    b.goto(&format!("{base}/dead?queue=email")).await.unwrap();
    b.find(Locator::Css("input[value='mail-9']"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    b.find(Locator::Css("#discard-selected"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    assert_eq!(text(&b, "#msg").await, "1 dead job(s) discarded");
    assert_eq!(
        env.scalar("SELECT count(*) FROM jobs WHERE id = 'mail-9'")
            .await
            + env
                .scalar("SELECT count(*) FROM job_attempts WHERE job_id = 'mail-9'")
                .await,
        0
    );

    // Another visitor, without the token: read-only, and a forged POST is refused.
    let guest = driver.browser("guest").await;
    guest.goto(&format!("{base}/dead")).await.unwrap();
    assert_eq!(count(&guest, "input[type='checkbox']").await, 0);
    assert_eq!(count(&guest, "#retry-selected").await, 0);
    guest.close().await.unwrap();
    let forged = reqwest::Client::new()
        .post(format!("{base}/dead/discard"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body("queue=email&all=1")
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status(), 403);
    // The admin's cookie, but the request comes from another origin (a page on another port
    // of this host is the same *site* for SameSite): refused. From the dashboard's own
    // origin, the same request goes through.
    let cookie = b.get_named_cookie("jobwarden_admin").await.unwrap();
    assert!(
        !cookie.value().contains(TOKEN),
        "the cookie must not carry the token"
    );
    let host = base.trim_start_matches("http://");
    let post = |origin: String| {
        reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap()
            .post(format!("{base}/dead/retry"))
            .header("cookie", format!("jobwarden_admin={}", cookie.value()))
            .header("origin", origin)
            .header("content-type", "application/x-www-form-urlencoded")
            .body("queue=email&all=1")
            .send()
    };
    assert_eq!(
        post("http://127.0.0.1:3000".into()).await.unwrap().status(),
        403
    );
    let own = post(format!("http://{host}")).await.unwrap();
    assert_eq!(own.status(), 303);
    // A message in the URL is never shown: only the server's own words are.
    b.goto(&format!(
        "{base}/dead?msg=log+in+at+evil.example&done=bogus"
    ))
    .await
    .unwrap();
    assert_eq!(count(&b, "#msg").await, 0);
    b.close().await.unwrap();
    worker.shutdown().await;
}

/// The dashboard's statements against 10,000 jobs (and as many attempts, and 1,000 workers),
/// after ANALYZE: none reads a whole table. (A text search in ids and errors walks the primary
/// key in order until a page is full: when nothing matches, that is the whole table, and the
/// time limit stops it; see `a_search_that_takes_too_long_is_stopped_...`.)
#[tokio::test]
async fn dashboard_queries_read_through_indexes_on_10000_jobs() {
    let env = TestEnv::new("[queues.work]\nhandler = { kind = \"rust\", name = \"h\" }\n").await;
    let c = env.store.raw().await.unwrap();
    c.batch_execute(
        "INSERT INTO jobs (id, queue, payload, status, attempts, max_attempts, last_error,
                           scheduled_at, completed_at, updated_at)
         SELECT 'job-' || lpad(g::text, 5, '0'), 'q' || (g % 8), '{}'::jsonb,
                CASE WHEN g % 100 = 0 THEN 'dead' WHEN g % 100 = 1 THEN 'queued'
                     WHEN g % 100 = 2 THEN 'scheduled' WHEN g % 100 = 3 THEN 'processing'
                     ELSE 'completed' END,
                1, 5, CASE WHEN g % 100 = 0 THEN 'boom ' || g END,
                now() + (g % 60) * interval '1 minute',
                now() - (g % 1440) * interval '1 minute', now() - g * interval '1 second'
         FROM generate_series(1, 10000) g;
         INSERT INTO job_attempt_log (job_id, lease, attempt, worker_id, started_at, finished_at,
                                      outcome, queue)
         SELECT 'job-' || lpad(g::text, 5, '0'), 1, 1, 'w', now() - g * interval '9 second',
                now() - g * interval '9 second' + interval '5 ms', 'retry', 'q' || (g % 8)
         FROM generate_series(10000, 1, -1) g;
         INSERT INTO workers (id, hostname, pid, version, stopped_at)
         SELECT 'host-' || g || '-1-0000', 'host-' || g, 1, 'test',
                CASE WHEN g % 10 <> 0 THEN now() END
         FROM generate_series(1, 1000) g;
         UPDATE jobs SET pipeline = 'job-00040' WHERE id BETWEEN 'job-00041' AND 'job-00045';
         INSERT INTO flow_queues (queue, key_declared_at) SELECT 'q' || g, now() FROM generate_series(0, 7) g;
         ANALYZE jobs; ANALYZE job_attempt_log; ANALYZE workers;",
    )
    .await
    .unwrap();
    let sql = |name: &str| {
        jobwarden::store::ALL_SQL
            .iter()
            .find(|(n, _)| *n == name)
            .unwrap_or_else(|| panic!("{name}"))
            .1
    };
    let none: Option<String> = None;
    let q1 = Some("q1".to_string());
    let dead = Some("dead".to_string());
    let queued = Some("queued".to_string());
    let text = Some("boom 42".to_string());
    let first = String::new();
    let limit = 50i64;
    let no_key: Option<i64> = None;
    let some_key: Option<i64> = Some(1_700_000_000_000_000);
    let job = "job-00042".to_string();
    let zero = 0i64;
    let names = vec!["nightly".to_string()];
    let cases: Vec<(&str, &str, Vec<&(dyn tokio_postgres::types::ToSql + Sync)>)> = vec![
        ("overview", sql("dashboard_overview"), vec![&first, &limit]),
        (
            "text search (walks the primary key, stopped by the time limit)",
            sql("dashboard_jobs"),
            vec![&none, &none, &text, &first, &limit],
        ),
        (
            "text search in dead jobs",
            sql("dashboard_jobs"),
            vec![&none, &dead, &text, &first, &limit],
        ),
        ("workers", sql("dashboard_workers"), vec![&first, &limit]),
        (
            "attempts",
            sql("dashboard_attempts"),
            vec![&job, &zero, &limit],
        ),
        (
            "pipeline",
            sql("pipeline_jobs"),
            vec![&job, &no_key, &first, &limit],
        ),
        (
            "pipeline, a later page",
            sql("pipeline_jobs"),
            vec![&job, &some_key, &job, &limit],
        ),
        (
            "pipeline counts",
            sql("dashboard_pipeline_counts"),
            vec![&job],
        ),
        ("cron fires", sql("dashboard_cron_fires"), vec![&names]),
        (
            "scheduled, a later page",
            sql("dashboard_scheduled"),
            vec![&some_key, &job, &limit],
        ),
        (
            "jobs, first page",
            sql("dashboard_jobs"),
            vec![&none, &none, &none, &first, &limit],
        ),
        (
            "jobs of a queue",
            sql("dashboard_jobs"),
            vec![&q1, &none, &none, &first, &limit],
        ),
        (
            "dead jobs",
            sql("dashboard_jobs"),
            vec![&none, &dead, &none, &first, &limit],
        ),
        (
            "queued jobs of a queue",
            sql("dashboard_jobs"),
            vec![&q1, &queued, &none, &first, &limit],
        ),
        (
            "scheduled",
            sql("dashboard_scheduled"),
            vec![&no_key, &first, &limit],
        ),
        ("depth", sql("job_depth"), vec![]),
        ("busiest keys", sql("key_busiest"), vec![&none, &limit]),
    ];
    for (what, text, params) in cases {
        let rows = c
            .query(&format!("EXPLAIN {text}"), &params)
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let plan: Vec<String> = rows.iter().map(|r| r.get::<_, String>(0)).collect();
        let plan = plan.join("\n");
        for table in ["jobs", "job_attempt_log", "workers"] {
            assert!(
                !plan.contains(&format!("Seq Scan on {table}")),
                "{what} reads all of {table}:\n{plan}"
            );
        }
    }
}

#[tokio::test]
async fn a_pipeline_is_one_view_and_an_admin_cancels_it_there() {
    let Some(driver) = Driver::start() else {
        return;
    };
    let env = TestEnv::new(&format!(
        "[queues.charge]\nhandler = {{ kind = \"rust\", name = \"h\" }}\n\
         [queues.pdf]\nhandler = {{ kind = \"rust\", name = \"h\" }}\n\
         [queues.email]\nhandler = {{ kind = \"rust\", name = \"h\" }}\n\
         [dashboard]\nlisten = \"127.0.0.1:0\"\nadmin_token = \"{TOKEN}\"\n"
    ))
    .await;
    // The charge has a result; the PDF step hangs until cancelled.
    let h = from_fn(|job| async move {
        if job.queue == "pdf" {
            tokio::time::sleep(Duration::from_secs(120)).await;
        }
        Ok((job.queue == "charge").then(|| json!({"charge": "ch_1"})))
    });
    let worker = env.worker(&[("h", h)]).await;
    let base = format!("http://{}", worker.dashboard_addr.expect("dashboard on"));
    let client = jobwarden::client::Client::new(env.store.clone(), env.broker.clone());
    client
        .enqueue(
            "charge",
            json!({"order": 1}),
            EnqueueOptions {
                id: Some("order-1".into()),
                then: vec![jobwarden::client::Then::new("pdf", json!({"order": 1}))
                    .then(jobwarden::client::Then::new("email", json!({"order": 1})))],
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(env.wait_status("order-1.1", "processing", 20).await);
    client
        .enqueue(
            "email",
            json!({"audit": 1}),
            EnqueueOptions {
                id: Some("audit-1".into()),
                depends_on: vec!["order-1.1".into()],
                ..Default::default()
            },
        )
        .await
        .unwrap();

    let b = driver.browser("pipeline").await;
    b.goto(&format!("{base}/job?id=audit-1")).await.unwrap();
    b.find(Locator::Css("#pipeline-link"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let rows: Vec<String> = {
        let mut out = Vec::new();
        for e in b
            .find_all(Locator::Css("#pipeline tbody tr"))
            .await
            .unwrap()
        {
            out.push(e.text().await.unwrap());
        }
        out
    };
    assert_eq!(rows.len(), 3, "{rows:?}");
    assert!(rows[0].starts_with("order-1 charge completed"), "{rows:?}");
    // Each step's result, which the steps after it receive.
    assert!(rows[0].contains(r#"{"charge":"ch_1"}"#), "{rows:?}");
    assert!(rows[1].starts_with("order-1.1 pdf processing"), "{rows:?}");
    assert!(rows[1].contains("then 1 more"), "{rows:?}");
    assert!(rows[2].starts_with("audit-1 email waiting"), "{rows:?}");
    assert!(rows[2].contains("order-1.1"), "{rows:?}");
    let summary = text(&b, "#pipeline-summary").await;
    assert_eq!(summary, "3 jobs: 1 completed, 1 processing, 1 waiting");
    assert_eq!(
        count(&b, "#cancel-pipeline").await,
        0,
        "read-only before login"
    );
    screenshot(&b, "dashboard-pipeline").await;

    log_in(&b).await;
    b.goto(&format!("{base}/pipeline?id=order-1"))
        .await
        .unwrap();
    b.find(Locator::Css("#cancel-pipeline"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let flash = text(&b, ".msg").await;
    assert_eq!(flash, "2 jobs cancelled");
    assert!(env.wait_status("order-1.1", "cancelled", 10).await);
    assert_eq!(env.status_of("audit-1").await.as_deref(), Some("cancelled"));
    assert_eq!(
        env.scalar("SELECT count(*) FROM jobs WHERE id = 'order-1.1.1'")
            .await,
        0
    );
    b.close().await.unwrap();
    worker.shutdown().await;
}

/// GETs a dashboard page; returns the status and the body.
async fn page(url: &str) -> (u16, String) {
    let r = reqwest::get(url).await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// The `data-id`s of the rows of the table `#table_id` in `html`.
fn row_ids(html: &str, table_id: &str) -> Vec<String> {
    let start = html
        .find(&format!("<table id=\"{table_id}\""))
        .unwrap_or_else(|| panic!("no #{table_id} in {html}"));
    let table = &html[start..start + html[start..].find("</table>").unwrap()];
    table
        .split("<tr data-id=\"")
        .skip(1)
        .map(|r| r[..r.find('"').unwrap()].to_string())
        .collect()
}

/// The link `#link_id` of `html`, made absolute on `base` (HTML entities undone).
fn link(html: &str, base: &str, link_id: &str) -> Option<String> {
    let at = html.find(&format!("<a id=\"{link_id}\" href=\""))?;
    let rest = &html[at + link_id.len() + 15..];
    let href = &rest[..rest.find('"').unwrap()];
    Some(format!("{base}{}", href.replace("&amp;", "&")))
}

/// Every row of a list, page after page (following `#link_id`); asserts each page holds at
/// most 50 rows.
async fn all_pages(base: &str, first: &str, table_id: &str, link_id: &str) -> Vec<String> {
    let mut url = format!("{base}{first}");
    let mut all = Vec::new();
    for _ in 0..20 {
        let (status, html) = page(&url).await;
        assert_eq!(status, 200, "{url}: {html}");
        let ids = row_ids(&html, table_id);
        assert!(ids.len() <= 50, "{url}: {} rows on one page", ids.len());
        all.extend(ids);
        match link(&html, base, link_id) {
            Some(next) => url = next,
            None => return all,
        }
    }
    panic!("{first}: more than 20 pages");
}

#[tokio::test]
async fn every_dashboard_list_is_paged() {
    let mut toml = String::from(
        "[queues.work]\nhandler = { kind = \"rust\", name = \"h\" }\n\
         [dashboard]\nlisten = \"127.0.0.1:0\"\n",
    );
    for i in 0..70 {
        toml.push_str(&format!(
            "[cron.c{i:02}]\nschedule = \"0 3 * * *\"\nqueue = \"work\"\n"
        ));
    }
    let env = TestEnv::new(&toml).await;
    let c = env.store.raw().await.unwrap();
    c.batch_execute(
        "INSERT INTO jobs (id, queue, payload, status, attempts, max_attempts, scheduled_at,
                           completed_at, pipeline, last_error)
         SELECT 'p-' || lpad(g::text, 3, '0'), 'q' || lpad(g::text, 3, '0'), '{}'::jsonb,
                CASE WHEN g % 2 = 0 THEN 'scheduled' ELSE 'dead' END, 1, 5,
                now() + g * interval '1 minute', now(),
                CASE WHEN g > 1 THEN 'p-001' END, 'boom'
         FROM generate_series(1, 120) g;
         INSERT INTO job_attempt_log (job_id, lease, attempt, worker_id, started_at, finished_at,
                                      outcome, queue)
         SELECT 'p-001', g, g, 'w', now(), now(), 'retry', 'q001'
         FROM generate_series(1, 70) g;
         INSERT INTO workers (id, hostname, pid, version)
         SELECT 'host-' || lpad(g::text, 3, '0') || '-1-0000', 'host', 1, 'test'
         FROM generate_series(1, 70) g;",
    )
    .await
    .unwrap();
    let worker = env
        .worker(&[("h", from_fn(|_job| async { Ok(None) }))])
        .await;
    let base = format!("http://{}", worker.dashboard_addr.unwrap());
    let distinct = |ids: &[String]| {
        let mut d = ids.to_vec();
        d.sort();
        d.dedup();
        d.len()
    };
    for (first, table, link_id, expected) in [
        ("/jobs", "jobs", "next", 120),
        ("/jobs?status=scheduled", "jobs", "next", 60),
        ("/dead", "jobs", "next", 60),
        ("/scheduled", "scheduled", "next", 60),
        ("/scheduled", "cron", "next-cron", 70),
        // 70 inserted, and the worker itself.
        ("/workers", "workers", "next", 71),
        ("/job?id=p-001", "attempts", "next-attempts", 70),
        ("/pipeline?id=p-001", "pipeline", "next", 120),
    ] {
        let ids = all_pages(&base, first, table, link_id).await;
        assert_eq!(ids.len(), expected, "{first} #{table}: {ids:?}");
        assert_eq!(
            distinct(&ids),
            expected,
            "{first} #{table}: a row on two pages"
        );
    }
    // The overview: one row per queue (120 queues), paged too.
    let (_, html) = page(&format!("{base}/")).await;
    let rows = html.matches("data-field=\"queued\"").count();
    assert_eq!(rows, 50, "queues on the overview's first page");
    let next = link(&html, &base, "next").expect("a next page of queues");
    let (_, html) = page(&next).await;
    assert!(html.contains("data-queue=\"q051\""), "{html}");
    let (_, summary) = page(&format!("{base}/pipeline?id=p-050")).await;
    assert!(
        summary.contains("120 jobs: 60 <span class=\"s s-dead\">dead</span>, 60"),
        "{summary}"
    );
    worker.shutdown().await;
}

#[tokio::test]
async fn a_search_that_takes_too_long_is_stopped_and_the_page_says_how_to_narrow_it() {
    let env = TestEnv::new(
        "[queues.work]\nhandler = { kind = \"rust\", name = \"h\" }\n\
         [dashboard]\nlisten = \"127.0.0.1:0\"\n",
    )
    .await;
    let worker = env
        .worker(&[("h", from_fn(|_job| async { Ok(None) }))])
        .await;
    let base = format!("http://{}", worker.dashboard_addr.unwrap());
    // Whatever makes the statement slow (a scan of a huge table, a migration's lock), the
    // time limit stops it: here a lock held by another session.
    let mut c = env.store.raw().await.unwrap();
    let tx = c.transaction().await.unwrap();
    tx.batch_execute("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let answered = tokio::time::timeout(
        Duration::from_secs(30),
        page(&format!("{base}/jobs?q=matches-nothing")),
    )
    .await;
    tx.rollback().await.unwrap();
    let (status, html) = answered.expect("the search was not stopped");
    assert_eq!(status, 503, "{html}");
    assert!(
        html.contains("id=\"too-slow\"") && html.contains("pick a queue or a status"),
        "{html}"
    );
    // Without the lock, the same search answers.
    let (status, html) = page(&format!("{base}/jobs?q=matches-nothing")).await;
    assert_eq!(status, 200, "{html}");
    assert!(html.contains("no jobs match"), "{html}");
    worker.shutdown().await;
}

/// A value that is markup if a page forgets to escape it: a tag, both quotes and an
/// ampersand, without the whitespace and `/` a job id may not hold.
const HOSTILE: &str = "<script>alert('jw')\"&'";

/// [`HOSTILE`] as a page must show it: `<`, `>`, `"` and `&` escaped (`'` needs no escape:
/// every attribute is in double quotes).
fn escaped(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[tokio::test]
async fn a_hostile_value_is_shown_escaped_on_every_page() {
    // A cron schedule's name is a TOML key: quoted, its `"` escaped.
    let cron = format!("\"cron{}\"", HOSTILE.replace('"', "\\\""));
    let env = TestEnv::new(&format!(
        "[queues.work]\nhandler = {{ kind = \"rust\", name = \"h\" }}\n\
         [cron.{cron}]\nschedule = \"0 3 * * *\"\nqueue = \"work\"\n\
         [dashboard]\nlisten = \"127.0.0.1:0\"\nadmin_token = \"{TOKEN}\"\n"
    ))
    .await;
    let c = env.store.raw().await.unwrap();
    // A dead job with every field hostile, first of its pipeline; a child waiting for it
    // (so the pipeline can be cancelled); a scheduled job; a worker; attempts.
    c.execute(
        "INSERT INTO jobs (id, queue, payload, result, status, attempts, max_attempts, last_error,
                           worker_id, lease, stage, progress, message, idempotency_key, pipeline,
                           scheduled_at, completed_at)
         VALUES ('job' || $1, 'queue' || $1, jsonb_build_object('k', 'payload' || $1),
                 jsonb_build_object('r', 'result' || $1), 'dead', 1, 1, 'error' || $1,
                 'worker' || $1, 1, 'stage' || $1, 0.5, 'message' || $1, 'key' || $1,
                 'job' || $1, now(), now()),
                ('child' || $1, 'queue' || $1, '{}', NULL, 'waiting', 0, 1, NULL, NULL, 0,
                 NULL, NULL, NULL, NULL, 'job' || $1, now(), NULL),
                ('sched' || $1, 'queue' || $1, '{}', NULL, 'scheduled', 1, 5, 'error' || $1,
                 NULL, 1, NULL, NULL, NULL, NULL, NULL, now() + interval '1 hour', NULL)",
        &[&HOSTILE],
    )
    .await
    .unwrap();
    c.execute(
        "INSERT INTO job_deps (parent, child) VALUES ('job' || $1, 'child' || $1)",
        &[&HOSTILE],
    )
    .await
    .unwrap();
    c.execute(
        "INSERT INTO job_attempt_log (job_id, lease, attempt, worker_id, started_at, finished_at,
                                      outcome, queue, error)
         VALUES ('job' || $1, 1, 1, 'attempt-worker' || $1, now(), now(), 'dead',
                 'queue' || $1, 'attempt-error' || $1)",
        &[&HOSTILE],
    )
    .await
    .unwrap();
    c.execute(
        "INSERT INTO workers (id, hostname, pid, version)
         VALUES ('worker' || $1, 'host' || $1, 1, 'version' || $1)",
        &[&HOSTILE],
    )
    .await
    .unwrap();
    c.execute(
        "INSERT INTO queue_pauses (queue, paused_by, reason)
         VALUES ('queue' || $1, 'by' || $1, 'reason' || $1)",
        &[&HOSTILE],
    )
    .await
    .unwrap();
    let worker = env
        .worker(&[("h", from_fn(|_job| async { Ok(None) }))])
        .await;
    let base = format!("http://{}", worker.dashboard_addr.unwrap());
    let e = |field: &str| escaped(&format!("{field}{HOSTILE}"));
    let u = |field: &str| {
        let v = format!("{field}{HOSTILE}");
        form_urlencoded::byte_serialize(v.as_bytes()).collect::<String>()
    };
    let pages: Vec<(String, u16, Vec<String>)> = vec![
        ("/".into(), 200, vec![e("queue"), e("by"), e("reason")]),
        (
            "/fragments/overview".into(),
            200,
            vec![e("queue"), e("by"), e("reason")],
        ),
        (
            "/jobs".into(),
            200,
            vec![
                e("job"),
                e("child"),
                e("sched"),
                e("queue"),
                e("worker"),
                e("error"),
            ],
        ),
        (format!("/jobs?q={}", u("")), 200, vec![e(""), e("job")]),
        (
            format!("/dead?queue={}", u("queue")),
            200,
            vec![
                e("job"),
                e("error"),
                format!("Retry every dead job of {}", e("queue")),
            ],
        ),
        (
            format!("/job?id={}", u("job")),
            200,
            vec![
                format!("Job {}", e("job")),
                e("queue"),
                e("stage"),
                e("message"),
                e("worker"),
                e("key"),
                e("error"),
                e("attempt-worker"),
                e("attempt-error"),
                escaped("payload<script>alert('jw')"),
                escaped("result<script>alert('jw')"),
                format!("value=\"{}\"", e("job")),
            ],
        ),
        (format!("/job?id={}", u("missing")), 404, vec![e("missing")]),
        (
            format!("/pipeline?id={}", u("job")),
            200,
            vec![
                e("job"),
                e("child"),
                e("queue"),
                format!("value=\"{}\"", e("job")),
            ],
        ),
        (
            "/workers".into(),
            200,
            vec![e("worker"), e("host"), e("version")],
        ),
        (
            "/scheduled".into(),
            200,
            vec![e("sched"), e("queue"), e("cron")],
        ),
    ];
    let admin = reqwest::Client::new();
    for (path, status, shown) in pages {
        let r = admin
            .get(format!("{base}{path}"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), status, "{path}");
        let html = r.text().await.unwrap();
        assert!(
            !html.contains("<script>alert"),
            "{path} shows a value unescaped:\n{html}"
        );
        for s in shown {
            assert!(html.contains(&s), "{path} does not show {s}:\n{html}");
        }
    }
    worker.shutdown().await;
}

/// The overview's pause and resume: an admin pauses a queue (with a reason) and resumes it;
/// without the token the same POST is refused and nothing is paused; a queue no running
/// worker serves is not paused, and the banner says why.
#[tokio::test]
async fn an_admin_pauses_and_resumes_a_queue_from_the_overview() {
    let env = TestEnv::new(&format!(
        "[queues.work]\nhandler = {{ kind = \"rust\", name = \"h\" }}\n\
         [dashboard]\nlisten = \"127.0.0.1:0\"\nadmin_token = \"{TOKEN}\"\n"
    ))
    .await;
    let worker = env
        .worker(&[("h", from_fn(|_job| async { Ok(None) }))])
        .await;
    env.publish_raw("work", r#"{"id":"w1","payload":{}}"#).await;
    assert!(env.wait_status("w1", "completed", 10).await);
    let base = format!("http://{}", worker.dashboard_addr.unwrap());
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let post = |path: &str, body: &str, token: Option<&str>| {
        let mut r = client
            .post(format!("{base}{path}"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body.to_string());
        if let Some(t) = token {
            r = r.header("authorization", format!("Bearer {t}"));
        }
        r.send()
    };
    let forged = post("/queue/pause", "queue=work", None).await.unwrap();
    assert_eq!(forged.status(), 403);
    assert_eq!(env.scalar("SELECT count(*) FROM queue_pauses").await, 0);

    let done = post("/queue/pause", "queue=work&reason=INC-7", Some(TOKEN))
        .await
        .unwrap();
    assert_eq!(done.status(), 303);
    assert_eq!(
        done.headers()["location"].to_str().unwrap(),
        "/?done=paused&n=1"
    );
    assert_eq!(
        env.scalar("SELECT count(*) FROM queue_pauses WHERE queue = 'work' AND paused_by = 'dashboard:admin' AND reason = 'INC-7'")
            .await,
        1
    );
    let page = client
        .get(format!("{base}/?done=paused&n=1"))
        .header("authorization", format!("Bearer {TOKEN}"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("queue paused: nothing new starts"), "{page}");
    assert!(page.contains("by dashboard:admin: INC-7"), "{page}");
    assert!(page.contains("action=\"/queue/resume\""), "{page}");

    let resumed = post("/queue/resume", "queue=work", Some(TOKEN))
        .await
        .unwrap();
    assert_eq!(
        resumed.headers()["location"].to_str().unwrap(),
        "/?done=resumed&n=1"
    );
    assert_eq!(env.scalar("SELECT count(*) FROM queue_pauses").await, 0);
    let again = post("/queue/resume", "queue=work", Some(TOKEN))
        .await
        .unwrap();
    assert_eq!(
        again.headers()["location"].to_str().unwrap(),
        "/?done=not-paused&n=0"
    );
    let unserved = post("/queue/pause", "queue=nobody", Some(TOKEN))
        .await
        .unwrap();
    assert_eq!(
        unserved.headers()["location"].to_str().unwrap(),
        "/?done=not-served&n=0"
    );
    assert_eq!(env.scalar("SELECT count(*) FROM queue_pauses").await, 0);
    worker.shutdown().await;
}

/// `/charts` draws each queue's last hour (per minute) and last 24 hours (per hour) from the
/// rollup and its live tail: the sums its bars stand for are the history's.
#[tokio::test]
async fn charts_draw_the_last_hour_and_day_from_the_rollup() {
    let Some(driver) = Driver::start() else {
        return;
    };
    let env = TestEnv::new(
        "[queues.work]\nmax_attempts = 2\nbackoff = { kind = \"fixed\", base = \"50ms\" }\n\
         handler = { kind = \"rust\", name = \"h\" }\n\
         [dashboard]\nlisten = \"127.0.0.1:0\"\n",
    )
    .await;
    // History as the rollup holds it: minutes 2 to 50 ago (5 completed, 1 retried, waits
    // of 100–250 ms each), hours 3 to 20 ago (100 completed, 2 retried). Whichever minute or
    // hour the page is drawn in, all of them fall in its range.
    env.store
        .raw()
        .await
        .unwrap()
        .batch_execute(
            "INSERT INTO job_rollup (queue, span, bucket, completed, retried, run_ms, run_hist,
                                     wait_ms, wait_hist)
             SELECT 'work', 'minute', date_trunc('minute', now()) - m * interval '1 minute',
                    5, 1, 60, '{6,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0}'::int8[], 900,
                    '{0,0,0,0,0,5,0,0,0,0,0,0,0,0,0,0,0}'::int8[]
             FROM generate_series(2, 50) m
             UNION ALL
             SELECT 'work', 'hour', date_trunc('hour', now()) - h * interval '1 hour',
                    100, 2, 1020, '{102,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0}'::int8[], 0,
                    '{100,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0}'::int8[]
             FROM generate_series(3, 20) h",
        )
        .await
        .unwrap();
    let h = common::by_kind();
    let worker = env.worker(&[("h", h)]).await;
    let base = format!("http://{}", worker.dashboard_addr.expect("dashboard on"));
    // And now: 8 completed (2 after a retry), 1 dead.
    for (i, kind) in ["ok", "ok", "flaky", "ok", "bad", "ok", "flaky", "ok", "ok"]
        .iter()
        .enumerate()
    {
        env.publish_raw(
            "work",
            json!({"id": format!("c{i}"), "payload": {"kind": kind}}).to_string(),
        )
        .await;
    }
    assert!(
        wait_for(Duration::from_secs(20), || async {
            env.count("completed").await == 8 && env.count("dead").await == 1
        })
        .await
    );
    let b = driver.browser("viewer").await;
    let total = |series: &'static str| {
        let b = &b;
        async move {
            b.find(Locator::Css(&format!(
                "svg[data-queue='work'][data-series='{series}']"
            )))
            .await
            .unwrap()
            .attr("data-total")
            .await
            .unwrap()
            .unwrap()
        }
    };
    b.goto(&format!("{base}/charts")).await.unwrap();
    assert_eq!(total("completed").await, (49 * 5 + 8).to_string());
    assert_eq!(total("failed").await, (49 + 3).to_string());
    // The waits of the history's minutes (in [100, 250) ms) show as bars.
    assert!(count(&b, "svg[data-series='wait_p95'] rect").await >= 49);
    b.find(Locator::LinkText("last 24 hours, per hour"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    assert_eq!(
        total("completed").await,
        (18 * 100 + 49 * 5 + 8).to_string()
    );
    assert_eq!(total("failed").await, (18 * 2 + 49 + 3).to_string());
    // One bar per hour that did anything: 18 hours of history, the last two hours' minutes;
    // each one drawn (the browser gives it a size), the tallest as tall as the chart allows.
    let bars = b
        .find_all(Locator::Css(
            "svg[data-queue='work'][data-series='completed'] rect[fill]:not([x='0'])",
        ))
        .await
        .unwrap();
    assert!((19..=21).contains(&bars.len()), "{} bars", bars.len());
    let mut tallest = 0.0_f64;
    for bar in &bars {
        let (_, _, w, h) = bar.rectangle().await.unwrap();
        assert!(w > 0.0 && h > 0.0, "a bar is not drawn: {w}×{h}");
        tallest = tallest.max(h);
    }
    assert!(tallest > 40.0, "the tallest bar is {tallest} px");
    screenshot(&b, "dashboard-charts").await;
    b.close().await.unwrap();

    // A range the charts do not know is refused, saying which they do.
    let (status, body) = page(&format!("{base}/charts?range=7d")).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("range=1h or range=24h"), "{body}");
    worker.shutdown().await;
}

/// An ordered key's dead job, from the dashboard: the overview lists the busiest keys (the
/// key's later job parked behind it), the job's page has a *Skip in key order* button for an
/// admin (none for a guest), and skipping lets the key's later job run, recorded with the
/// admin's name.
#[tokio::test]
async fn an_ordered_keys_dead_job_is_skipped_from_its_page_and_the_busiest_keys_are_shown() {
    let Some(driver) = Driver::start() else {
        return;
    };
    let env = TestEnv::new(&format!(
        "[queues.work]\nhandler = {{ kind = \"rust\", name = \"h\" }}\nordered_by_key = true\n\
         [dashboard]\nlisten = \"127.0.0.1:0\"\nadmin_token = \"{TOKEN}\"\n"
    ))
    .await;
    let h = from_fn(|job| async move {
        if job.payload["bad"] == json!(true) {
            Err(JobError::permanent("bad input"))
        } else {
            Ok(None)
        }
    });
    let worker = env.worker(&[("h", h)]).await;
    let base = format!("http://{}", worker.dashboard_addr.expect("dashboard on"));
    for i in 1..=2 {
        env.publish_raw(
            "work",
            json!({"id": format!("A-{i}"), "key": "customer-42", "payload": {"bad": i == 1}})
                .to_string(),
        )
        .await;
    }
    assert!(env.wait_status("A-1", "dead", 20).await);
    let parked = || async {
        env.scalar("SELECT count(*) FROM jobs WHERE id = 'A-2' AND parked")
            .await
            == 1
    };
    assert!(wait_for(Duration::from_secs(10), parked).await);

    let guest = driver.browser("guest").await;
    guest.goto(&format!("{base}/")).await.unwrap();
    let row = "#busiest-keys tr[data-key='customer-42']";
    assert_eq!(
        text(&guest, &format!("{row} td[data-field='parked']")).await,
        "1"
    );
    guest.goto(&format!("{base}/job?id=A-1")).await.unwrap();
    assert_eq!(
        count(&guest, "#skip").await,
        0,
        "a guest has no skip button"
    );
    guest.close().await.unwrap();

    let b = driver.browser("admin").await;
    b.goto(&format!("{base}/job?id=A-1")).await.unwrap();
    log_in(&b).await;
    b.goto(&format!("{base}/job?id=A-1")).await.unwrap();
    let waiting = text(&b, "dd[data-field='waiting']").await;
    assert!(
        waiting.contains("holds the later jobs of ordered key customer-42"),
        "{waiting}"
    );
    b.find(Locator::Css("#skip"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    assert_eq!(
        text(&b, "#msg").await,
        "skipped in its key's order: the key's later jobs run on (the job stays dead)"
    );
    assert!(
        env.wait_status("A-2", "completed", 20).await,
        "the key's later job never ran"
    );
    assert_eq!(env.status_of("A-1").await.as_deref(), Some("dead"));
    assert_eq!(
        env.scalar(
            "SELECT count(*) FROM key_skips WHERE job_id = 'A-1' AND skipped_by LIKE 'dashboard:%'"
        )
        .await,
        1
    );
    // Skipped already: said, nothing changes.
    b.goto(&format!("{base}/job?id=A-1")).await.unwrap();
    b.find(Locator::Css("#skip"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    assert!(text(&b, "#msg").await.starts_with("not skipped"));
    b.close().await.unwrap();
    worker.shutdown().await;
}

/// A batch member's page shows the batch's progress, and an awaiting job its deadline.
#[tokio::test]
async fn a_members_page_shows_its_batchs_progress_and_an_awaiting_jobs_deadline() {
    let Some(driver) = Driver::start() else {
        return;
    };
    let env = TestEnv::new(&format!(
        "[queues.work]\nhandler = {{ kind = \"rust\", name = \"h\" }}\n\
         [dashboard]\nlisten = \"127.0.0.1:0\"\nadmin_token = \"{TOKEN}\"\n"
    ))
    .await;
    let h = from_fn(|job| async move {
        if job.payload["defer"] == json!(true) {
            return job.defer(Duration::from_secs(600));
        }
        Ok(None)
    });
    let worker = env.worker(&[("h", h)]).await;
    let base = format!("http://{}", worker.dashboard_addr.expect("dashboard on"));
    let member = |id: &str, defer: bool| {
        jobwarden::client::BulkJob::new(
            "work",
            json!({ "defer": defer }),
            EnqueueOptions {
                id: Some(id.into()),
                ..Default::default()
            },
        )
    };
    let batch = jobwarden::client::Batch {
        id: Some("b-7".into()),
        jobs: vec![member("b-7-done", false), member("b-7-wait", true)],
        ..Default::default()
    };
    env.client().enqueue_batch(&batch).await.unwrap();
    assert!(env.wait_status("b-7-wait", "awaiting", 20).await);
    assert!(env.wait_status("b-7-done", "completed", 20).await);
    let b = driver.browser("batch").await;
    b.goto(&format!("{base}/job?id=b-7-wait")).await.unwrap();
    assert_eq!(text(&b, "dd[data-field='status']").await, "awaiting");
    let batch_line = text(&b, "dd[data-field='batch']").await;
    assert_eq!(batch_line, "b-7 · 1 of 2 ended (1 completed, 1 running)");
    let page = b.source().await.unwrap();
    assert!(page.contains("awaiting until"), "{page}");
    b.close().await.unwrap();
    worker.shutdown().await;
}
