//! Prometheus metrics (`GET /metrics` on the ops listener, OpenMetrics text format).
//!
//! Per-queue counters and histograms are kept as handles in each queue's policy, so the hot
//! path only bumps an atomic (no label lookup per job). Everything else is read when scraped:
//! this worker's counters ([`Stats`]) and the jobs in flight (the ledger). The cluster-wide
//! queue depth (PostgreSQL counts by status, JetStream messages not yet delivered), the same
//! from every pod (aggregate it with `max`, not `sum`), is read at most every
//! [`DEPTH_REFRESH`] by [`DepthCache`], off the claim pool. No label carries a job id, worker
//! id or subject, so the series count stays bounded by queues × statuses (unserved subjects:
//! the top [`super::janitor::METRIC_QUEUES`] queues and one [`OTHER`] series).

use super::janitor::UnservedSummary;
use super::outage::Outage;
use super::{Shared, Stats};
use crate::broker::Lane;
use crate::store::Store;
use futures::TryStreamExt;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

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
    expired: Family<QueueLabel, Counter>,
    throttled: Family<QueueLabel, Counter>,
    /// Finished jobs the pruner deleted on this worker, by queue and status.
    pruned: Family<QueueStatus, Counter>,
    /// How long this worker's last retention round took.
    prune_round: Gauge<f64, AtomicU64>,
}

/// One queue's handles: bumping them is an atomic add (a short lock for histograms).
#[derive(Clone, Debug)]
pub(crate) struct QueueMetrics {
    pub started: Counter,
    pub completed: Counter,
    pub retried: Counter,
    pub dead: Counter,
    pub released: Counter,
    /// Attempts whose handler deferred the job (it awaits completion from outside).
    pub deferred: Counter,
    /// How long attempts ran.
    pub duration: Histogram,
    /// From the message being stored in the stream to its attempt's start.
    pub wait: Histogram,
    /// Pull rounds that waited for a cluster-wide cap or rate limit.
    pub flow_waits: Counter,
    /// Jobs this worker ended as expired (at the claim or in the scheduler's round).
    pub expired: Counter,
    /// Jobs whose throttle ended them as this worker's claim brought them in.
    pub throttled: Counter,
}

impl Metrics {
    pub fn new() -> Metrics {
        Metrics {
            jobs: Family::default(),
            started: Family::default(),
            duration: Family::new_with_constructor(seconds_histogram),
            wait: Family::new_with_constructor(seconds_histogram),
            flow_waits: Family::default(),
            expired: Family::default(),
            throttled: Family::default(),
            pruned: Family::default(),
            prune_round: Gauge::default(),
        }
    }

    /// The expired-jobs counter of `queue` (the scheduler's round ends jobs of any queue).
    pub fn expired(&self, queue: &str) -> Counter {
        self.expired.get_or_create_owned(&QueueLabel {
            queue: queue.to_string(),
        })
    }

    /// The jobs counter of `queue` and `outcome`, for jobs of any queue this worker ended
    /// without running them (an awaiting job's completion, failure or deadline).
    pub fn outcome(&self, queue: &str, outcome: &str) -> Counter {
        self.jobs.get_or_create_owned(&QueueOutcome {
            queue: queue.to_string(),
            outcome: outcome.to_string(),
        })
    }

    /// `n` jobs of `queue` and `status` pruned.
    pub fn pruned(&self, queue: &str, status: &str, n: u64) {
        self.pruned
            .get_or_create(&QueueStatus {
                queue: queue.to_string(),
                status: status.to_string(),
            })
            .inc_by(n);
    }

