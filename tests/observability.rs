//! What operators and Kubernetes see: `/metrics` parsed with a Prometheus text parser while
//! jobs flow, and the probes (`/livez`, `/readyz`) through a PostgreSQL outage and a drain.

mod common;

use common::TestEnv;
use jobwarden::handler::{from_fn, JobError};
use prometheus_parse::{Sample, Scrape, Value};
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
    Scrape::parse(body.lines().map(|l| Ok(l.to_string()))).unwrap()
}

/// The value of the sample `name` whose labels include all of `labels` (0 when absent).
fn value(s: &Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    let found: Vec<&Sample> = s
        .samples
        .iter()
        .filter(|x| x.metric == name && labels.iter().all(|(k, v)| x.labels.get(k) == Some(*v)))
        .collect();
    assert!(
        found.len() <= 1,
        "{name} {labels:?} matched {}",
        found.len()
    );
    match found.first().map(|x| &x.value) {
        None => 0.0,
        Some(Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v)) => *v,
        Some(Value::Histogram(h)) => h.iter().map(|b| b.count).fold(0.0, f64::max),
        Some(Value::Summary(_)) => panic!("{name} is a summary"),
    }
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
    // Depth from PostgreSQL: nothing waits, the dead job counts.
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
    assert!(has(&after, "jobwarden_overlapping_executions_total"));
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
    // Drain as a Kubernetes preStop hook does it: a GET on the ops port.
    let (status, body) = get(ops, "/v1/drain").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(get(ops, "/readyz").await, (503, "draining".to_string()));
    assert_eq!(get(ops, "/livez").await.0, 200);
    worker.shutdown().await;
}

#[tokio::test]
async fn a_prestop_drain_on_the_ops_port_answers_only_when_the_running_job_is_done() {
    let env = TestEnv::new(
        "[queues.held]\nconcurrency = 2\nhandler = { kind = \"rust\", name = \"wait\" }\n",
    )
    .await;
    let (wait, gate) = gated();
    let worker = env.worker(&[("wait", wait)]).await;
    let ops = worker.ops_addr.expect("ops listener");
    env.publish_raw("held", json!({"id": "d-1", "payload": {}}).to_string())
        .await;
    assert!(env.wait_status("d-1", "processing", 10).await);
    let drain = tokio::spawn(async move { get(ops, "/v1/drain").await });
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(
        !drain.is_finished(),
        "the drain must wait for the running job"
    );
    assert_eq!(get(ops, "/readyz").await, (503, "draining".to_string()));
    gate.add_permits(1);
    let (status, body) = tokio::time::timeout(Duration::from_secs(10), drain)
        .await
        .expect("the drain answers once the job is done")
        .unwrap();
    assert_eq!(status, 200);
    let report: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(report, json!({"finished": 1, "released": 0}));
    assert_eq!(env.status_of("d-1").await.as_deref(), Some("completed"));
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
