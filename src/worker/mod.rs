//! The worker process: connects to both servers, registers itself, and runs its services
//! until told to stop.
//!
//! - [`producer`]: per queue, pulls as many messages as there are free slots, claims them in
//!   one statement and dispatches them.
//! - [`executor`]: runs one job: handler, timeout, in-progress acks, progress reports.
//! - [`completer`]: settles finished attempts in grouped statements, then acks (commit,
//!   then ack — invariant 3).
//! - [`ledger`]: every job this worker owns, from claim to settle (who holds a job inside the
//!   process is answered there and only there).
//! - [`outbound`]: acks and events to NATS, bounded, never waited on by PostgreSQL work.
//! - [`scheduler`]: publishes delayed jobs and retries when they become due.
//! - [`janitor`]: messages on subjects no pod serves: visible while they wait, dead-lettered
//!   with their payload after `unserved_grace`.
//! - [`heartbeat`]: keeps this worker's `workers` row fresh, checks its leases, and fences
//!   the worker off when it cannot reach PostgreSQL.
//! - [`rescuer`]: start-up reconciliation, the heartbeat reaper and the stale sweep.
//! - [`reconciler`]: stream ↔ PostgreSQL: adopts messages fetched by a worker that never
//!   claimed them, republishes queued jobs whose message is gone.
//! - [`api`]: the local API (progress, drain, health).
//! - [`supervisor`]: every task above runs under it, by name; a panic or an unexpected end
//!   of any of them stops the worker (invariant 14), and [`nats_watch`] notices the NATS
//!   client's own connection task dying.
//!
//! Shutdown (and the drain endpoint) is [`Shared::drain`]: stop fetching, let running jobs
//! finish within the grace, release the rest; every loop `select!`s on its token.

mod api;
mod completer;
mod cron;
mod dashboard;
mod executor;
mod flow;
mod heartbeat;
mod janitor;
mod ledger;
mod listener;
mod metrics;
mod nats_watch;
mod outage;
mod outbound;
mod producer;
pub mod pruner;
mod reconciler;
mod rescuer;
mod rollup;
mod scheduler;
pub mod supervisor;

use crate::backoff::Backoff;
use crate::broker::{Broker, Lane};
use crate::config::{Config, HandlerConfig};
use crate::handler::{exec::ExecHandler, http::HttpHandler, Handler, Stop};
use crate::liveness::Pacing;
use crate::store::{Registration, Store};
use async_nats::jetstream::consumer::PullConsumer;
use ledger::Ledger;
use outbound::Outbound;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, error, info, warn};

pub use completer::Finished;
use supervisor::Supervisor;
pub use supervisor::{
    report_unsupervised_panics, Action, Cause, FailPoints, FailTrigger, Service, ServiceFailure,
    EXIT_SERVICE_FAILED, FAILPOINTS_ENV,
};

/// Longest a worker's start waits to open and prepare its hot connections.
const WARM_UP_LIMIT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error(transparent)]
    Broker(#[from] crate::broker::BrokerError),
    #[error("queue {queue}: handler {{ kind = \"rust\", name = \"{name}\" }} is not registered in this program; only programs linking jobwarden as a library can use rust handlers")]
    UnknownRustHandler { queue: String, name: String },
    #[error("local API cannot listen on {addr}: {cause}; set worker.api_listen to a free address (port 0 picks one)")]
    Api { addr: String, cause: String },
    #[error("metrics and probes cannot listen on {addr}: {cause}; set worker.ops_listen to a free address (port 0 picks one), or \"off\" to serve them on worker.api_listen only")]
    Ops { addr: String, cause: String },
    #[error("dashboard cannot listen on {addr}: {cause}; set dashboard.listen to a free address (port 0 picks one), or remove it to turn the dashboard off")]
    Dashboard { addr: String, cause: String },
    #[error("stopped before start-up finished")]
    Cancelled,
    #[error("{0}")]
    Telemetry(String),
}

/// Counters every service updates; read by tests, the benchmark and (later) /metrics.
#[derive(Debug, Default)]
pub struct Stats {
    pub claimed: AtomicU64,
    pub completed: AtomicU64,
    /// Attempts settled `awaiting` (their handler deferred them).
    pub deferred: AtomicU64,
    pub retried: AtomicU64,
    pub dead: AtomicU64,
    /// Fenced writes that matched no row: the job had been taken from this worker.
    pub lost_ownership: AtomicU64,
    /// Messages that could not become jobs (recorded as dead jobs or poison messages).
    pub invalid: AtomicU64,
    /// Messages for jobs that were terminal, running elsewhere or duplicated: acked, dropped.
    pub dropped: AtomicU64,
    pub scheduled_published: AtomicU64,
    /// Republishes the stream answered `duplicate` (sent again under the next generation).
    pub republish_duplicates: AtomicU64,
    /// Due jobs that could never be published (over max_payload), dead-lettered.
    pub unpublishable: AtomicU64,
    /// Jobs given back at shutdown or drain (attempt refunded).
    pub released: AtomicU64,
    /// Jobs this worker's rescuer took back, by reason.
    pub reclaimed_restarted: AtomicU64,
    pub reclaimed_owner_dead: AtomicU64,
    pub reclaimed_stale: AtomicU64,
    pub republished_broker_lost: AtomicU64,
    /// Messages fetched by a worker that never claimed them, adopted from the stream.
    pub adopted: AtomicU64,
    /// Times this worker fenced itself off (could not renew its heartbeat in time).
    pub self_fenced: AtomicU64,
    /// Jobs given back after a self-fence (their attempt counted).
    pub reclaimed_self_fenced: AtomicU64,
    /// Messages whose job id was taken by a job with another payload (kept as dead jobs).
    pub id_conflicts: AtomicU64,
    /// Messages of queues no pod served within the grace, dead-lettered by this worker.
    pub unserved_dead_lettered: AtomicU64,
    /// Messages waiting on subjects no pod serves, as this worker's janitor last counted
    /// them (a gauge).
    pub unserved_waiting: AtomicU64,
    /// Acks, in-progress acks and events not sent (NATS unreachable long enough).
    pub acks_dropped: AtomicU64,
    /// Cron fires this worker enqueued.
    pub cron_fired: AtomicU64,
    /// Attempts that ran or finished here after their job had been given to another owner
    /// (found by a lease check, a progress report or the settle): it may have run twice.
    pub overlapping: AtomicU64,
    /// The largest pull answered so far, in bytes.
    pub largest_pull_bytes: AtomicU64,
    /// Jobs claimed with no slot free for them yet (their queue's jobs were short): each
    /// took the next slot to free, or was given back if none freed within a second.
    pub claimed_ahead: AtomicU64,
    /// Pull requests sent to JetStream (each asks for up to the free slots' worth).
    pub pulls: AtomicU64,
    /// Groups of finished attempts the completer settled (a statement and a commit each).
    pub settle_groups: AtomicU64,
    /// Attempts PostgreSQL refused to settle in every form (left for the stale sweep).
    pub unsettled: AtomicU64,
}

