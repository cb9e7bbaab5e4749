//! Prometheus metrics (`GET /metrics` on the ops listener, OpenMetrics text format).
//!
//! Per-queue counters and histograms are kept as handles in each queue's policy, so the hot
//! path only bumps an atomic (no label lookup per job). Everything else is read when scraped:
//! this worker's counters ([`Stats`]), the jobs in flight (the ledger), and the cluster-wide
//! queue depth (PostgreSQL counts by status, JetStream messages not yet delivered), which is
//! the same from every pod: aggregate it with `max`, not `sum`. No label carries a job or
//! worker id, so the series count stays bounded by queues × statuses.

use super::{Shared, Stats};
use crate::broker::{Lane, BROKER_CALL_LIMIT};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};
use std::collections::HashMap;
use std::time::Duration;

/// The media type of what [`render`] writes.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabel {
    queue: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueOutcome {
    queue: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueStatus {
    queue: String,
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Reason {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Source {
    source: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Build {
    version: String,
    nats_server: String,
}

fn seconds_histogram() -> Histogram {
    // 1 ms … ~9.3 h (0.001 × 2^25 s), doubling: short no-op jobs and hour-long analyses alike.
    Histogram::new(exponential_buckets(0.001, 2.0, 26))
}

/// The families of per-queue metrics; each queue's handles point into them.
pub(crate) struct Metrics {
    jobs: Family<QueueOutcome, Counter>,
    started: Family<QueueLabel, Counter>,
    duration: Family<QueueLabel, Histogram, fn() -> Histogram>,
    wait: Family<QueueLabel, Histogram, fn() -> Histogram>,
    flow_waits: Family<QueueLabel, Counter>,
}

/// One queue's handles: bumping them is an atomic add (a short lock for histograms).
#[derive(Clone, Debug)]
pub(crate) struct QueueMetrics {
    pub started: Counter,
    pub completed: Counter,
    pub retried: Counter,
    pub dead: Counter,
    pub released: Counter,
    /// How long attempts ran.
    pub duration: Histogram,
    /// From the message being stored in the stream to its attempt's start.
    pub wait: Histogram,
    /// Pull rounds that waited for a cluster-wide cap or rate limit.
    pub flow_waits: Counter,
}

impl Metrics {
    pub fn new() -> Metrics {
        Metrics {
            jobs: Family::default(),
            started: Family::default(),
            duration: Family::new_with_constructor(seconds_histogram),
            wait: Family::new_with_constructor(seconds_histogram),
            flow_waits: Family::default(),
        }
    }

    pub fn queue(&self, queue: &str) -> QueueMetrics {
        let q = QueueLabel {
            queue: queue.to_string(),
        };
        let outcome = |o: &str| {
            self.jobs.get_or_create_owned(&QueueOutcome {
                queue: queue.to_string(),
                outcome: o.to_string(),
            })
        };
        QueueMetrics {
            started: self.started.get_or_create_owned(&q),
            completed: outcome("completed"),
            retried: outcome("retried"),
            dead: outcome("dead"),
            released: outcome("released"),
            duration: self.duration.get_or_create_owned(&q),
            wait: self.wait.get_or_create_owned(&q),
            flow_waits: self.flow_waits.get_or_create_owned(&q),
        }
    }
}

fn counter(v: u64) -> Counter {
    let c = Counter::default();
    c.inc_by(v);
    c
}

fn gauge(v: i64) -> Gauge {
    let g = Gauge::default();
    g.set(v);
    g
}

/// Renders every metric of this worker (reading the queue depth from PostgreSQL and
/// JetStream, each bounded in time: what does not answer is left out, never waited for).
pub(crate) async fn render(shared: &Shared) -> String {
    let mut r = Registry::with_prefix("jobwarden");
    let m = &shared.metrics;
    r.register(
        "build",
        "This worker's version and the NATS server it talks to",
        Info::new(Build {
            version: env!("CARGO_PKG_VERSION").to_string(),
            nats_server: shared.broker.server_version(),
        }),
    );
    r.register(
        "jobs",
        "Attempts settled by this worker, by queue and outcome (completed, retried, dead, released)",
        m.jobs.clone(),
    );
    r.register(
        "jobs_started",
        "Attempts this worker started, by queue",
        m.started.clone(),
    );
    r.register_with_unit(
        "job_duration",
        "How long attempts ran on this worker, by queue",
        Unit::Seconds,
        m.duration.clone(),
    );
    r.register_with_unit(
        "job_queue_wait",
        "From a job's message being stored in the stream to its attempt's start, by queue",
        Unit::Seconds,
        m.wait.clone(),
    );
    r.register(
        "rate_limit_waits",
        "Pull rounds that waited for a cluster-wide cap or rate limit, by queue",
        m.flow_waits.clone(),
    );
    let in_flight = Family::<QueueLabel, Gauge>::default();
    for q in shared.queues.keys() {
        in_flight
            .get_or_create(&QueueLabel { queue: q.clone() })
            .set(0);
    }
    for (q, n) in shared.ledger.in_flight_by_queue() {
        in_flight
            .get_or_create(&QueueLabel { queue: q })
            .set(n as i64);
    }
    r.register(
        "jobs_in_flight",
        "Attempts running on this worker now, by queue",
        in_flight,
    );
    register_stats(&mut r, &shared.stats);
    register_depth(&mut r, shared).await;
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &r).expect("writing to a String");
    out
}

fn register_stats(r: &mut Registry, s: &Stats) {
    let reclaims = Family::<Reason, Counter>::default();
    for (reason, c) in [
        ("restarted", &s.reclaimed_restarted),
        ("owner_dead", &s.reclaimed_owner_dead),
        ("stale", &s.reclaimed_stale),
        ("self_fenced", &s.reclaimed_self_fenced),
        ("broker_lost", &s.republished_broker_lost),
        ("adopted", &s.adopted),
    ] {
        reclaims
            .get_or_create(&Reason {
                reason: reason.to_string(),
            })
            .inc_by(Stats::get(c));
    }
    r.register(
        "reclaims",
        "Jobs this worker took back from an owner that could not finish them, or republished, by reason",
        reclaims,
    );
    for (name, help, c) in [
        (
            "lost_ownership_writes",
            "Fenced writes (progress, settle, lease checks) that found the job taken from this worker",
            &s.lost_ownership,
        ),
        (
            "overlapping_executions",
            "Attempts that were running or finished here after their job had been given to another owner (it may have run twice at once)",
            &s.overlapping,
        ),
        (
            "invalid_messages",
            "Messages that could not become jobs (kept as dead jobs or poison messages)",
            &s.invalid,
        ),
        (
            "duplicate_messages",
            "Messages for jobs that were terminal, running elsewhere or duplicated: acked and dropped",
            &s.dropped,
        ),
        (
            "id_conflicts",
            "Messages whose job id another job with another payload holds (kept as dead jobs)",
            &s.id_conflicts,
        ),
        (
            "scheduled_published",
            "Due scheduled jobs and retries this worker published",
            &s.scheduled_published,
        ),
        (
            "unpublishable",
            "Due jobs too large to publish, dead-lettered",
            &s.unpublishable,
        ),
        (
            "unserved_dead_lettered",
            "Messages of subjects no worker served within unserved_grace, dead-lettered",
            &s.unserved_dead_lettered,
        ),
        (
            "acks_dropped",
            "Acks and in-progress acks not sent (NATS unreachable long enough)",
            &s.acks_dropped,
        ),
        (
            "self_fences",
            "Times this worker fenced itself off (it could not renew its heartbeat in time)",
            &s.self_fenced,
        ),
        ("cron_fires", "Cron fires this worker enqueued", &s.cron_fired),
    ] {
        r.register(name, help, counter(Stats::get(c)));
    }
    r.register(
        "unserved_messages",
        "Messages waiting on subjects no worker serves, as this worker's janitor last counted",
        gauge(Stats::get(&s.unserved_waiting) as i64),
    );
}

/// Queue depth, the same from every pod: jobs by queue and status in PostgreSQL (all
/// queues), and for the queues this worker serves the JetStream messages not yet delivered
/// and delivered but unacked (jobs published by plain NATS clients have no row until a worker
/// claims them, so this is the depth to autoscale on).
async fn register_depth(r: &mut Registry, shared: &Shared) {
    let up = Family::<Source, Gauge>::default();
    let source = |s: &str| Source {
        source: s.to_string(),
    };
    let by_status = Family::<QueueStatus, Gauge>::default();
    match tokio::time::timeout(Duration::from_secs(5), shared.store.depth()).await {
        Ok(Ok(rows)) => {
            for q in shared.queues.keys() {
                for status in ["queued", "scheduled", "processing", "dead"] {
                    by_status
                        .get_or_create(&QueueStatus {
                            queue: q.clone(),
                            status: status.to_string(),
                        })
                        .set(0);
                }
            }
            for (queue, status, n) in rows {
                by_status
                    .get_or_create(&QueueStatus { queue, status })
                    .set(n);
            }
            r.register(
                "queue_jobs",
                "Jobs in PostgreSQL by queue and status (queued, scheduled, processing, dead), cluster-wide",
                by_status,
            );
            up.get_or_create(&source("postgres")).set(1);
        }
        Ok(Err(e)) => tracing::warn!(cause = %e, "metrics: queue depth not read from PostgreSQL"),
        Err(_) => tracing::warn!("metrics: queue depth not read from PostgreSQL within 5 s"),
    }
    let pending = Family::<QueueLabel, Gauge>::default();
    let unacked = Family::<QueueLabel, Gauge>::default();
    let infos = futures::future::join_all(shared.queues.keys().map(|q| async move {
        let mut sums: Option<(u64, usize)> = Some((0, 0));
        for lane in Lane::all(q) {
            let info = async {
                let mut c = shared.broker.consumer(&lane).await.ok()?;
                c.info()
                    .await
                    .ok()
                    .map(|i| (i.num_pending, i.num_ack_pending))
            };
            match tokio::time::timeout(BROKER_CALL_LIMIT, info).await {
                Ok(Some((p, a))) => {
                    if let Some(s) = sums.as_mut() {
                        s.0 += p;
                        s.1 += a;
                    }
                }
                _ => sums = None,
            }
            if sums.is_none() {
                break;
            }
        }
        (q.clone(), sums)
    }))
    .await;
    let mut any = false;
    let asked = infos.len();
    let totals: HashMap<String, (u64, usize)> = infos
        .into_iter()
        .filter_map(|(q, s)| s.map(|s| (q, s)))
        .collect();
    let totals_len = totals.len();
    for (queue, (p, a)) in totals {
        any = true;
        let q = QueueLabel { queue };
        pending.get_or_create(&q).set(p as i64);
        unacked.get_or_create(&q).set(a as i64);
    }
    let complete = totals_len == asked;
    let _ = up.get_or_create(&source("postgres"));
    up.get_or_create(&source("nats")).set(i64::from(complete));
    r.register(
        "queue_depth_up",
        "1 when this scrape read the queue depth from the source (postgres, nats), 0 when it did not answer (its depth series are then missing)",
        up,
    );
    if any {
        r.register(
            "queue_pending_messages",
            "Messages in JetStream not yet delivered to any worker, by queue (every priority lane), cluster-wide: scale on this",
            pending,
        );
        r.register(
            "queue_unacked_messages",
            "Messages delivered to workers and not yet acked, by queue, cluster-wide",
            unacked,
        );
    }
}
