//! The worker process: connects to both servers, registers itself, and runs its services
//! until told to stop.
//!
//! - [`producer`]: per queue, pulls as many messages as there are free slots, claims them in
//!   one statement and dispatches them.
//! - [`executor`]: runs one job: handler, timeout, in-progress acks, progress reports.
//! - [`completer`]: settles finished attempts in grouped statements, then acks (commit,
//!   then ack — invariant 3).
//! - [`scheduler`]: publishes delayed jobs and retries when they become due.
//! - [`janitor`]: dead-letters messages published to subjects no consumer serves.
//! - [`heartbeat`]: keeps this worker's `workers` row fresh, checks its leases, and fences
//!   the worker off when it cannot reach PostgreSQL.
//! - [`rescuer`]: start-up reconciliation, the heartbeat reaper, the stale sweep and
//!   broker-loss reconciliation.
//!
//! Shutdown (and the drain endpoint) is [`Shared::drain`]: stop fetching, let running jobs
//! finish within the grace, release the rest; every loop `select!`s on its token.

mod completer;
mod executor;
mod heartbeat;
mod janitor;
mod producer;
mod rescuer;
mod scheduler;

use crate::api;
use crate::broker::Broker;
use crate::config::{Config, HandlerConfig};
use crate::handler::{exec::ExecHandler, http::HttpHandler, Handler};
use crate::store::Store;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{error, info, warn};

pub use completer::Finished;

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
    #[error("stopped before start-up finished")]
    Cancelled,
}

/// Counters every service updates; read by tests, the benchmark and (later) /metrics.
#[derive(Debug, Default)]
pub struct Stats {
    pub claimed: AtomicU64,
    pub completed: AtomicU64,
    pub retried: AtomicU64,
    pub dead: AtomicU64,
    /// Fenced writes that matched no row: the job had been taken from this worker.
    pub lost_ownership: AtomicU64,
    /// Messages that could not become jobs (recorded as dead jobs or poison messages).
    pub invalid: AtomicU64,
    /// Messages for jobs that were terminal, running elsewhere or duplicated: acked, dropped.
    pub dropped: AtomicU64,
    pub scheduled_published: AtomicU64,
    /// Jobs given back at shutdown or drain (attempt refunded).
    pub released: AtomicU64,
    /// Jobs this worker's rescuer took back, by reason.
    pub reclaimed_restarted: AtomicU64,
    pub reclaimed_owner_dead: AtomicU64,
    pub reclaimed_stale: AtomicU64,
    pub republished_broker_lost: AtomicU64,
    /// Times this worker fenced itself off (could not renew its heartbeat in time).
    pub self_fenced: AtomicU64,
}

impl Stats {
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
    pub(crate) fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }
}

/// Why a running attempt was stopped.
pub(crate) const STOP_LOST: u8 = 1;
pub(crate) const STOP_SHUTDOWN: u8 = 2;

/// A job running in this process, for progress reports arriving on the local API.
pub(crate) struct InFlight {
    pub lease: i64,
    pub acker: Arc<async_nats::jetstream::message::Acker>,
    pub cancel: CancellationToken,
    /// `STOP_LOST` or `STOP_SHUTDOWN`, set before `cancel` fires.
    pub stop: Arc<AtomicU8>,
}