impl Stats {
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
    pub(crate) fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }
}

/// A queue's policy as this worker serves it, resolved once at start: every job claimed
/// from the queue carries it to the executor, the completer and the sweeps' deadlines.
pub(crate) struct QueuePolicy {
    pub name: String,
    pub concurrency: usize,
    pub timeout: Duration,
    pub max_attempts: u32,
    pub backoff: Backoff,
    /// The stale deadline this worker declares for the queue's jobs (the queue's own, else
    /// `worker.stale_after`).
    pub stale_after: Duration,
    /// The queue's default expiry (`expire_after`): applied to a message without one, from
    /// when the stream stored it, and at the claim to a row without one, from its creation.
    pub expire_after: Option<Duration>,
    /// Where the queue's messages carry their key when the envelope names none
    /// (`key_from`), see [`QueuePolicy::take_key`].
    pub key_from: Option<crate::config::KeyFrom>,
    /// The queue's debounce, throttle and unique_for (empty: none, the common case), for a
    /// message whose envelope names none, see [`QueuePolicy::gate_job`].
    pub gate: crate::contract::Gate,
    /// Every Nth pull serves lower priorities (0: strict).
    pub fair_every: u32,
    /// Jobs running at once across every worker.
    pub global_cap: Option<u32>,
    /// Starts per window across every worker.
    pub rate: Option<crate::config::RateLimit>,
    /// A keyed queue (`key_concurrency`, `fair_by_key`): its jobs are parked in PostgreSQL
    /// as they arrive and its slots take them within their keys' limits (`None`: the queue
    /// runs its messages' jobs as they come).
    pub keys: Option<crate::config::KeyRules>,
    pub handler: Arc<dyn Handler>,
    pub metrics: metrics::QueueMetrics,
    /// The queue is paused (`queue_pauses`, as last read by the scheduler or answered by a
    /// claim): its producer pulls nothing.
    pub paused: AtomicBool,
}

impl QueuePolicy {
    /// Gives a message's job the key its queue's `key_from` names, when its envelope named
    /// none (an envelope's `key` wins). `republished`: the message is one jobwarden
    /// published from the job's row (a retry, a due or an SQL-enqueued job), which is left
    /// as it is — the row exists and holds the key its own door gave it (or none), and its
    /// payload, whatever it holds where key_from looks, must not get it refused. `header`
    /// reads one of the message's headers by name. The error names the field `key`, the
    /// setting and what was found.
    pub fn take_key(
        &self,
        job: &mut crate::job::NewJob,
        republished: bool,
        header: impl FnOnce(&str) -> Option<String>,
    ) -> Result<(), crate::contract::Refused> {
        let Some(from) = &self.key_from else {
            return Ok(());
        };
        if job.key.is_none() && !republished {
            job.key = from.pick(&self.name, &job.payload, header)?;
        }
        Ok(())
    }

    /// Settles what gates a message's job (after [`QueuePolicy::take_key`]): its own debounce
    /// or throttle, which needs a key (refused naming the field when the job has none),
    /// else the queue's, for a job with a key; its own unique_for, else the queue's, for a
    /// job with an idempotency key. A republished message is left as it is (its row
    /// exists). Costs nothing for a job and a queue with none.
    pub fn gate_job(
        &self,
        job: &mut crate::job::NewJob,
        republished: bool,
    ) -> Result<(), crate::contract::Refused> {
        if let Some(own) = &job.gate {
            if job.key.is_none() {
                if let Some(field) = ["debounce", "throttle"]
                    .into_iter()
                    .find(|f| own.get(format!("{f}_ms")).is_some())
                {
                    return Err(crate::contract::Refused::bad(
                        field,
                        format!("{} (or the queue's key_from)", crate::contract::NEEDS_KEY),
                    ));
                }
            }
        }
        if self.gate.is_empty() || republished {
            return Ok(());
        }
        let own = job.gate.as_ref();
        let ms = |f: &str| {
            own.and_then(|g| g.get(f))
                .and_then(serde_json::Value::as_i64)
        };
        let mine = crate::contract::Gate {
            debounce_ms: ms("debounce_ms"),
            max_wait_ms: ms("max_wait_ms"),
            throttle_ms: ms("throttle_ms"),
            unique_for_ms: ms("unique_for_ms"),
        };
        job.gate = mine.applied(&self.gate, job.key.is_some(), job.idempotency_key.is_some());
        Ok(())
    }
}