    /// A retention round this worker ran took `took`.
    pub fn prune_round(&self, took: Duration) {
        self.prune_round.set(took.as_secs_f64());
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
            deferred: outcome("deferred"),
            duration: self.duration.get_or_create_owned(&q),
            wait: self.wait.get_or_create_owned(&q),
            flow_waits: self.flow_waits.get_or_create_owned(&q),
            expired: self.expired.get_or_create_owned(&q),
            throttled: self.throttled.get_or_create_owned(&q),
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
        "jobs_expired",
        "Jobs this worker ended as expired (not started by their expiry), by queue",
        m.expired.clone(),
    );
    r.register(
        "jobs_throttled",
        "Jobs whose throttle ended them as this worker brought them in (their key ran a job within the window), by queue",
        m.throttled.clone(),
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
    r.register(
        "pruned",
        "Finished jobs this worker's retention rounds deleted, by queue and status",
        m.pruned.clone(),
    );
    r.register_with_unit(
        "prune_last_round",
        "How long this worker's last retention round took (0 until it ran one)",
        Unit::Seconds,
        m.prune_round.clone(),
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
    let paused = Family::<QueueLabel, Gauge>::default();
    for (q, p) in &shared.queues {
        paused
            .get_or_create(&QueueLabel { queue: q.clone() })
            .set(i64::from(
                p.paused.load(std::sync::atomic::Ordering::SeqCst),
            ));
    }
    r.register(
        "queue_paused",
        "1 while the queue is paused (jobwarden queues pause), as this worker last read it",
        paused,
    );
    register_stats(&mut r, &shared.stats);
    register_unserved(&mut r, &shared.unserved.get());
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
}

/// The `queue` label of unserved messages outside the top queues (no queue can be named so).
pub(crate) const OTHER: &str = "(other)";

/// What waits on subjects no worker serves, as this worker's janitor last counted: by queue
/// for the queues with the most, the rest as `queue="(other)"`, so a flood of distinct subjects
/// never becomes a flood of series.
fn register_unserved(r: &mut Registry, u: &UnservedSummary) {
    let by_queue = Family::<QueueLabel, Gauge>::default();
    for (queue, n) in &u.top_queues {
        by_queue
            .get_or_create(&QueueLabel {
                queue: queue.clone(),
            })
            .set(*n as i64);
    }
    if u.other > 0 {
        by_queue
            .get_or_create(&QueueLabel {
                queue: OTHER.into(),
            })
            .set(u.other as i64);
    }
    r.register(
        "unserved_messages",
        "Messages waiting on subjects no worker serves, by queue, as this worker's janitor last counted (the 10 queues with the most; the rest add up in queue=\"(other)\")",
        by_queue,
    );
    r.register(
        "unserved_subjects",
        "Distinct subjects with messages no worker serves, as this worker's janitor last counted",
        gauge(u.subjects as i64),
    );
}

/// How often `/metrics` reads the queue depths at most, however often it is scraped.
pub(crate) const DEPTH_REFRESH: Duration = Duration::from_secs(5);

/// The queue depths `/metrics` shows, read at most every [`DEPTH_REFRESH`] on a PostgreSQL
/// pool of their own (never the claim pool: a scraper, or several, must not take connections
/// the producers claim with) and with one consumer listing from JetStream. Scrapes in between
/// are served the last reading; scrapes that arrive during a reading wait for it and share it.
pub(crate) struct DepthCache {
    /// One connection of its own.
    store: Store,
    last: tokio::sync::Mutex<DepthState>,
    /// Readings made (each one SQL statement and one consumer listing).
    refreshes: AtomicU64,
}

#[derive(Default)]
struct DepthState {
    reading: Option<Depth>,
    pg: Option<Outage>,
    nats: Option<Outage>,
}

/// One reading of the queue depths.
#[derive(Clone)]
struct Depth {
    at: Instant,
    /// (queue, status, jobs); `None`: PostgreSQL did not answer.
    jobs: Option<Vec<(String, String, i64)>>,
    /// Per served queue, (pending, unacked) messages over all its lanes; `None`: NATS did not
    /// answer.
    messages: Option<HashMap<String, (u64, u64)>>,
}

impl DepthCache {
    pub fn new(store: Store) -> DepthCache {
        DepthCache {
            store,
            last: tokio::sync::Mutex::new(DepthState::default()),
            refreshes: AtomicU64::new(0),
        }
    }

    /// The last reading, read again first if it is older than [`DEPTH_REFRESH`].
    async fn get(&self, shared: &Shared) -> Depth {
        let mut last = self.last.lock().await;
        if let Some(d) = last.reading.as_ref() {
            if d.at.elapsed() < DEPTH_REFRESH {
                return d.clone();
            }
        }
        self.refreshes.fetch_add(1, Ordering::Relaxed);
        let (jobs, messages) = tokio::join!(self.read_jobs(), read_messages(shared));
        let pg = last
            .pg
            .get_or_insert_with(|| Outage::new("metrics: queue depth from PostgreSQL"));
        let jobs = match jobs {
            Ok(rows) => {
                pg.ok();
                Some(rows)
            }
            Err(e) => {
                pg.failed(&e);
                None
            }
        };
        let nats = last
            .nats
            .get_or_insert_with(|| Outage::new("metrics: queue depth from JetStream"));
        let messages = match messages {
            Ok(m) => {
                nats.ok();
                Some(m)
            }
            Err(e) => {
                nats.failed(&e);
                None
            }
        };
        let d = Depth {
            at: Instant::now(),
            jobs,
            messages,
        };
        last.reading = Some(d.clone());
        d
    }

    async fn read_jobs(&self) -> Result<Vec<(String, String, i64)>, String> {
        match tokio::time::timeout(Duration::from_secs(5), self.store.depth()).await {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(_) => Err("no answer within 5 s".into()),
        }
    }
}

/// Pending and unacked messages of every served queue (all its lanes), from one listing of
/// the stream's consumers (a page per 256 consumers) instead of an info call per lane.
async fn read_messages(shared: &Shared) -> Result<HashMap<String, (u64, u64)>, String> {
    let lanes: HashMap<String, &str> = shared
        .queues
        .keys()
        .flat_map(|q| {
            Lane::all(q)
                .into_iter()
                .map(move |l| (l.consumer_name(), q.as_str()))
        })
        .collect();
    let stream = shared.broker.stream().await.map_err(|e| e.to_string())?;
    let infos = crate::broker::bounded(
        "stream consumers",
        stream.consumers().try_collect::<Vec<_>>(),
    )
    .await
    .map_err(|e| e.to_string())?;
    let mut out: HashMap<String, (u64, u64)> =
        shared.queues.keys().map(|q| (q.clone(), (0, 0))).collect();
    for info in infos {
        if let Some(q) = lanes.get(&info.name) {
            let sums = out.entry(q.to_string()).or_default();
            sums.0 += info.num_pending;
            sums.1 += info.num_ack_pending as u64;
        }
    }
    Ok(out)
}

/// Queue depth, the same from every pod: jobs by queue and status in PostgreSQL (all
/// queues), and for the queues this worker serves the JetStream messages not yet delivered
/// and delivered but unacked (jobs published by plain NATS clients have no row until a worker
/// claims them, so this is the depth to autoscale on). From [`DepthCache`]: at most
/// [`DEPTH_REFRESH`] old.
async fn register_depth(r: &mut Registry, shared: &Shared) {
    let cache = &shared.depth;
    let depth = cache.get(shared).await;
    let pg_up = depth.jobs.is_some();
    let up = Family::<Source, Gauge>::default();
    let source = |s: &str| Source {
        source: s.to_string(),
    };
    if let Some(rows) = depth.jobs {
        let by_status = Family::<QueueStatus, Gauge>::default();
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
        // Keyed queues' parked jobs and waiting keys (per queue: no per-key series).
        let parked = Family::<QueueLabel, Gauge>::default();
        let keys_waiting = Family::<QueueLabel, Gauge>::default();
        for (q, p) in &shared.queues {
            if p.keys.is_some() {
                let label = QueueLabel { queue: q.clone() };
                parked.get_or_create(&label).set(0);
                keys_waiting.get_or_create(&label).set(0);
            }
        }
        for (queue, status, n) in rows {
            match status.as_str() {
                "parked" => parked.get_or_create(&QueueLabel { queue }).set(n),
                "keys_waiting" => keys_waiting.get_or_create(&QueueLabel { queue }).set(n),
                _ => by_status
                    .get_or_create(&QueueStatus { queue, status })
                    .set(n),
            };
        }
        r.register(
            "queue_jobs",
            "Jobs in PostgreSQL by queue and status (queued, scheduled, processing, dead), cluster-wide",
            by_status,
        );
        r.register(
            "keyed_parked",
            "A keyed queue's queued jobs parked in PostgreSQL, waiting for their key's limit or turn, cluster-wide",
            parked,
        );
        r.register(
            "keys_waiting",
            "Keys of a keyed queue that have parked jobs, cluster-wide (jobwarden keys list names the busiest)",
            keys_waiting,
        );
    }
    up.get_or_create(&source("postgres")).set(i64::from(pg_up));
    up.get_or_create(&source("nats"))
        .set(i64::from(depth.messages.is_some()));
    r.register(
        "queue_depth_up",
        "1 when the last reading of the queue depth answered from the source (postgres, nats), 0 when it did not (its depth series are then missing)",
        up,
    );
    let age: Gauge<f64, AtomicU64> = Gauge::default();
    age.set(depth.at.elapsed().as_secs_f64());
    r.register_with_unit(
        "queue_depth_age",
        "How old the queue depths shown are (they are read at most every 5 s, however often /metrics is scraped)",
        Unit::Seconds,
        age,
    );
    r.register(
        "queue_depth_refreshes",
        "Times this worker read the queue depths for /metrics (one SQL statement and one JetStream consumer listing each)",
        counter(cache.refreshes.load(Ordering::Relaxed)),
    );
    if let Some(messages) = depth.messages {
        let pending = Family::<QueueLabel, Gauge>::default();
        let unacked = Family::<QueueLabel, Gauge>::default();
        for (queue, (p, a)) in messages {
            let q = QueueLabel { queue };
            pending.get_or_create(&q).set(p as i64);
            unacked.get_or_create(&q).set(a as i64);
        }
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