/// What every service of one worker shares.
pub(crate) struct Shared {
    pub worker_id: String,
    pub config: Config,
    pub store: Store,
    pub broker: Broker,
    pub stats: Arc<Stats>,
    pub inflight: Mutex<HashMap<String, InFlight>>,
    /// Jobs this worker claimed and has not settled yet (id → lease): what the lease check
    /// compares with the database.
    pub owned: Mutex<HashMap<String, i64>>,
    pub api_base: String,
    /// Producers stop fetching when this fires (shutdown, drain).
    pub fetch_cancel: CancellationToken,
    /// Producers and their running jobs.
    pub producers: TaskTracker,
    /// Set while draining: readiness turns unready.
    pub draining: AtomicBool,
    /// Set while this worker cannot renew its heartbeat: producers pause.
    pub fenced: AtomicBool,
    pub hostname: String,
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
    /// Stops every running attempt for `reason` (`STOP_LOST` or `STOP_SHUTDOWN`).
    pub(crate) fn stop_all(&self, reason: u8) -> usize {
        let map = self.inflight.lock().expect("inflight lock");
        for f in map.values() {
            f.stop.store(reason, Ordering::SeqCst);
            f.cancel.cancel();
        }
        map.len()
    }

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
            let n = self.stop_all(STOP_SHUTDOWN);
            warn!(worker.id = %self.worker_id, jobs = n, "shutdown grace over: releasing running jobs");
            if tokio::time::timeout(RELEASE_WAIT + Duration::from_secs(3), self.producers.wait())
                .await
                .is_err()
            {
                error!(worker.id = %self.worker_id, "jobs did not stop after release; leaving them for recovery");
            }
        }
        // Released and finished jobs settle in the completer: wait for the last of them.
        let settled = async {
            while !self.owned.lock().expect("owned lock").is_empty() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        if tokio::time::timeout(Duration::from_secs(10), settled)
            .await
            .is_err()
        {
            warn!(worker.id = %self.worker_id, "some jobs were not settled after the drain");
        }
        let released = Stats::get(&self.stats.released) - released_before;
        DrainReport {
            finished: (self.settled_count() - before).saturating_sub(released),
            released,
        }
    }

    /// Tells alerting a job was dead-lettered: a small event on `jobwarden.dead.<queue>`
    /// (core NATS, outside the work stream). Best effort: the row is the record.
    pub(crate) async fn announce_dead(&self, queue: &str, id: &str, error: Option<&str>) {
        let event = serde_json::json!({"id": id, "queue": queue, "error": error});
        let subject = format!("jobwarden.dead.{queue}");
        if let Err(e) = self
            .broker
            .client
            .publish(subject, event.to_string().into())
            .await
        {
            warn!(job.id = %id, cause = %e, "dead-letter event not published");
        }
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
}

/// A started worker: its id, local API address and counters; it runs until cancelled.
pub struct RunningWorker {
    shared: Arc<Shared>,
    pub id: String,
    pub api_addr: SocketAddr,
    pub stats: Arc<Stats>,
    pub store: Store,
    pub broker: Broker,
    cancel: CancellationToken,
    /// Producers and the completer: done when every job is settled.
    tasks: JoinSet<()>,
    /// Scheduler, heartbeat, local API: stopped after the jobs drained.
    background: JoinSet<()>,
    background_cancel: CancellationToken,
    grace: Duration,
}

impl Worker {
    pub fn new(config: Config) -> Worker {
        Worker {
            config,
            rust_handlers: HashMap::new(),
        }
    }

    /// Registers a Rust handler under `name` (queues use it with
    /// `handler = { kind = "rust", name = "<name>" }`).
    pub fn rust_handler(mut self, name: &str, handler: Arc<dyn Handler>) -> Worker {
        self.rust_handlers.insert(name.to_string(), handler);
        self
    }

