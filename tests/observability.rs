//! What operators and Kubernetes see: `/metrics` parsed with a Prometheus text parser while
//! jobs flow, and the probes (`/livez`, `/readyz`) through a PostgreSQL outage and a drain.
//! And what a busy or careless neighbour can do to the ports: the drain only by POST (or the
//! preStop hook's header), never from another site; half-sent requests cut off, bodies
//! bounded; scrapes that cost at most one depth reading per interval; a flood of unserved
//! subjects that costs a bounded amount per janitor round.

mod common;

use common::{wait_for, TestEnv};
use jobwarden::handler::{from_fn, JobError};
use prometheus_parse::{Sample, Scrape};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

/// A handler whose jobs each wait for a permit of the returned gate.
fn gated() -> (Arc<dyn jobwarden::Handler>, Arc<Semaphore>) {
    let gate = Arc::new(Semaphore::new(0));
    let g = gate.clone();
    let h = from_fn(move |_job| {
        let g = g.clone();
        async move {
            g.acquire().await.unwrap().forget();
            Ok(None)
        }
    });
    (h, gate)
}

async fn scrape(addr: std::net::SocketAddr) -> Scrape {
    let resp = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let ctype = resp.headers()["content-type"].to_str().unwrap().to_string();
    assert!(ctype.starts_with("application/openmetrics-text"), "{ctype}");
    let body = resp.text().await.unwrap();
    assert!(body.ends_with("# EOF\n"), "not OpenMetrics text: {body}");
    common::evidence::parse_metrics(&body)
}

/// The value of the sample `name` whose labels include all of `labels` (0 when absent).
fn value(s: &Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    common::evidence::metric(s, name, labels).unwrap_or(0.0)
}