/// What every service of one worker shares.
pub(crate) struct Shared {
    pub worker_id: String,
    pub config: Config,
    pub store: Store,
    /// A small pool of its own for the heartbeat and lease checks, so a storm of progress
    /// reports or claims on the main pool can never hold a beat back long enough to fence.
    pub beat_store: Store,
    pub broker: Broker,
    pub stats: Arc<Stats>,
    pub metrics: metrics::Metrics,
    /// The jobs this worker owns, from claim to settle.
    pub ledger: Ledger,
    pub outbound: Outbound,
    pub pacing: Pacing,
    pub queues: HashMap<String, Arc<QueuePolicy>>,
    /// The lanes this worker serves (every queue's bare subject and its bands).
    pub lanes: Vec<Lane>,
    pub api_base: String,
    /// The schema's completion key: each attempt's completion token is made with it.
    pub completion_key: Arc<crate::completion::CompletionKey>,
    /// Producers stop fetching when this fires (shutdown, drain).
    pub fetch_cancel: CancellationToken,
    /// Producers and their running jobs.
    pub producers: TaskTracker,
    /// Set while draining: readiness turns unready.
    pub draining: AtomicBool,
    /// Set while this worker may not claim: it cannot renew its heartbeat, or others
    /// declared it dead and it has not registered again.
    pub fenced: AtomicBool,
    /// A claim found this worker unregistered: the heartbeat registers it again at once.
    pub reregister: Notify,
    pub hostname: String,
    /// Fired when a drain asked for through the API finished: unless a stop signal comes
    /// first, the process exits `worker.drained_exit_after` later ([`RunningWorker::run_until`]).
    pub drained: CancellationToken,
    /// `/metrics`' queue depths, read at most every few seconds on a connection of their own.
    pub depth: metrics::DepthCache,
    /// What the janitor last saw waiting on unserved subjects, for `/metrics`.
    pub unserved: janitor::UnservedView,
    /// Watches every task of this worker; its first failure stops the worker.
    pub supervisor: Supervisor,
    /// Batches published over NATS found open lately (see `producer/members.rs`).
    pub open_batches: producer::OpenBatches,
    /// Progress reports PostgreSQL did not take: logged once per outage, not per report.
    pub progress_outage: std::sync::Mutex<outage::Outage>,
    /// OpenTelemetry's exporters (off unless configured).
    pub telemetry: crate::telemetry::Telemetry,
}

/// What a drain did.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct DrainReport {
    /// Jobs that finished on their own during the grace.
    pub finished: u64,
    /// Jobs still running after the grace, stopped and given back.
    pub released: u64,
}

/// How long a handler gets to stop after a shutdown cancel (exec: TERM, grace, KILL).
const RELEASE_WAIT: Duration = Duration::from_secs(7);

impl Shared {
    /// Stops fetching, lets running jobs finish within `grace`, then stops the rest and gives
    /// them back (attempt refunded, message nak'd so another worker starts it at once).
    /// Returns when every job of this worker is settled or released.
    pub(crate) async fn drain(&self, grace: Duration) -> DrainReport {
        self.draining.store(true, Ordering::SeqCst);
        let before = self.settled_count();
        let released_before = Stats::get(&self.stats.released);
        self.fetch_cancel.cancel();
        self.producers.close();
        if tokio::time::timeout(grace, self.producers.wait())
            .await
            .is_err()
        {
            let n = self.ledger.stop_all(Stop::Shutdown);
            warn!(worker.id = %self.worker_id, jobs = n, "shutdown grace over: releasing running jobs");
            if tokio::time::timeout(RELEASE_WAIT + Duration::from_secs(3), self.producers.wait())
                .await
                .is_err()
            {
                error!(worker.id = %self.worker_id, "jobs did not stop after release; leaving them for recovery");
            }
        }
        // Released and finished jobs settle in the completer: wait for the last of them.
        if tokio::time::timeout(Duration::from_secs(10), self.ledger.wait_empty())
            .await
            .is_err()
        {
            warn!(worker.id = %self.worker_id, jobs = self.ledger.len(), "some jobs were not settled after the drain");
        }
        let released = Stats::get(&self.stats.released) - released_before;
        DrainReport {
            finished: (self.settled_count() - before).saturating_sub(released),
            released,
        }
    }

    /// Tells alerting a job was dead-lettered: a small event on `jobwarden.dead.<queue>`
    /// (core NATS, outside the work stream). Best effort and never waited on: the row is the
    /// record.
    pub(crate) fn announce_dead(&self, queue: &str, id: &str, error: Option<&str>) {
        let event = serde_json::json!({"id": id, "queue": queue, "error": error});
        let subject = format!("{}.dead.{queue}", crate::config::EVENTS_PREFIX);
        self.outbound.event(subject, event.to_string().into());
    }

    /// Whether `queue` is paused, as this worker last learnt.
    pub(crate) fn paused(&self, queue: &str) -> bool {
        self.queues
            .get(queue)
            .is_some_and(|p| p.paused.load(Ordering::SeqCst))
    }

    /// Registers (again) in the `workers` table, with the thresholds others judge it by.
    pub(crate) async fn register(&self) -> Result<(), crate::store::StoreError> {
        let pid = std::process::id() as i32;
        let boot = crate::liveness::boot_id();
        let pid_ns = crate::liveness::pid_namespace();
        self.beat_store
            .worker_register(&Registration {
                id: &self.worker_id,
                hostname: &self.hostname,
                pid,
                boot_id: boot.as_deref(),
                proc_start: crate::liveness::proc_start(pid),
                pid_ns: pid_ns.as_deref(),
                heartbeat_every: self.pacing.heartbeat_every,
                dead_after: self.pacing.dead_after,
                max_payload_bytes: self.config.worker.max_payload_bytes,
                queues: self.config.queues.keys().cloned().collect(),
            })
            .await?;
        // What the jobs of other doors (SQL, CLI, cron, `then`) get of its queues' debounce,
        // throttle and unique_for.
        let gates: Vec<(String, crate::contract::Gate)> = self
            .config
            .queues
            .iter()
            .map(|(name, q)| (name.clone(), q.gate()))
            .collect();
        self.beat_store
            .queue_gates_declare(&self.worker_id, &gates)
            .await
    }

    fn settled_count(&self) -> u64 {
        let s = &self.stats;
        Stats::get(&s.completed)
            + Stats::get(&s.retried)
            + Stats::get(&s.dead)
            + Stats::get(&s.released)
    }
}

/// A worker to be started: configuration plus the Rust handlers this program provides.
pub struct Worker {
    config: Config,
    rust_handlers: HashMap<String, Arc<dyn Handler>>,
    failpoints: FailPoints,
}

/// A started worker: its id, local API address and counters; it runs until cancelled.
pub struct RunningWorker {
    shared: Arc<Shared>,
    pub id: String,
    pub api_addr: SocketAddr,
    /// Where `/metrics`, `/livez` and `/readyz` are served (`None`: `ops_listen = "off"`;
    /// they are on `api_addr` too).
    pub ops_addr: Option<SocketAddr>,
    /// Where the dashboard is served (`None`: off).
    pub dashboard_addr: Option<SocketAddr>,
    pub stats: Arc<Stats>,
    pub store: Store,
    pub broker: Broker,
    cancel: CancellationToken,
    /// Producers and the completer: done when every job is settled.
    tasks: JoinSet<()>,
    /// Scheduler, heartbeat, sweeps, local API: stopped after the jobs drained.
    background: JoinSet<()>,
    background_cancel: CancellationToken,
    /// Sends the last acks; ends after everything else.
    outbound_task: tokio::task::JoinHandle<()>,
    grace: Duration,
}