    /// Connects (retrying with backoff while a server is unreachable), migrates, provisions,
    /// registers and starts every service. Returns once jobs are flowing.
    pub async fn start(self, cancel: CancellationToken) -> Result<RunningWorker, WorkerError> {
        let config = self.config;
        let mut handlers: HashMap<String, Arc<dyn Handler>> = HashMap::new();
        for name in config.queues.keys() {
            let h: Arc<dyn Handler> = match config.handler_for(name).expect("validated") {
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
            handlers.insert(name.clone(), h);
        }

        let store =
            retry_connect("PostgreSQL", &cancel, || Store::connect(&config.database)).await?;
        let broker = retry_connect("NATS", &cancel, || Broker::connect(&config.nats)).await?;
        info!("{}", broker.features_line());
        if config.worker.migrate {
            let applied = store.migrate().await?;
            info!(applied, schema = %store.schema(), "migrations up to date");
        }
        if config.nats.provision {
            broker.provision_stream().await?;
        }
        let mut consumers = HashMap::new();
        for name in config.queues.keys() {
            let c = if config.nats.provision {
                broker.provision_consumer(name).await?
            } else {
                broker.consumer(name).await?
            };
            consumers.insert(name.clone(), c);
        }

        let hostname = config
            .worker
            .hostname
            .clone()
            .unwrap_or_else(local_hostname);
        let pid = std::process::id();
        let worker_id = format!("{hostname}-{pid}-{:08x}", rand::random::<u32>());
        let boot = crate::liveness::boot_id();
        let proc_start = crate::liveness::proc_start(pid as i32);
        store
            .worker_register(
                &worker_id,
                &hostname,
                pid as i32,
                boot.as_deref(),
                proc_start,
            )
            .await?;

        let listener = tokio::net::TcpListener::bind(&config.worker.api_listen)
            .await
            .map_err(|e| WorkerError::Api {
                addr: config.worker.api_listen.clone(),
                cause: e.to_string(),
            })?;
        let api_addr = listener.local_addr().map_err(|e| WorkerError::Api {
            addr: config.worker.api_listen.clone(),
            cause: e.to_string(),
        })?;
        let stats = Arc::new(Stats::default());
        let shared = Arc::new(Shared {
            worker_id: worker_id.clone(),
            store: store.clone(),
            broker: broker.clone(),
            stats: stats.clone(),
            inflight: Mutex::new(HashMap::new()),
            owned: Mutex::new(HashMap::new()),
            api_base: format!("http://{api_addr}"),
            config: config.clone(),
            fetch_cancel: cancel.child_token(),
            producers: TaskTracker::new(),
            draining: AtomicBool::new(false),
            fenced: AtomicBool::new(false),
            hostname: hostname.clone(),
        });
        // Before taking new work: recover what earlier incarnations of this host left.
        rescuer::Rescuer::new(shared.clone())
            .reconcile_startup()
            .await;
        info!(worker.id = %worker_id, api = %api_addr, queues = ?config.queues.keys().collect::<Vec<_>>(), "worker started");

        let mut tasks = JoinSet::new();
        let (done_tx, done_rx) = tokio::sync::mpsc::channel(4096);
        // Producers stop at `fetch_cancel`; running jobs finish and settle before the
        // completer's channel closes (it ends when the last sender is dropped).
        for (name, consumer) in consumers {
            let p = producer::Producer::new(
                shared.clone(),
                name.clone(),
                consumer,
                handlers[&name].clone(),
                done_tx.clone(),
            );
            shared.producers.spawn(p.run(shared.fetch_cancel.clone()));
        }
        drop(done_tx);
        tasks.spawn(completer::Completer::new(shared.clone()).run(done_rx));
        let background_cancel = CancellationToken::new();
        let mut background = JoinSet::new();
        background.spawn(scheduler::Scheduler::new(shared.clone()).run(background_cancel.clone()));
        background.spawn(janitor::Janitor::new(shared.clone()).run(background_cancel.clone()));
        background.spawn(heartbeat::Heartbeat::new(shared.clone()).run(background_cancel.clone()));
        background.spawn(rescuer::Rescuer::new(shared.clone()).run(background_cancel.clone()));
        background.spawn(api::serve(
            listener,
            shared.clone(),
            background_cancel.clone(),
        ));

        Ok(RunningWorker {
            shared,
            id: worker_id,
            api_addr,
            stats,
            store,
            broker,
            cancel,
            tasks,
            background,
            background_cancel,
            grace: config.worker.shutdown_grace,
        })
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
        info!(worker.id = %self.id, finished = report.finished, released = report.released, "worker stopped");
        report
    }

    /// Stops without any clean-up, like a crash (tests of recovery): nothing is settled,
    /// released or marked stopped.
    pub fn abort(mut self) {
        self.shared.stop_all(STOP_LOST);
        self.shared.fetch_cancel.cancel();
        self.tasks.abort_all();
        self.background.abort_all();
    }

    /// Runs until `signal` resolves, then shuts down.
    pub async fn run_until(self, signal: impl std::future::Future<Output = ()>) {
        let cancel = self.cancel.clone();
        tokio::select! {
            _ = signal => {}
            _ = cancel.cancelled() => {}
        }
        self.shutdown().await;
    }
}

/// Retries a connection with backoff (1 s doubling to 30 s), saying what is unreachable,
/// until it succeeds or `cancel` fires.
async fn retry_connect<T, E, F, Fut>(
    what: &str,
    cancel: &CancellationToken,
    mut connect: F,
) -> Result<T, WorkerError>
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
    WorkerError: From<E>,
{
    let mut delay = Duration::from_secs(1);
    loop {
        match connect().await {
            Ok(v) => return Ok(v),
            Err(e) => {
                let msg = e.to_string();
                if msg.contains("is invalid") || msg.contains("credentials_file") {
                    return Err(e.into());
                }
                error!(cause = %msg, "{what} not available; retrying in {}", crate::config::fmt_dur(delay));
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => return Err(WorkerError::Cancelled),
            _ = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(Duration::from_secs(30));
    }
}

fn local_hostname() -> String {
    hostname::get()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// Progress report entry point for the local API.
pub(crate) async fn executor_report(
    shared: &Shared,
    job_id: &str,
    report: &crate::handler::Progress,
) -> Result<(), crate::handler::LostOwnership> {
    executor::report_progress(shared, job_id, report).await
}
