//! Evidence that a mechanism ran, read from outside the worker: its own `/metrics` once it
//! serves them, and the application's count of handler calls checked against jobwarden's
//! record of claims and attempt ends (`examples/common/runs.rs`, shared with the examples).

use super::ChildWorker;
use jobwarden::config::Config;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

#[path = "../../examples/common/runs.rs"]
mod runs;
#[allow(unused_imports)] // used by some test files, not all
pub use runs::unexplained_runs;

impl ChildWorker {
    /// Like [`ChildWorker::spawn`], with the process's ops port (`/metrics`, `/readyz`) on
    /// a free port of its own, returned with it.
    pub fn spawn_with_ops(config: &Config, hostname: &str) -> (ChildWorker, SocketAddr) {
        let port = super::testkit::free_port();
        let mut config = config.clone();
        config.worker.ops_listen = format!("127.0.0.1:{port}").parse().unwrap();
        let child = ChildWorker::spawn(&config, hostname);
        (child, SocketAddr::from(([127, 0, 0, 1], port)))
    }
}

/// Waits until the worker whose ops port is `addr` serves `/metrics` (up to `limit`), and
/// returns the text. A worker serves its ops port only once its start is over — after
/// start-up reconciliation, which runs before it takes any work (`Worker::start`) — so an
/// answer is evidence that reconciliation has run, and its `reclaims` counter says what it
/// took.
pub async fn metrics_after_start(addr: SocketAddr, limit: Duration) -> Option<String> {
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(2))
        .build()
        .expect("an HTTP client");
    let until = Instant::now() + limit;
    while Instant::now() < until {
        if let Ok(r) = http.get(format!("http://{addr}/metrics")).send().await {
            if r.status().is_success() {
                return r.text().await.ok();
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// Parses the text of a `/metrics` answer (OpenMetrics or Prometheus).
pub fn parse_metrics(text: &str) -> prometheus_parse::Scrape {
    prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
        .expect("metrics text that parses")
}

/// The value of the one sample `name` whose labels include all of `labels`, or `None` when
/// the scrape has no such sample (a histogram gives its largest bucket count).
pub fn metric(s: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    use prometheus_parse::Value;
    let found: Vec<_> = s
        .samples
        .iter()
        .filter(|x| x.metric == name && labels.iter().all(|(k, v)| x.labels.get(k) == Some(*v)))
        .collect();
    assert!(
        found.len() <= 1,
        "{name} {labels:?} matched {}",
        found.len()
    );
    found.first().map(|x| match &x.value {
        Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => *v,
        Value::Histogram(h) => h.iter().map(|b| b.count).fold(0.0, f64::max),
        Value::Summary(_) => panic!("{name} is a summary"),
    })
}

/// Waits until each worker of `ops` (name, ops address) has finished its start-up
/// reconciliation (it serves its metrics only after), then checks that it took nothing
/// back and that `owner` still holds every job under its first lease, undeclared dead.
pub async fn assert_jobs_kept_after_reconciliation(
    env: &super::TestEnv,
    owner: &str,
    ops: &[(&str, std::net::SocketAddr)],
) {
    for (name, addr) in ops {
        let m = metrics_after_start(*addr, Duration::from_secs(20))
            .await
            .unwrap_or_else(|| panic!("the {name} worker did not finish starting within 20 s"));
        let took = metric(
            &parse_metrics(&m),
            "jobwarden_reclaims_total",
            &[("reason", "restarted")],
        );
        assert_eq!(
            took,
            Some(0.0),
            "the {name} worker's start-up reconciliation took {took:?} jobs from the live \
             worker {owner} on its host"
        );
    }
    let c = env.store.raw().await.unwrap();
    for r in c
        .query(
            "SELECT id, status, worker_id, lease FROM jobs ORDER BY id",
            &[],
        )
        .await
        .unwrap()
    {
        let (id, status, worker, lease): (String, String, Option<String>, i64) =
            (r.get(0), r.get(1), r.get(2), r.get(3));
        assert_eq!(
            (status.as_str(), worker.as_deref(), lease),
            ("processing", Some(owner), 1),
            "job {id} was taken from the live worker {owner} at another worker's start"
        );
    }
    let stopped: Option<String> = c
        .query_one("SELECT stop_reason FROM workers WHERE id = $1", &[&owner])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        stopped, None,
        "the live worker {owner} was declared stopped"
    );
}