/// Scrapes until `cond` holds (up to `secs`); returns whether it did and the last scrape.
async fn scrape_until(
    addr: std::net::SocketAddr,
    secs: u64,
    cond: impl Fn(&Scrape) -> bool,
) -> (bool, Scrape) {
    let until = std::time::Instant::now() + Duration::from_secs(secs);
    loop {
        let s = scrape(addr).await;
        if cond(&s) || std::time::Instant::now() > until {
            return (cond(&s), s);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// GETs `path` until its status is `status` (up to `secs`); returns the last answer.
async fn get_until(
    addr: std::net::SocketAddr,
    path: &str,
    status: u16,
    secs: u64,
) -> (u16, String) {
    let until = std::time::Instant::now() + Duration::from_secs(secs);
    loop {
        let got = get(addr, path).await;
        if got.0 == status || std::time::Instant::now() > until {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn has(s: &Scrape, name: &str) -> bool {
    s.samples.iter().any(|x| x.metric == name)
}

#[tokio::test]
async fn metrics_count_jobs_by_queue_and_outcome_as_they_flow() {
    let env = TestEnv::new(
        "[queues.work]\nhandler = { kind = \"rust\", name = \"ok\" }\n\
         [queues.flaky]\nmax_attempts = 2\nbackoff = { kind = \"exponential\", base = \"10ms\", max = \"10ms\" }\n\
         handler = { kind = \"rust\", name = \"fail\" }\n\
         [queues.held]\nconcurrency = 1\nhandler = { kind = \"rust\", name = \"wait\" }\n",
    )
    .await;
    let (wait, gate) = gated();
    let ok = from_fn(|_job| async {
        tokio::time::sleep(Duration::from_millis(5)).await;
        Ok(None)
    });
    let fail = from_fn(|_job| async { Err(JobError::retry("upstream said 503")) });
    let worker = env
        .worker(&[("ok", ok), ("fail", fail), ("wait", wait)])
        .await;
    let addr = worker.ops_addr.expect("ops listener on");

    let before = scrape(addr).await;
    let completed = [("queue", "work"), ("outcome", "completed")];
    assert_eq!(value(&before, "jobwarden_jobs_total", &completed), 0.0);
    assert!(has(&before, "jobwarden_build_info"));
    let build = before
        .samples
        .iter()
        .find(|x| x.metric == "jobwarden_build_info")
        .unwrap();
    assert_eq!(build.labels.get("version"), Some(env!("CARGO_PKG_VERSION")));
    assert!(build.labels.get("nats_server").unwrap().starts_with('2'));

    for i in 0..20 {
        env.enqueue_id("work", &format!("m-{i}"), json!({}))
            .await
            .unwrap();
    }
    // A plain message: the queue's max_attempts (2) applies.
    env.publish_raw("flaky", r#"{"id":"f-0","payload":{}}"#)
        .await;
    assert!(env.wait_count("completed", 20, 20).await);
    assert!(env.wait_status("f-0", "dead", 20).await);
    // Counters move once the settle is written: wait for the scrape to show it.
    let (moved, after) = scrape_until(addr, 10, |s| {
        value(s, "jobwarden_jobs_total", &completed) == 20.0
            && value(
                s,
                "jobwarden_jobs_total",
                &[("queue", "flaky"), ("outcome", "dead")],
            ) == 1.0
    })
    .await;
    assert!(moved, "counters did not reach 20 completed and 1 dead");
    let work = [("queue", "work")];
    assert_eq!(value(&after, "jobwarden_jobs_started_total", &work), 20.0);
    assert_eq!(
        value(
            &after,
            "jobwarden_jobs_total",
            &[("queue", "flaky"), ("outcome", "retried")]
        ),
        1.0
    );
    assert_eq!(
        value(
            &after,
            "jobwarden_jobs_started_total",
            &[("queue", "flaky")]
        ),
        2.0
    );
    // Histograms: every settled attempt has a run time, every started one a queue wait.
    assert_eq!(
        value(&after, "jobwarden_job_duration_seconds_count", &work),
        20.0
    );
    assert_eq!(
        value(&after, "jobwarden_job_queue_wait_seconds_count", &work),
        20.0
    );
    let run_sum = value(&after, "jobwarden_job_duration_seconds_sum", &work);
    assert!(
        run_sum >= 20.0 * 0.005,
        "20 runs of 5 ms sum to {run_sum} s"
    );
    // Depth from PostgreSQL (read at most every 5 s: wait for a reading after the dead
    // job): nothing waits, the dead job counts.
    let dead = [("queue", "flaky"), ("status", "dead")];
    let (read, after) =
        scrape_until(addr, 20, |s| value(s, "jobwarden_queue_jobs", &dead) == 1.0).await;
    assert!(read, "the depth never showed the dead job");
    assert_eq!(
        value(
            &after,
            "jobwarden_queue_jobs",
            &[("queue", "work"), ("status", "queued")]
        ),
        0.0
    );
    assert_eq!(
        value(
            &after,
            "jobwarden_queue_jobs",
            &[("queue", "flaky"), ("status", "dead")]
        ),
        1.0
    );
    assert_eq!(
        value(&after, "jobwarden_reclaims_total", &[("reason", "stale")]),
        0.0
    );
    // Nothing here ran after its job was taken (see the test below for the counts).
    assert!(has(&after, "jobwarden_overlapping_executions_total"));
    assert_eq!(
        value(&after, "jobwarden_overlapping_executions_total", &[]),
        0.0
    );
    for source in ["postgres", "nats"] {
        assert_eq!(
            value(&after, "jobwarden_queue_depth_up", &[("source", source)]),
            1.0,
            "{source}"
        );
    }
    assert!(has(&after, "jobwarden_rate_limit_waits_total"));

    // One slot, held: one job in flight, the other messages wait in the stream.
    for i in 0..5 {
        env.publish_raw(
            "held",
            json!({"id": format!("h-{i}"), "payload": {}}).to_string(),
        )
        .await;
    }
    let held = [("queue", "held")];
    let in_flight_and_waiting = |s: &Scrape| {
        (
            value(s, "jobwarden_jobs_in_flight", &held),
            value(s, "jobwarden_queue_pending_messages", &held)
                + value(s, "jobwarden_queue_unacked_messages", &held),
        )
    };
    let (waiting, s) = scrape_until(addr, 10, |s| in_flight_and_waiting(s) == (1.0, 5.0)).await;
    assert!(
        waiting,
        "(in flight, pending + unacked) = {:?}, expected (1, 5)",
        in_flight_and_waiting(&s)
    );
    gate.add_permits(5);
    assert!(env.wait_count("completed", 25, 20).await);
    let (done, _) = scrape_until(addr, 10, |s| {
        value(s, "jobwarden_jobs_in_flight", &held) == 0.0
            && value(s, "jobwarden_queue_pending_messages", &held) == 0.0
    })
    .await;
    assert!(done, "in flight and pending did not return to 0");
    worker.shutdown().await;
}

/// Sets its flag when dropped.
struct SetOnDrop(Arc<std::sync::atomic::AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// `overlapping_executions` counts each attempt that went on running after the database gave
/// its job to another owner, once, whichever way the worker learns it: the heartbeat's lease
/// check, a rejected progress report, or a rejected completion.
#[tokio::test]
async fn overlapping_executions_counts_each_attempt_that_ran_on_after_its_job_was_taken() {
    // Beats every 2 s: the lease check runs with each, and a job taken away is noticed by a
    // report or a completion first when one follows at once.
    let env = TestEnv::new(
        "heartbeat_every = \"2s\"\ndead_after = \"6s\"\n\
         [queues.work]\nconcurrency = 5\nhandler = { kind = \"rust\", name = \"h\" }\n",
    )
    .await;
    // Each job waits for its own gate; then `report` reports progress, `finish` returns,
    // `hold` waits until the worker stops it.
    let gates: Arc<std::collections::HashMap<&'static str, Arc<Semaphore>>> = Arc::new(
        ["report", "finish", "hold"]
            .into_iter()
            .map(|id| (id, Arc::new(Semaphore::new(0))))
            .collect(),
    );
    let stopped = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (g, st) = (gates.clone(), stopped.clone());
    let h = from_fn(move |job| {
        let (gates, stopped) = (g.clone(), st.clone());
        async move {
            if job.id == "hold" {
                // Stopped either way: it returns when cancelled, or the worker drops it.
                let _ended = SetOnDrop(stopped);
                job.cancel.cancelled().await;
                return Err(JobError::retry("stopped"));
            }
            gates[job.id.as_str()].acquire().await.unwrap().forget();
            if job.id == "report" {
                let lost = job.progress(Default::default()).await.is_err();
                return Err(JobError::retry(format!("progress rejected: {lost}")));
            }
            Ok(None)
        }
    });
    let worker = env.worker(&[("h", h)]).await;
    let ops = worker.ops_addr.expect("ops listener");
    for id in ["report", "finish", "hold"] {
        env.publish_raw("work", json!({"id": id, "payload": {}}).to_string())
            .await;
    }
    for id in ["report", "finish", "hold"] {
        assert!(
            env.wait_status(id, "processing", 10).await,
            "{id} never ran"
        );
    }
    let c = env.store.raw().await.unwrap();
    // Another owner claims the job in the database (the lease moves on) while it runs here.
    let take = |id: &'static str| {
        let c = &c;
        async move {
            let n = c
                .execute(
                    "UPDATE jobs SET worker_id = 'another-worker', lease = lease + 1 \
                     WHERE id = $1 AND status = 'processing'",
                    &[&id],
                )
                .await
                .unwrap();
            assert_eq!(n, 1, "{id} was not processing");
        }
    };
    let overlapping = |s: &Scrape| value(s, "jobwarden_overlapping_executions_total", &[]);
    // The heartbeat's lease check finds `hold` taken and stops it.
    take("hold").await;
    let (seen, s) = scrape_until(ops, 10, |s| overlapping(s) == 1.0).await;
    assert!(
        seen,
        "overlapping_executions is {} 10 s after the job `hold` was taken from a worker that \
         beats every 2 s: the lease check should count it (1)",
        overlapping(&s)
    );
    assert!(
        wait_for(Duration::from_secs(5), || async {
            stopped.load(std::sync::atomic::Ordering::SeqCst)
        })
        .await,
        "the attempt of `hold` was counted but not stopped within 5 s"
    );
    // `report` reports progress after it was taken: the fenced write is rejected.
    take("report").await;
    gates["report"].add_permits(1);
    let (seen, s) = scrape_until(ops, 5, |s| overlapping(s) == 2.0).await;
    assert!(
        seen,
        "overlapping_executions is {} after the job `report` reported progress once taken: \
         the rejected report should count it (2)",
        overlapping(&s)
    );
    // `finish` returns after it was taken: the fenced settle is rejected.
    take("finish").await;
    gates["finish"].add_permits(1);
    let (seen, s) = scrape_until(ops, 5, |s| overlapping(s) == 3.0).await;
    assert!(
        seen,
        "overlapping_executions is {} after the job `finish` completed once taken: the \
         rejected completion should count it (3)",
        overlapping(&s)
    );
    // Two more beats (two more lease checks): each attempt was counted once, not per check.
    for _ in 0..2 {
        assert!(
            env.wait_for_beat(&worker.id, 10).await,
            "no heartbeat within 10 s"
        );
    }
    let s = scrape(ops).await;
    assert_eq!(
        overlapping(&s),
        3.0,
        "three attempts ran on after their jobs were taken, each counted once"
    );
    assert_eq!(
        common::outcomes(&env.store, "finish").await,
        vec!["lost_ownership"],
        "the rejected completion is on record as a late result"
    );
    worker.shutdown().await;
}

/// `GET /v1/drain` as the manifests' preStop hook sends it (`httpGet.httpHeaders`).
async fn drain_prestop(addr: std::net::SocketAddr) -> (u16, String) {
    let r = reqwest::Client::new()
        .get(format!("http://{addr}/v1/drain"))
        .header("X-Jobwarden-Drain", "preStop")
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap_or_default())
}

async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    match reqwest::get(format!("http://{addr}{path}")).await {
        Ok(r) => (r.status().as_u16(), r.text().await.unwrap_or_default()),
        Err(e) => (0, e.to_string()),
    }
}

#[tokio::test]
async fn readiness_turns_503_during_a_postgres_outage_and_on_drain_liveness_never() {
    let pg = common::testkit::PgCluster::start().unwrap();
    let env = TestEnv::with_database(
        &pg.url(),
        "[queues.work]\nhandler = { kind = \"rust\", name = \"ok\" }\n",
    )
    .await;
    let worker = env
        .worker(&[("ok", from_fn(|_job| async { Ok(None) }))])
        .await;
    let ops = worker.ops_addr.unwrap();
    assert_eq!(get(ops, "/readyz").await, (200, "ready".to_string()));
    assert_eq!(get(ops, "/livez").await.0, 200);
    assert_eq!(get(ops, "/healthz").await.0, 200);
    // The local API answers the probes too.
    assert_eq!(get(worker.api_addr, "/readyz").await.0, 200);

    pg.stop_immediate().unwrap();
    let last = get_until(ops, "/readyz", 503, 10).await;
    let unready = last.0 == 503;
    assert!(unready, "readyz during the outage: {last:?}");
    assert!(last.1.starts_with("postgres: "), "{}", last.1);
    assert_eq!(
        get(ops, "/livez").await.0,
        200,
        "liveness must not check servers"
    );
    let (status, metrics) = get(ops, "/metrics").await;
    assert_eq!(status, 200);
    assert!(
        metrics.contains("jobwarden_queue_depth_up{source=\"postgres\"} 0"),
        "{metrics}"
    );

    pg.start_again().unwrap();
    let after = get_until(ops, "/readyz", 200, 20).await;
    let ready = after.0 == 200;
    assert!(ready, "readyz after the outage: {after:?}");

    // Progress reports stay off the ops listener (it is reachable from outside the pod).
    let on_ops = reqwest::Client::new()
        .post(format!("http://{ops}/v1/jobs/x/progress?lease=1"))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(on_ops.status(), 404);
    // Drain as a Kubernetes preStop hook does it: a GET with its header on the ops port.
    let (status, body) = drain_prestop(ops).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(get(ops, "/readyz").await, (503, "draining".to_string()));
    assert_eq!(get(ops, "/livez").await.0, 200);
    worker.shutdown().await;
}

/// A drain (as the preStop hook sends it, on the ops port) turns the worker unready at once
/// but leaves it alive, lets a running job that ends within `shutdown_grace` finish, gives
/// back one that does not (without costing it an attempt), and answers only then, with what
/// it did.
#[tokio::test]
async fn a_prestop_drain_finishes_what_ends_within_the_grace_and_releases_the_rest() {
    let env = TestEnv::new(
        "shutdown_grace = \"2s\"\n\
         [queues.held]\nconcurrency = 2\nhandler = { kind = \"rust\", name = \"h\" }\n",
    )
    .await;
    let gate = Arc::new(Semaphore::new(0));
    let g = gate.clone();
    let h = from_fn(move |job| {
        let g = g.clone();
        async move {
            if job.id == "d-hang" {
                job.cancel.cancelled().await;
                return Err(JobError::retry("cancelled"));
            }
            g.acquire().await.unwrap().forget();
            Ok(None)
        }
    });
    let worker = env.worker(&[("h", h)]).await;
    let ops = worker.ops_addr.expect("ops listener");
    for id in ["d-finish", "d-hang"] {
        env.publish_raw("held", json!({"id": id, "payload": {}}).to_string())
            .await;
    }
    assert!(env.wait_count("processing", 2, 10).await);
    assert_eq!(get(ops, "/readyz").await.0, 200);
    let drain = tokio::spawn(async move { drain_prestop(ops).await });
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(
        !drain.is_finished(),
        "the drain must wait for the running jobs"
    );
    assert_eq!(get(ops, "/readyz").await, (503, "draining".to_string()));
    assert_eq!(
        get(ops, "/livez").await.0,
        200,
        "a draining worker is alive"
    );
    assert_eq!(get(ops, "/healthz").await.0, 200);
    gate.add_permits(1);
    let (status, body) = tokio::time::timeout(Duration::from_secs(10), drain)
        .await
        .expect("the drain answers once the grace is over")
        .unwrap();
    assert_eq!(status, 200, "{body}");
    let report: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(report, json!({"finished": 1, "released": 1}));
    assert_eq!(
        env.status_of("d-finish").await.as_deref(),
        Some("completed")
    );
    let hung = env.store.job_get("d-hang").await.unwrap().unwrap();
    assert_eq!(hung.attempts, 0, "released without costing an attempt");
    assert!(
        matches!(hung.status.as_str(), "scheduled" | "queued"),
        "{}",
        hung.status
    );
    assert_eq!(
        common::outcomes(&env.store, "d-hang").await,
        vec!["released"]
    );
    assert_eq!(get(ops, "/readyz").await, (503, "draining".to_string()));
    worker.shutdown().await;
}

#[tokio::test]
async fn workers_lists_each_worker_with_heartbeat_age_and_jobs_in_flight() {
    let env = TestEnv::new(
        "[queues.held]\nconcurrency = 2\nhandler = { kind = \"rust\", name = \"wait\" }\n",
    )
    .await;
    let (wait, gate) = gated();
    let worker = env.worker(&[("wait", wait)]).await;
    for i in 0..2 {
        env.publish_raw(
            "held",
            json!({"id": format!("w-{i}"), "payload": {}}).to_string(),
        )
        .await;
    }
    assert!(env.wait_count("processing", 2, 10).await);
    let out = env.cli(&["workers", "--json"]);
    assert!(out.status.success(), "{}", common::text(&out));
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    let me = rows
        .iter()
        .find(|r| r["id"] == worker.id.as_str())
        .unwrap_or_else(|| panic!("{} not in {rows:?}", worker.id));
    assert_eq!(me["in_flight"], 2);
    assert_eq!(me["hostname"], "test");
    assert_eq!(me["version"], env!("CARGO_PKG_VERSION"));
    assert!(me["heartbeat_age_seconds"].as_f64().unwrap() < 5.0, "{me}");
    let table = common::text(&env.cli(&["workers"]));
    let line = table
        .lines()
        .find(|l| l.starts_with(&worker.id))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(line.ends_with("alive"), "{line}");
    assert!(line.contains(" 2 "), "two jobs in flight: {line}");

    gate.add_permits(2);
    assert!(env.wait_count("completed", 2, 10).await);
    let id = worker.id.clone();
    worker.shutdown().await;
    let running = common::text(&env.cli(&["workers"]));
    assert!(!running.contains(&id), "{running}");
    let all = common::text(&env.cli(&["workers", "--all"]));
    let line = all
        .lines()
        .find(|l| l.starts_with(&id))
        .unwrap_or_else(|| panic!("{all}"));
    assert!(line.ends_with("stopped (shutdown)"), "{line}");
}

/// Sends `head` on a new connection and returns how the server ended it: `Ok(bytes answered)`
/// once it closed the connection, `Err` if it was still open after `limit`.
async fn send_and_wait_close(
    addr: std::net::SocketAddr,
    head: &[u8],
    limit: Duration,
) -> Result<Vec<u8>, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
    c.write_all(head).await.unwrap();
    let mut got = Vec::new();
    let read = async {
        let mut buf = [0u8; 4096];
        loop {
            match c.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    };
    match tokio::time::timeout(limit, read).await {
        Ok(()) => Ok(got),
        Err(_) => Err(format!(
            "still open after {limit:?}; answered so far: {}",
            String::from_utf8_lossy(&got)
        )),
    }
}

#[tokio::test]
async fn a_drain_changes_state_only_by_post_or_the_prestop_header_and_never_cross_site() {
    let env = TestEnv::new("[queues.work]\nhandler = { kind = \"rust\", name = \"ok\" }\n").await;
    let worker = env
        .worker(&[("ok", from_fn(|_job| async { Ok(None) }))])
        .await;
    let ops = worker.ops_addr.unwrap();
    let http = reqwest::Client::new();
    for addr in [ops, worker.api_addr] {
        // A link, an <img>, a crawler: told to POST, nothing drained.
        let r = http
            .get(format!("http://{addr}/v1/drain"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 405, "GET /v1/drain on {addr}");
        assert_eq!(r.headers()["allow"], "POST");
        let body = r.text().await.unwrap();
        assert!(
            body.contains("POST /v1/drain") && body.contains("X-Jobwarden-Drain: preStop"),
            "{body}"
        );
        // A page on another site POSTing (a form), or one that sets the header through
        // fetch (a browser sends Origin with both), is refused.
        for (name, value) in [
            ("Origin", "https://evil.example"),
            ("Sec-Fetch-Site", "cross-site"),
            ("Sec-Fetch-Site", "same-site"),
        ] {
            let r = http
                .post(format!("http://{addr}/v1/drain"))
                .header(name, value)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 403, "{name}: {value} on {addr}");
            let body = r.text().await.unwrap();
            assert!(body.contains("another site"), "{body}");
            let r = http
                .get(format!("http://{addr}/v1/drain"))
                .header("X-Jobwarden-Drain", "preStop")
                .header(name, value)
                .send()
                .await
                .unwrap();
            assert_eq!(
                r.status(),
                403,
                "preStop GET with {name}: {value} on {addr}"
            );
        }
        let r = http
            .get(format!("http://{addr}/v1/drain"))
            .header("X-Jobwarden-Drain", "yes please")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 405, "a wrong header value drains nothing");
    }
    assert_eq!(get(ops, "/readyz").await, (200, "ready".to_string()));
    // The worker still takes jobs.
    env.enqueue_id("work", "after-refusals", json!({}))
        .await
        .unwrap();
    assert!(env.wait_status("after-refusals", "completed", 10).await);

    // A program's POST drains.
    let r = http
        .post(format!("http://{}/v1/drain", worker.api_addr))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(get(ops, "/readyz").await, (503, "draining".to_string()));
    worker.shutdown().await;
}

#[tokio::test]
async fn half_sent_requests_are_cut_off_and_oversized_bodies_refused_on_every_listener() {
    let env = TestEnv::new(
        "[queues.work]\nhandler = { kind = \"rust\", name = \"ok\" }\n\
         [dashboard]\nlisten = \"127.0.0.1:0\"\nadmin_token = \"ports-test-admin-token-0123\"\n",
    )
    .await;
    let worker = env
        .worker(&[("ok", from_fn(|_job| async { Ok(None) }))])
        .await;
    let listeners = [
        ("local API", worker.api_addr),
        ("ops", worker.ops_addr.unwrap()),
        ("dashboard", worker.dashboard_addr.unwrap()),
    ];
    // Half a header line, then nothing: each listener closes the connection (the timeout
    // is 10 s; a minute is the generous bound, not a measurement).
    let half_sent = listeners.map(|(name, addr)| async move {
        let end = send_and_wait_close(
            addr,
            b"GET /livez HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: aaa",
            Duration::from_secs(60),
        )
        .await;
        (name, end)
    });
    for (name, end) in futures::future::join_all(half_sent).await {
        let answered = end.unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            !String::from_utf8_lossy(&answered).contains("200 OK"),
            "{name} answered a request it never fully received"
        );
    }
    // A request head over the size limit: 431, closed.
    let big = format!(
        "GET /livez HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(64 * 1024)
    );
    for (name, addr) in listeners {
        let answered = send_and_wait_close(addr, big.as_bytes(), Duration::from_secs(60))
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let text = String::from_utf8_lossy(&answered);
        assert!(text.starts_with("HTTP/1.1 431"), "{name}: {text}");
    }

    // An oversized progress report: 413 naming the limit, before the body is read.
    let http = reqwest::Client::new();
    let api = worker.api_addr;
    let r = http
        .post(format!("http://{api}/v1/jobs/x/progress?lease=1"))
        .body(vec![b' '; 32 * 1024])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    let body = r.text().await.unwrap();
    assert!(body.contains("over 16384 bytes"), "{body}");
    // A body announced and then not sent: 408 (10 s; the bound is generous).
    let answered = send_and_wait_close(
        api,
        b"POST /v1/jobs/x/progress?lease=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro",
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&answered);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    // A dashboard form over its limit: 413 too.
    let dash = worker.dashboard_addr.unwrap();
    let r = http
        .post(format!("http://{dash}/login"))
        .body(format!("token={}", "a".repeat(100 * 1024)))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);

    // Every listener still answers, and the worker still works.
    for (name, addr) in listeners {
        let path = if name == "dashboard" {
            "/workers"
        } else {
            "/livez"
        };
        assert_eq!(get(addr, path).await.0, 200, "{name}");
    }
    env.enqueue_id("work", "after-the-neighbour", json!({}))
        .await
        .unwrap();
    assert!(
        env.wait_status("after-the-neighbour", "completed", 10)
            .await
    );
    worker.shutdown().await;
}

#[tokio::test]
async fn a_worker_drained_on_request_and_never_stopped_exits_after_drained_exit_after() {
    let env = TestEnv::new("[queues.work]\nhandler = { kind = \"rust\", name = \"ok\" }\n").await;
    let mut config = env.config.clone();
    config.worker.drained_exit_after = Duration::from_secs(1);
    let worker = env
        .worker_with(config, &[("ok", from_fn(|_job| async { Ok(None) }))])
        .await;
    let ops = worker.ops_addr.unwrap();
    let (status, _) = drain_prestop(ops).await;
    assert_eq!(status, 200);
    // No stop signal ever comes: the worker ends by itself (1 s; a minute is the bound).
    let ended = tokio::time::timeout(
        Duration::from_secs(60),
        worker.run_until(std::future::pending()),
    )
    .await;
    assert!(ended.is_ok(), "a drained worker kept running");
}

#[tokio::test]
async fn the_jobwarden_process_exits_0_when_drained_and_never_stopped() {
    let env = TestEnv::new(
        "[queues.work]\nhandler = { kind = \"http\", url = \"http://127.0.0.1:9/jobs\" }\n",
    )
    .await;
    let mut config = env.config.clone();
    let ops: std::net::SocketAddr = format!("127.0.0.1:{}", common::testkit::free_port())
        .parse()
        .unwrap();
    config.worker.ops_listen = ops.to_string().parse().unwrap();
    config.worker.drained_exit_after = Duration::from_secs(2);
    let log = std::env::temp_dir().join(common::testkit::unique_name("drained-exit.log"));
    let mut child = common::ChildWorker::spawn_logged(&config, "pod-d", &log);
    let (status, body) = get_until(ops, "/readyz", 200, 60).await;
    assert_eq!(status, 200, "{body}");
    let r = reqwest::Client::new()
        .post(format!("http://{ops}/v1/drain"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(get(ops, "/livez").await.0, 200, "alive while drained");
    let code = child.wait_exit(Duration::from_secs(60)).await;
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("no stop signal came within worker.drained_exit_after"),
        "{text}"
    );
}

/// JetStream API requests the server has answered so far (its monitoring port's `/jsz`).
async fn js_api_requests(monitor: u16) -> u64 {
    let v: serde_json::Value = reqwest::get(format!("http://127.0.0.1:{monitor}/jsz"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["api"]["total"].as_u64().expect("jsz api.total")
}

#[tokio::test]
async fn scrapes_in_a_row_cost_at_most_one_depth_reading_per_interval() {
    let monitor = common::testkit::free_port();
    let env = TestEnv::with_nats_conf(
        &format!("http_port: {monitor}\n"),
        "[queues.work]\nhandler = { kind = \"rust\", name = \"wait\" }\n\
         [queues.other]\nhandler = { kind = \"rust\", name = \"wait\" }\n",
    )
    .await;
    let (wait, gate) = gated();
    let worker = env.worker(&[("wait", wait)]).await;
    let addr = worker.ops_addr.unwrap();
    for i in 0..3 {
        env.enqueue_id("work", &format!("d-{i}"), json!({}))
            .await
            .unwrap();
    }
    assert!(env.wait_count("processing", 3, 10).await);
    // Let the depth shown catch up with the three jobs (at most one interval).
    let (caught_up, _) = scrape_until(addr, 20, |s| {
        value(
            s,
            "jobwarden_queue_jobs",
            &[("queue", "work"), ("status", "processing")],
        ) == 3.0
    })
    .await;
    assert!(caught_up, "the depth never showed the 3 running jobs");
    let refreshes = |s: &Scrape| value(s, "jobwarden_queue_depth_refreshes_total", &[]);
    let first = scrape(addr).await;
    let api_before = js_api_requests(monitor).await;
    let started = std::time::Instant::now();
    let mut last = first.clone();
    for _ in 0..50 {
        last = scrape(addr).await;
    }
    let elapsed = started.elapsed();
    let api_after = js_api_requests(monitor).await;
    let readings = refreshes(&last) - refreshes(&first);
    // One reading per started interval at most (the bound follows the measured time, so a
    // slow machine only allows more).
    let allowed = (elapsed.as_secs_f64() / 5.0).floor() + 1.0;
    assert!(
        readings <= allowed,
        "{readings} depth readings for 50 scrapes in {elapsed:?} (at most {allowed})"
    );
    // Counted by the server itself: before, each scrape cost three requests per lane (22
    // lanes here), over 3,000 for these 50 scrapes. Now each reading costs two (the stream,
    // its consumer listing); the rest is the worker's own background work.
    let api = api_after - api_before;
    assert!(
        api <= 2 * readings as u64 + 40,
        "{api} JetStream API requests during 50 scrapes ({readings} readings)"
    );
    // The depths are still there.
    assert_eq!(
        value(
            &last,
            "jobwarden_queue_jobs",
            &[("queue", "work"), ("status", "processing")]
        ),
        3.0
    );
    assert_eq!(
        value(
            &last,
            "jobwarden_queue_unacked_messages",
            &[("queue", "work")]
        ),
        3.0
    );
    assert_eq!(
        value(
            &last,
            "jobwarden_queue_pending_messages",
            &[("queue", "other")]
        ),
        0.0
    );
    assert!(has(&last, "jobwarden_queue_depth_age_seconds"));
    gate.add_permits(3);
    worker.shutdown().await;
}

/// Publishes one message on each of `n` distinct subjects no queue serves
/// (`jobs.flood-000` …), and `emial` messages on `jobs.emial` (a typo).
async fn flood(env: &TestEnv, n: usize, emial: usize) {
    let mut acks = Vec::new();
    for i in 0..n {
        acks.push(
            env.broker
                .js
                .publish(
                    format!("jobs.flood-{i:03}"),
                    format!("{{\"n\":{i}}}").into(),
                )
                .await
                .unwrap(),
        );
    }
    for i in 0..emial {
        acks.push(
            env.broker
                .js
                .publish("jobs.emial", format!("{{\"typo\":{i}}}").into())
                .await
                .unwrap(),
        );
    }
    for ack in acks {
        ack.await.unwrap();
    }
}

#[tokio::test]
async fn a_flood_of_distinct_unserved_subjects_costs_a_bounded_amount_per_round() {
    let env = TestEnv::new(
        "[queues.work]\nhandler = { kind = \"http\", url = \"http://127.0.0.1:9/jobs\" }\n",
    )
    .await;
    flood(&env, 500, 7).await;
    let mut config = env.config.clone();
    let ops: std::net::SocketAddr = format!("127.0.0.1:{}", common::testkit::free_port())
        .parse()
        .unwrap();
    config.worker.ops_listen = ops.to_string().parse().unwrap();
    // One janitor round (1 s after start) within the test.
    config.worker.sweep_every = Duration::from_secs(120);
    let log = std::env::temp_dir().join(common::testkit::unique_name("unserved.log"));
    let _child = common::ChildWorker::spawn_logged(&config, "pod-u", &log);
    let (status, body) = get_until(ops, "/readyz", 200, 60).await;
    assert_eq!(status, 200, "{body}");
    let (seen, s) = scrape_until(ops, 60, |s| {
        value(s, "jobwarden_unserved_subjects", &[]) == 501.0
    })
    .await;
    assert!(seen, "the janitor never counted 501 unserved subjects");
    // Every waiting message is counted, in at most 10 named queues and one (other).
    let series: Vec<&Sample> = s
        .samples
        .iter()
        .filter(|x| x.metric == "jobwarden_unserved_messages")
        .collect();
    assert!(series.len() <= 11, "{} unserved series", series.len());
    let sum: f64 = series
        .iter()
        .map(|x| value(&s, &x.metric, &[("queue", x.labels.get("queue").unwrap())]))
        .sum();
    assert_eq!(sum, 507.0);
    assert_eq!(
        value(&s, "jobwarden_unserved_messages", &[("queue", "emial")]),
        7.0
    );
    assert_eq!(
        value(&s, "jobwarden_unserved_messages", &[("queue", "(other)")]),
        491.0
    );
    // Only the subjects with the most messages were read and recorded (one stream read
    // each); the biggest first.
    assert!(
        wait_for_rows(&env, "SELECT count(*) FROM unserved_subjects", 100).await,
        "unserved_subjects rows: {}",
        env.scalar("SELECT count(*) FROM unserved_subjects").await
    );
    assert_eq!(
        env.scalar("SELECT messages FROM unserved_subjects WHERE subject = 'jobs.emial'")
            .await,
        7
    );
    // One summary line for the round, not one per subject.
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    let lines: Vec<&str> = text.lines().filter(|l| l.contains("jobs.flood")).collect();
    assert!(
        lines.len() <= 1,
        "{} log lines name flood subjects:\n{text}",
        lines.len()
    );
    assert!(
        text.contains("messages wait on subjects no worker serves")
            && text.contains("jobs.emial (7)"),
        "{text}"
    );
}

async fn wait_for_rows(env: &TestEnv, sql: &str, n: i64) -> bool {
    common::wait_for(Duration::from_secs(20), || async {
        env.scalar(sql).await == n
    })
    .await
}

#[tokio::test]
async fn every_flooded_unserved_subject_is_dead_lettered_in_bounded_rounds() {
    let env = TestEnv::new(
        "sweep_every = \"300ms\"\nunserved_grace = \"1s\"\n\
         [queues.work]\nhandler = { kind = \"rust\", name = \"ok\" }\n",
    )
    .await;
    flood(&env, 250, 0).await;
    let worker = env
        .worker(&[("ok", from_fn(|_job| async { Ok(None) }))])
        .await;
    // 100 subjects a round: every one is reached, none is starved by the cap.
    let all = common::wait_for(Duration::from_secs(60), || async {
        env.scalar("SELECT count(*) FROM jobs WHERE status = 'dead' AND queue LIKE 'flood-%'")
            .await
            == 250
    })
    .await;
    assert!(
        all,
        "dead-lettered: {}",
        env.scalar("SELECT count(*) FROM jobs WHERE status = 'dead'")
            .await
    );
    assert_eq!(common::stat(&worker.stats.unserved_dead_lettered), 250);
    let (_, s) = scrape_until(worker.ops_addr.unwrap(), 10, |s| {
        value(s, "jobwarden_unserved_subjects", &[]) == 0.0
    })
    .await;
    assert_eq!(value(&s, "jobwarden_unserved_subjects", &[]), 0.0);
    worker.shutdown().await;
}

/// A neighbour opening connections by the hundred gets at most the listener's cap served at
/// once (the rest wait in the kernel's backlog): it cannot take every file descriptor of the
/// worker, whose own connections need them. Counted by the process's open descriptors.
#[tokio::test]
async fn a_listener_serves_at_most_its_cap_of_connections_at_once() {
    let env = TestEnv::new("[queues.work]\nhandler = { kind = \"rust\", name = \"ok\" }\n").await;
    let worker = env
        .worker(&[("ok", from_fn(|_job| async { Ok(None) }))])
        .await;
    let fds = || std::fs::read_dir("/proc/self/fd").unwrap().count();
    let before = fds();
    const CAP: usize = 256; // listener::MAX_CONNECTIONS
    let mut idle = Vec::new();
    for _ in 0..CAP + 100 {
        idle.push(
            tokio::net::TcpStream::connect(worker.api_addr)
                .await
                .unwrap(),
        );
    }
    // Ours (CAP + 100) and the listener's side of those it accepted: CAP at most.
    let accepted = || fds().saturating_sub(before + CAP + 100);
    assert!(
        wait_for(Duration::from_secs(10), || async { accepted() >= CAP }).await,
        "accepted {}",
        accepted()
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        accepted() <= CAP + 8,
        "accepted {} over the cap of {CAP}",
        accepted()
    );
    drop(idle);
    // Freed, it serves again.
    let ok = wait_for(Duration::from_secs(30), || async {
        reqwest::get(format!("http://{}/livez", worker.api_addr))
            .await
            .is_ok_and(|r| r.status() == 200)
    })
    .await;
    assert!(ok);
    worker.shutdown().await;
}