impl Worker {
    pub fn new(config: Config) -> Worker {
        Worker {
            config,
            rust_handlers: HashMap::new(),
            failpoints: FailPoints::default(),
        }
    }

    /// Injected failures, a **test hook** (see [`FailPoints`]): never in production.
    pub fn failpoints(mut self, points: FailPoints) -> Worker {
        self.failpoints = points;
        self
    }

    /// Registers a Rust handler under `name` (queues use it with
    /// `handler = { kind = "rust", name = "<name>" }`).
    pub fn rust_handler(mut self, name: &str, handler: Arc<dyn Handler>) -> Worker {
        self.rust_handlers.insert(name.to_string(), handler);
        self
    }

    /// Each configured queue's policy, with its handler.
    fn policies(
        &self,
        metrics: &metrics::Metrics,
    ) -> Result<HashMap<String, Arc<QueuePolicy>>, WorkerError> {
        let config = &self.config;
        let mut out = HashMap::new();
        for (name, q) in &config.queues {
            let handler: Arc<dyn Handler> = match config.handler_for(name).expect("validated") {
                HandlerConfig::Http { url } => Arc::new(HttpHandler::new(url)),
                HandlerConfig::Exec { command, env } => Arc::new(ExecHandler::new(command, env)),
                HandlerConfig::Rust { name: hname } => {
                    self.rust_handlers.get(hname).cloned().ok_or_else(|| {
                        WorkerError::UnknownRustHandler {
                            queue: name.clone(),
                            name: hname.clone(),
                        }
                    })?
                }
            };
            out.insert(
                name.clone(),
                Arc::new(QueuePolicy {
                    name: name.clone(),
                    concurrency: q.concurrency,
                    timeout: q.timeout,
                    max_attempts: q.max_attempts,
                    backoff: q.backoff,
                    stale_after: q.stale_after.unwrap_or(config.worker.stale_after),
                    expire_after: q.expire_after,
                    key_from: q.key_from.clone(),
                    gate: q.gate(),
                    fair_every: q.fair_every,
                    global_cap: q.global_concurrency,
                    rate: q.rate_limit,
                    keys: q.key_rules(),
                    handler,
                    metrics: metrics.queue(name),
                    paused: AtomicBool::new(false),
                }),
            );
        }
        Ok(out)
    }

    /// Connects (retrying with backoff while a server is unreachable), migrates, provisions,
    /// registers and starts every service. Returns once jobs are flowing.
    pub async fn start(self, cancel: CancellationToken) -> Result<RunningWorker, WorkerError> {
        let metrics = metrics::Metrics::new();
        let queues = self.policies(&metrics)?;
        let config = self.config;
        let servers = Servers::connect(&config, &cancel).await?;
        if let Some(warning) = config.termination_grace_warning_from_env() {
            warn!("{warning}");
        }
        let completion_key = prepare_schema(&config, &servers.store, &cancel).await?;
        let consumers = consumers(&config, &servers.broker, &cancel).await?;
        let hostname = config
            .worker
            .hostname
            .clone()
            .unwrap_or_else(local_hostname);
        let worker_id = format!(
            "{hostname}-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        );
        let listeners = Listeners::bind(&config).await?;
        let telemetry = start_telemetry(&config, &worker_id)?;
        let stats = Arc::new(Stats::default());
        let supervisor = Supervisor::new(self.failpoints.clone());
        let (outbound, outbound_run) = Outbound::new(servers.broker.client.clone(), stats.clone());
        // It ends when every handle is gone: at the end of a shutdown.
        let outbound_task =
            tokio::spawn(supervisor.service(Service::Outbound, None, cancel.clone(), outbound_run));
        let pacing = Pacing {
            heartbeat_every: config.worker.heartbeat_every,
            dead_after: config.worker.dead_after,
        };
        let Servers {
            store,
            beat_store,
            depth_store,
            broker,
        } = servers;
        let shared = Arc::new(Shared {
            worker_id: worker_id.clone(),
            store: store.clone(),
            beat_store,
            broker: broker.clone(),
            stats: stats.clone(),
            metrics,
            ledger: Ledger::default(),
            outbound,
            pacing,
            queues,
            lanes: lanes_of(&consumers),
            api_base: format!("http://{}", listeners.api_addr),
            completion_key: Arc::new(completion_key),
            config: config.clone(),
            fetch_cancel: cancel.child_token(),
            producers: TaskTracker::new(),
            draining: AtomicBool::new(false),
            fenced: AtomicBool::new(false),
            reregister: Notify::new(),
            hostname: hostname.clone(),
            drained: CancellationToken::new(),
            depth: metrics::DepthCache::new(depth_store),
            unserved: janitor::UnservedView::default(),
            supervisor: supervisor.clone(),
            open_batches: Default::default(),
            progress_outage: std::sync::Mutex::new(outage::Outage::new("progress reports")),
            telemetry,
        });
        retry_transient("registering this worker", &cancel, || shared.register()).await?;
        // Before taking new work: recover what earlier incarnations of this host left.
        rescuer::Rescuer::new(shared.clone())
            .reconcile_startup()
            .await;
        warm_up(&store, config.queues.len()).await;
        let (api_addr, ops_addr, dashboard_addr) = (
            listeners.api_addr,
            listeners.ops.as_ref().map(|(_, a)| *a),
            listeners.dashboard.as_ref().map(|(_, a)| *a),
        );
        info!(worker.id = %worker_id, api = %api_addr, ops = ?ops_addr, queues = ?config.queues.keys().collect::<Vec<_>>(),
              heartbeat_every = ?pacing.heartbeat_every, dead_after = ?pacing.dead_after,
              self_fence_after = ?pacing.fence_after(), "worker started");
        let tasks = spawn_jobs(&shared, consumers);
        let background_cancel = CancellationToken::new();
        let background = spawn_background(&shared, listeners, &background_cancel);
        supervisor.spawn_unsupervised_failpoint();

        Ok(RunningWorker {
            shared,
            id: worker_id,
            api_addr,
            ops_addr,
            dashboard_addr,
            stats,
            store,
            broker,
            cancel,
            tasks,
            background,
            background_cancel,
            outbound_task,
            grace: config.worker.shutdown_grace,
        })
    }
}

/// The server connections a worker starts with.
struct Servers {
    /// Claims, settles and everything else.
    store: Store,
    /// The heartbeat's own two connections: a beat never waits behind a claim.
    beat_store: Store,
    /// /metrics' queue depths: one connection of their own, never one a claim needs.
    depth_store: Store,
    broker: Broker,
}

impl Servers {
    /// Connects to PostgreSQL and NATS, waiting (with backoff) while they are unreachable.
    async fn connect(config: &Config, cancel: &CancellationToken) -> Result<Servers, WorkerError> {
        let store =
            retry_connect("PostgreSQL", cancel, || Store::connect(&config.database)).await?;
        let beat_db = crate::config::DatabaseConfig {
            pool_size: 2,
            ..config.database.clone()
        };
        let beat_store = retry_connect("PostgreSQL", cancel, || Store::connect(&beat_db)).await?;
        let depth_db = crate::config::DatabaseConfig {
            pool_size: 1,
            ..config.database.clone()
        };
        let depth_store = retry_connect("PostgreSQL", cancel, || Store::connect(&depth_db)).await?;
        info!(target = %store.target(), "PostgreSQL connected ({})", store.tls_line());
        let broker = retry_connect("NATS", cancel, || Broker::connect(&config.nats)).await?;
        info!("{}", broker.joined_line());
        info!("{}", broker.features_line());
        info!("{}", broker.security_line());
        Ok(Servers {
            store,
            beat_store,
            depth_store,
            broker,
        })
    }
}

/// Migrates the schema, or (`worker.migrate = false`) waits for another process to: a
/// Kubernetes Job, a deploy step, maybe right now — rather than fail on a missing table.
/// Migrates the schema (or checks that it is migrated) and reads its completion key.
async fn prepare_schema(
    config: &Config,
    store: &Store,
    cancel: &CancellationToken,
) -> Result<crate::completion::CompletionKey, WorkerError> {
    if config.worker.migrate {
        let applied = retry_transient("the migrations", cancel, || store.migrate()).await?;
        info!(applied, schema = %store.schema(), "migrations up to date");
        return retry_transient("the completion key", cancel, || store.completion_key()).await;
    }
    let need = Store::required_version();
    retry_connect("the schema", cancel, || async {
        match store.schema_version().await? {
            v if v >= need => Ok(v),
            have => Err(crate::store::StoreError::SchemaBehind {
                schema: store.schema().to_string(),
                have,
                need,
            }),
        }
    })
    .await?;
    retry_transient("the completion key", cancel, || store.completion_key()).await
}

/// Every queue's lanes (its bare subject and ten priority bands), each with its consumer.
/// Provisioning can fail for a while (the server is restarting, an operator is re-creating
/// the stream, a consumer is being created elsewhere at the same moment): it is waited out
/// like an unreachable server. Only a configuration the broker will never accept ends the
/// start.
async fn consumers(
    config: &Config,
    broker: &Broker,
    cancel: &CancellationToken,
) -> Result<HashMap<String, Vec<(Lane, PullConsumer)>>, WorkerError> {
    if config.nats.provision {
        retry_connect("the stream", cancel, || broker.provision_stream()).await?;
    }
    let mut consumers = HashMap::new();
    for name in config.queues.keys() {
        let mut lanes = Vec::new();
        for lane in Lane::all(name) {
            let what = format!("the consumer {} of queue {name}", lane.consumer_name());
            let c = if config.nats.provision {
                retry_connect(&what, cancel, || broker.provision_consumer(&lane)).await?
            } else if lane.band.is_none() {
                retry_connect(&what, cancel, || broker.consumer(&lane)).await?
            } else {
                // Provisioned by an operator: bands without a consumer are not served.
                match broker.consumer(&lane).await {
                    Ok(c) => c,
                    Err(e) => {
                        warn!(%lane, cause = %e, "no consumer for this priority band (nats.provision is off): its subject is not served");
                        continue;
                    }
                }
            };
            lanes.push((lane, c));
        }
        consumers.insert(name.clone(), lanes);
    }
    Ok(consumers)
}

/// The worker's listening sockets, bound before anything runs (a taken port ends the
/// start with the setting to change).
struct Listeners {
    api: tokio::net::TcpListener,
    api_addr: SocketAddr,
    ops: Option<(tokio::net::TcpListener, SocketAddr)>,
    dashboard: Option<(tokio::net::TcpListener, SocketAddr)>,
}

impl Listeners {
    async fn bind(config: &Config) -> Result<Listeners, WorkerError> {
        let (api, api_addr) = bind_at(config.worker.api_listen.0, |addr, cause| WorkerError::Api {
            addr,
            cause,
        })
        .await?;
        let ops = match config.worker.ops_listen.addr() {
            None => None,
            Some(addr) => {
                Some(bind_at(addr, |addr, cause| WorkerError::Ops { addr, cause }).await?)
            }
        };
        let dashboard = match config.dashboard.listen {
            None => None,
            Some(addr) => {
                Some(bind_at(addr.0, |addr, cause| WorkerError::Dashboard { addr, cause }).await?)
            }
        };
        Ok(Listeners {
            api,
            api_addr,
            ops,
            dashboard,
        })
    }
}

/// Binds `addr`; an error says which setting (through `err`).
/// The lanes of every queue's consumers (each queue's bare subject and its bands).
fn lanes_of(consumers: &HashMap<String, Vec<(Lane, PullConsumer)>>) -> Vec<Lane> {
    consumers
        .values()
        .flat_map(|l| l.iter().map(|(lane, _)| lane.clone()))
        .collect()
}

async fn bind_at(
    addr: SocketAddr,
    err: impl Fn(String, String) -> WorkerError,
) -> Result<(tokio::net::TcpListener, SocketAddr), WorkerError> {
    let fail = |e: std::io::Error| err(addr.to_string(), e.to_string());
    let l = tokio::net::TcpListener::bind(addr).await.map_err(&fail)?;
    let a = l.local_addr().map_err(&fail)?;
    Ok((l, a))
}

/// Connections for the claims in flight of every queue and the completer's settles, opened
/// and prepared before the first message is pulled. Preparing an insert waits for a lock on
/// `jobs` that conflicts with it (an operator's `LOCK TABLE`, a migration elsewhere): the
/// start does not wait for that.
async fn warm_up(store: &Store, queues: usize) {
    let hot = queues * producer::CLAIMS_IN_FLIGHT + 1;
    match tokio::time::timeout(WARM_UP_LIMIT, store.warm_up(hot)).await {
        Ok(Ok(n)) => debug!(connections = n, "PostgreSQL connections warmed"),
        // Not fatal: the statements are prepared on first use instead.
        Ok(Err(e)) => {
            warn!(cause = %e, "could not warm PostgreSQL connections; statements are prepared on first use")
        }
        Err(_) => {
            warn!(limit = ?WARM_UP_LIMIT, "PostgreSQL connections not warmed in time (a lock on the jobs table?); statements are prepared on first use")
        }
    }
}

/// Starts each queue's producer and the completer. Every task from here on runs under the
/// supervisor, by name: a panic, or an end before its stop token fired, is a failure of the
/// worker (invariant 14). Producers stop at `fetch_cancel`; running jobs finish and settle
/// before the completer's channel closes (it ends when the last sender is dropped, which only
/// a drain makes happen: a drain cancels `fetch_cancel` first).
fn spawn_jobs(
    shared: &Arc<Shared>,
    consumers: HashMap<String, Vec<(Lane, PullConsumer)>>,
) -> JoinSet<()> {
    let sup = &shared.supervisor;
    let mut tasks = JoinSet::new();
    let (done_tx, done_rx) = tokio::sync::mpsc::channel(4096);
    let fetch = &shared.fetch_cancel;
    for (name, lanes) in consumers {
        let policy = shared.queues[&name].clone();
        let p = producer::Producer::new(shared.clone(), policy, lanes, done_tx.clone());
        let scope = Some(format!("queue {name}"));
        let run = p.run(fetch.clone());
        shared
            .producers
            .spawn(sup.service(Service::Producer, scope, fetch.clone(), run));
    }
    drop(done_tx);
    let completer = completer::Completer::new(shared.clone()).run(done_rx);
    tasks.spawn(sup.service(Service::Completer, None, fetch.clone(), completer));
    tasks
}

/// Starts the services that run until `bc` fires, after the jobs drained: the scheduler,
/// cron, the janitor, the rollup, the heartbeat, the rescuer, the reconciler, the NATS client's watch
/// and the listeners.
fn spawn_background(
    shared: &Arc<Shared>,
    listeners: Listeners,
    bc: &CancellationToken,
) -> JoinSet<()> {
    let sup = &shared.supervisor;
    let sh = shared;
    let mut background = JoinSet::new();
    background.spawn(sup.service(
        Service::Scheduler,
        None,
        bc.clone(),
        scheduler::Scheduler::new(sh.clone()).run(bc.clone()),
    ));
    background.spawn(sup.service(
        Service::Cron,
        None,
        bc.clone(),
        cron::CronService::new(sh.clone()).run(bc.clone()),
    ));
    background.spawn(sup.service(
        Service::Pruner,
        None,
        bc.clone(),
        pruner::PrunerService::new(sh.clone()).run(bc.clone()),
    ));
    background.spawn(sup.service(
        Service::Janitor,
        None,
        bc.clone(),
        janitor::Janitor::new(sh.clone()).run(bc.clone()),
    ));
    background.spawn(sup.service(
        Service::Rollup,
        None,
        bc.clone(),
        rollup::Rollup::new(sh.clone()).run(bc.clone()),
    ));
    background.spawn(sup.service(
        Service::Heartbeat,
        None,
        bc.clone(),
        heartbeat::Heartbeat::new(sh.clone()).run(bc.clone()),
    ));
    background.spawn(sup.service(
        Service::Rescuer,
        None,
        bc.clone(),
        rescuer::Rescuer::new(sh.clone()).run(bc.clone()),
    ));
    background.spawn(sup.service(
        Service::Reconciler,
        None,
        bc.clone(),
        reconciler::Reconciler::new(sh.clone()).run(bc.clone()),
    ));
    background.spawn(sup.service(
        Service::NatsClient,
        None,
        bc.clone(),
        nats_watch::run(sh.broker.client.clone(), bc.clone()),
    ));
    background.spawn(sup.service(
        Service::Api,
        None,
        bc.clone(),
        api::serve(listeners.api, sh.clone(), bc.clone()),
    ));
    if let Some((l, _)) = listeners.ops {
        background.spawn(sup.service(
            Service::Metrics,
            None,
            bc.clone(),
            api::serve_ops(l, sh.clone(), bc.clone()),
        ));
    }
    if let Some(every) = sh.telemetry.metrics_every() {
        background.spawn(sup.service(
            Service::Metrics,
            None,
            bc.clone(),
            push_metrics(sh.clone(), every, bc.clone()),
        ));
    }
    if let Some((l, a)) = listeners.dashboard {
        info!(url = %format!("http://{a}/"), admin = sh.config.dashboard.admin_token.is_some(),
              "dashboard listening");
        background.spawn(sup.service(
            Service::Dashboard,
            None,
            bc.clone(),
            dashboard::serve(l, sh.clone(), bc.clone()),
        ));
    }
    background
}

/// OpenTelemetry's exporters, as configured (off unless an endpoint is), said in the log.
fn start_telemetry(
    config: &Config,
    worker_id: &str,
) -> Result<crate::telemetry::Telemetry, WorkerError> {
    let otlp = config
        .telemetry
        .resolve()
        .map_err(|e| WorkerError::Telemetry(e.join("; ")))?;
    let telemetry =
        crate::telemetry::Telemetry::start(otlp, worker_id).map_err(WorkerError::Telemetry)?;
    info!("{}", telemetry.describe());
    Ok(telemetry)
}

/// Pushes `/metrics` as OTLP metrics every `every`, and once more as the worker stops. A
/// collector that does not answer is said once per outage (by the transport); the readings
/// meanwhile are skipped (the next one carries the counters' totals).
async fn push_metrics(shared: Arc<Shared>, every: Duration, cancel: CancellationToken) {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let last = tokio::select! {
            _ = cancel.cancelled() => true,
            _ = tick.tick() => false,
        };
        let text = metrics::render(&shared).await;
        let _ = shared.telemetry.push_metrics(&text).await;
        if last {
            return;
        }
    }
}

impl RunningWorker {
    /// Graceful shutdown: stops fetching, lets running jobs finish within `shutdown_grace`,
    /// releases the rest (attempt refunded, message nak'd), marks the worker stopped.
    pub async fn shutdown(mut self) -> DrainReport {
        self.cancel.cancel();
        let report = self.shared.drain(self.grace).await;
        // The completer ends once the last job has settled (its channel closes).
        if tokio::time::timeout(Duration::from_secs(10), async {
            while self.tasks.join_next().await.is_some() {}
        })
        .await
        .is_err()
        {
            warn!(worker.id = %self.id, "completer did not finish; aborting");
            self.tasks.abort_all();
        }
        self.background_cancel.cancel();
        while self.background.join_next().await.is_some() {}
        if let Err(e) = self.store.worker_stop(&self.id, "shutdown").await {
            warn!(cause = %e, "could not mark the worker stopped");
        }
        self.shared
            .outbound
            .flush(&self.broker.client, Duration::from_secs(5))
            .await;
        let telemetry = self.shared.telemetry.clone();
        drop(self.shared);
        self.outbound_task.abort();
        // The last spans, sent before the process ends (bounded by the export's own limit).
        let _ = tokio::task::spawn_blocking(move || telemetry.shutdown()).await;
        info!(worker.id = %self.id, finished = report.finished, released = report.released, "worker stopped");
        report
    }

    /// Stops without any clean-up, like a crash (tests of recovery): nothing is settled,
    /// released or marked stopped.
    pub fn abort(mut self) {
        self.shared.ledger.stop_all(Stop::Lost);
        self.shared.fetch_cancel.cancel();
        self.tasks.abort_all();
        self.background.abort_all();
        self.outbound_task.abort();
    }

    /// Runs until `signal` resolves (or the start's token is cancelled), then shuts down
    /// gracefully: `Ok` with what the drain did. A drain asked for through the API and not
    /// followed by a stop within `worker.drained_exit_after` ends it too (gracefully): a
    /// drained worker takes no jobs, and its orchestrator (which sees it alive) would never
    /// restart it.
    ///
    /// Stops early when a service fails (a panic, or an end before shutdown — see
    /// [`supervisor`]) and returns that failure, after a **bounded, best-effort drain**:
    /// running jobs get `shutdown_grace` to finish and settle, the rest are released (as at
    /// any shutdown), so a failure in, say, the scheduler does not make other workers run
    /// this worker's jobs a second time. The whole drain is bounded by `shutdown_grace` +
    /// [`DRAIN_OVERHEAD`](crate::config::DRAIN_OVERHEAD), a signal meanwhile stops it at
    /// once, and a panic in it is contained. When the failed service is one the drain needs
    /// (the completer settles, the heartbeat keeps this worker's jobs its own) there is no
    /// drain: the worker stops at once (crash-only), marks itself stopped, and the recovery
    /// paths take its jobs back (the heartbeat reaper of any worker at once, start-up
    /// reconciliation when the pod restarts). A failure during a graceful shutdown is
    /// returned too.
    pub async fn run_until(
        self,
        signal: impl std::future::Future<Output = ()>,
    ) -> Result<DrainReport, ServiceFailure> {
        let cancel = self.cancel.clone();
        let supervisor = self.shared.supervisor.clone();
        let after = self.shared.config.worker.drained_exit_after;
        let drained = self.shared.drained.clone();
        let drained_long = async move {
            drained.cancelled().await;
            tokio::time::sleep(after).await;
        };
        tokio::pin!(signal);
        let failure = tokio::select! {
            biased;
            f = supervisor.failed() => Some(f),
            _ = &mut signal => None,
            _ = cancel.cancelled() => None,
            _ = drained_long => {
                warn!(worker.id = %self.id, drained_exit_after = %crate::config::fmt_dur(after),
                      "drained on request and no stop signal came within worker.drained_exit_after: \
                       exiting, so the orchestrator starts this worker again, serving");
                None
            }
        };
        let Some(failure) = failure else {
            let report = self.shutdown().await;
            return match supervisor.failure() {
                Some(f) => Err(f.clone()),
                None => Ok(report),
            };
        };
        self.stop_after_failure(&failure, signal).await;
        if supervisor.more() > 0 {
            warn!(more = supervisor.more(), "further service failures followed the first (its consequences, most likely; debug level shows them)");
        }
        info!(service = %failure.service, exit_code = EXIT_SERVICE_FAILED,
              "worker stopped after the service failure logged above");
        Err(failure)
    }

    /// Resolves when a service of this worker fails (for programs that do not call
    /// [`RunningWorker::run_until`]: shut the worker down then, and exit).
    pub async fn failed(&self) -> ServiceFailure {
        self.shared.supervisor.failed().await
    }

    /// The first service failure, if any.
    pub fn failure(&self) -> Option<ServiceFailure> {
        self.shared.supervisor.failure().cloned()
    }

    /// After a service failure: the bounded drain, or none (see [`RunningWorker::run_until`]).
    async fn stop_after_failure(
        self,
        failure: &ServiceFailure,
        signal: std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
    ) {
        // Unready at once: no new work is sent this way while it stops.
        self.shared.draining.store(true, Ordering::SeqCst);
        if failure.service.drain_needs_it() {
            warn!(service = %failure.service,
                  "no drain: a drain needs the failed service; the jobs this worker holds are taken back by recovery");
            let (store, id) = (self.store.clone(), self.id.clone());
            let shared = self.shared.clone();
            // Contained: a lock the failure poisoned must not turn exit 70 into a panic.
            let stopped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.abort()));
            if stopped.is_err() {
                error!(
                    "stopping the handlers after the failure panicked; they end with the process"
                );
            }
            // The handlers were told to stop (exec: TERM, then KILL of its process group):
            // wait for them, bounded, so that no command outlives the process and runs on
            // while its job runs again elsewhere. (Polled: a stop is rare, and finished
            // attempts wait for no one here.)
            let stopping = tokio::spawn(async move {
                while shared.ledger.unfinished() > 0 {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            });
            if !matches!(
                tokio::time::timeout(RELEASE_WAIT, stopping).await,
                Ok(Ok(()))
            ) {
                warn!("some handlers did not stop in time; they end with the process");
            }
            // Stopped in the workers table: any worker's reaper takes its jobs back now,
            // instead of after `dead_after`.
            let reason = format!("failed: {}", failure.service);
            match tokio::time::timeout(STOP_MARK_LIMIT, store.worker_stop(&id, &reason)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => warn!(cause = %e, "could not mark the worker stopped; the heartbeat reaper takes its jobs back after dead_after"),
                Err(_) => warn!("could not mark the worker stopped in time; the heartbeat reaper takes its jobs back after dead_after"),
            }
            return;
        }
        let limit = self.grace + crate::config::DRAIN_OVERHEAD;
        info!(service = %failure.service, limit = %crate::config::fmt_dur(limit),
              "draining before exit: running jobs get shutdown_grace to finish, the rest are released");
        // In a task of its own: a panic in the drain (a lock the failure poisoned) ends the
        // drain, not the exit.
        let mut drain = tokio::spawn(self.shutdown());
        tokio::select! {
            done = &mut drain => match done {
                Ok(report) => info!(finished = report.finished, released = report.released, "drained after the failure"),
                Err(e) => error!(cause = %e, "the drain after the failure failed; the jobs it left are taken back by recovery"),
            },
            _ = tokio::time::sleep(limit) => {
                drain.abort();
                warn!("the drain after the failure did not end in time; the jobs it left are taken back by recovery");
            }
            _ = signal => {
                drain.abort();
                warn!("signal during the drain after the failure: stopping now; the jobs left are taken back by recovery");
            }
        }
    }
}

/// Longest the crash-only stop waits to mark the worker stopped.
const STOP_MARK_LIMIT: Duration = Duration::from_secs(5);

/// Retries a connection (or provisioning) with backoff (1 s doubling to 30 s), saying what
/// is not available, until it succeeds or `cancel` fires. Errors that no wait can cure (bad
/// configuration, a refused login, a stream of the wrong kind) end it at once.
async fn retry_connect<T, E, F, Fut>(
    what: &str,
    cancel: &CancellationToken,
    connect: F,
) -> Result<T, WorkerError>
where
    E: std::fmt::Display + Fatal,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
    WorkerError: From<E>,
{
    retry_until(what, cancel, connect, E::is_fatal).await
}

/// An error that says whether waiting could cure it (each decides by its variants).
trait Fatal {
    fn is_fatal(&self) -> bool;
}

impl Fatal for crate::store::StoreError {
    fn is_fatal(&self) -> bool {
        crate::store::StoreError::is_fatal(self)
    }
}

impl Fatal for crate::broker::BrokerError {
    fn is_fatal(&self) -> bool {
        crate::broker::BrokerError::is_fatal(self)
    }
}

/// Runs a start-up step against PostgreSQL again, with the same backoff, while it fails
/// because the server went away (a restart between connecting and this step): a worker that
/// starts during a database restart waits for it rather than exit. Other errors end the start.
async fn retry_transient<T, F, Fut>(
    what: &str,
    cancel: &CancellationToken,
    step: F,
) -> Result<T, WorkerError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, crate::store::StoreError>>,
{
    retry_until(what, cancel, step, |e: &crate::store::StoreError| {
        !e.is_transient()
    })
    .await
}

/// Runs `step` until it succeeds, `fatal` says its error is one no wait can cure, or
/// `cancel` fires; waits 1 s after the first failure, doubling up to 30 s, and says so once
/// (then every 30 s), not per try (the worker's one backoff loop, [`outage`]).
async fn retry_until<T, E, F, Fut>(
    what: &str,
    cancel: &CancellationToken,
    mut step: F,
    fatal: impl Fn(&E) -> bool,
) -> Result<T, WorkerError>
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
    WorkerError: From<E>,
{
    let mut outage =
        outage::Outage::unavailable(what.to_string(), START_RETRY_FIRST, START_RETRY_LONGEST);
    loop {
        let delay = match step().await {
            Ok(v) => {
                outage.ok();
                return Ok(v);
            }
            Err(e) if fatal(&e) => return Err(e.into()),
            Err(e) => outage.failed(&e),
        };
        tokio::select! {
            _ = cancel.cancelled() => return Err(WorkerError::Cancelled),
            _ = tokio::time::sleep(delay) => {}
        }
    }
}

/// Start-up's waits for a server: 1 s, doubling up to 30 s.
const START_RETRY_FIRST: Duration = Duration::from_secs(1);
const START_RETRY_LONGEST: Duration = Duration::from_secs(30);

fn local_hostname() -> String {
    hostname::get()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreError;

    fn down() -> StoreError {
        StoreError::Unreachable {
            target: "db".into(),
            cause: "connection refused".into(),
        }
    }

    /// Start-up's retries back off, 1 s doubling to 30 s, however long the server is away.
    #[tokio::test(start_paused = true)]
    async fn start_up_retries_back_off_to_a_cap() {
        let cancel = CancellationToken::new();
        let tries = std::sync::Mutex::new(Vec::new());
        let got = retry_transient("the test step", &cancel, || {
            let mut t = tries.lock().unwrap();
            t.push(tokio::time::Instant::now());
            let n = t.len();
            async move {
                if n < 9 {
                    Err(down())
                } else {
                    Ok(n)
                }
            }
        })
        .await;
        assert_eq!(got.ok(), Some(9));
        let t = tries.into_inner().unwrap();
        let waits: Vec<u64> = t.windows(2).map(|w| (w[1] - w[0]).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30, 30]);
    }

    #[tokio::test(start_paused = true)]
    async fn start_up_retries_end_on_a_fatal_error_or_a_cancel() {
        let cancel = CancellationToken::new();
        let fatal = retry_transient("the test step", &cancel, || async {
            Err::<(), _>(StoreError::SchemaBehind {
                schema: "s".into(),
                have: 1,
                need: 2,
            })
        })
        .await;
        assert!(matches!(
            fatal,
            Err(WorkerError::Store(StoreError::SchemaBehind { .. }))
        ));
        let stop = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(100)).await;
            stop.cancel();
        });
        let cancelled =
            retry_transient("the test step", &cancel, || async { Err::<(), _>(down()) }).await;
        assert!(matches!(cancelled, Err(WorkerError::Cancelled)));
    }
}
