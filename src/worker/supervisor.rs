//! The Supervisor: every long-lived task of a worker runs under it, by name, so that no task
//! can die unnoticed (invariant 14).
//!
//! A service that panics, or returns while nobody asked it to stop, is a **failure** of the
//! worker: the first one is logged once (error level, with the service's name and the
//! cause), `/livez` answers `503` naming it, and [`RunningWorker::run_until`] returns it —
//! `jobwarden run` then exits with [`EXIT_SERVICE_FAILED`] (70, `EX_SOFTWARE`) and Kubernetes
//! restarts the container. The worker does not try to restart a service itself: a panic means
//! an assumption of the code was wrong, and the process's state (a lock poisoned, a channel
//! closed, a counter off) may be wrong with it. Jobs in flight go back through the recovery
//! paths (see [`RunningWorker::run_until`] for the bounded drain tried first).
//!
//! Three kinds of tasks are watched:
//!
//! - **services** ([`Supervisor::service`]): run until their stop token fires; a return
//!   before that is a failure, a panic always is;
//! - **per-job tasks** ([`Supervisor::job`]): end when their job ends; a panic in them (in
//!   jobwarden's code around the handler: a panic *inside* the handler is caught by the
//!   executor and fails only that job) is a failure of the executor;
//! - **tasks spawned by libraries** (the NATS client's connection task, HTTP connections,
//!   PostgreSQL connections): out of reach of a wrapper. [`report_unsupervised_panics`]
//!   installs a panic hook (the `jobwarden` command does) that makes a panic anywhere outside
//!   a supervised or handled scope a failure too. The NATS client's connection task is also
//!   watched by [`super::nats_watch`], which does not depend on the hook.
//!
//! Fail points (a test hook: `JOBWARDEN_FAILPOINTS`, see [`FailPoints`]) inject a panic or an
//! early return into any named service, so the tests can see each one noticed.
//!
//! [`RunningWorker::run_until`]: super::RunningWorker::run_until

use futures::FutureExt;
use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error};

/// The exit code of `jobwarden run` after a service failure (`EX_SOFTWARE` of sysexits.h:
/// an internal software error).
pub const EXIT_SERVICE_FAILED: i32 = 70;

/// The services of a worker, as named in logs, `/livez`, fail points and
/// [`ServiceFailure`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Service {
    /// Pulls and claims the jobs of one queue (one per queue).
    Producer,
    /// Runs one job (a task per job).
    Executor,
    /// Settles finished attempts.
    Completer,
    /// Publishes due jobs and resolves chains.
    Scheduler,
    /// Start-up reconciliation's successor: the heartbeat reaper and the stale sweep.
    Rescuer,
    /// Adoption and broker-loss repair.
    Reconciler,
    /// Messages on unserved subjects.
    Janitor,
    /// This worker's heartbeat, lease checks and self-fence.
    Heartbeat,
    /// A producer's cluster-wide flow control (it runs inside its queue's producer).
    Flow,
    /// Enqueues cron fires.
    Cron,
    /// Rolls finished work up per queue and minute (the statistics' source).
    Rollup,
    /// Deletes finished rows whose keep is over (retention).
    Pruner,
    /// The local API (progress reports, drain, probes).
    Api,
    /// The ops listener: `/metrics`, probes (and metrics refreshes).
    Metrics,
    /// The dashboard.
    Dashboard,
    /// Acks and events to NATS.
    Outbound,
    /// The NATS client's own connection task (watched by a probe).
    NatsClient,
    /// A task spawned outside the supervisor (a library's), seen by the panic hook.
    Unsupervised,
}

impl Service {
    /// Every service a fail point can name.
    pub const ALL: [Service; 18] = [
        Service::Producer,
        Service::Executor,
        Service::Completer,
        Service::Scheduler,
        Service::Rescuer,
        Service::Reconciler,
        Service::Janitor,
        Service::Heartbeat,
        Service::Flow,
        Service::Cron,
        Service::Rollup,
        Service::Pruner,
        Service::Api,
        Service::Metrics,
        Service::Dashboard,
        Service::Outbound,
        Service::NatsClient,
        Service::Unsupervised,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Service::Producer => "producer",
            Service::Executor => "executor",
            Service::Completer => "completer",
            Service::Scheduler => "scheduler",
            Service::Rescuer => "rescuer",
            Service::Reconciler => "reconciler",
            Service::Janitor => "janitor",
            Service::Heartbeat => "heartbeat",
            Service::Flow => "flow",
            Service::Cron => "cron",
            Service::Rollup => "rollup",
            Service::Pruner => "pruner",
            Service::Api => "api",
            Service::Metrics => "metrics",
            Service::Dashboard => "dashboard",
            Service::Outbound => "outbound",
            Service::NatsClient => "nats-client",
            Service::Unsupervised => "unsupervised",
        }
    }

    /// Whether a drain cannot work without this service: the completer settles what the
    /// drain waits for, and without the heartbeat other workers declare this one dead and
    /// run its jobs again while it drains. After their failure the worker stops at once.
    pub fn drain_needs_it(self) -> bool {
        matches!(self, Service::Completer | Service::Heartbeat)
    }

    fn bit(self) -> u64 {
        1 << Service::ALL.iter().position(|s| *s == self).unwrap_or(63)
    }
}

impl fmt::Display for Service {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Service {
    type Err = String;
    fn from_str(s: &str) -> Result<Service, String> {
        Service::ALL
            .into_iter()
            .find(|v| v.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Service::ALL.iter().map(|v| v.name()).collect();
                format!("no service {s:?}; services are {}", names.join(", "))
            })
    }
}

/// How a service failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cause {
    /// It panicked (with the panic's message, and where when known).
    Panicked(String),
    /// It ended while the worker was running.
    Returned,
    /// It found the worker unable to go on (e.g. the NATS client's connection task is gone).
    Failed(String),
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cause::Panicked(m) => write!(f, "panicked: {m}"),
            Cause::Returned => f.write_str(
                "ended while the worker was running (a service runs until shutdown); this is a \
                 bug in jobwarden",
            ),
            Cause::Failed(m) => f.write_str(m),
        }
    }
}

/// The first failure of a worker's services: why the worker stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("service {service}{} failed: {cause}", .scope.as_deref().map(|s| format!(" ({s})")).unwrap_or_default())]
pub struct ServiceFailure {
    pub service: Service,
    /// Which one, for services with several tasks (a producer's queue).
    pub scope: Option<String>,
    pub cause: Cause,
}

/// What a service's future may end with: `()`, or a `Result` whose error is the cause.
pub(crate) trait ServiceEnd {
    fn into_cause(self) -> Option<Cause>;
}

impl ServiceEnd for () {
    fn into_cause(self) -> Option<Cause> {
        None
    }
}

impl<E: fmt::Display> ServiceEnd for Result<(), E> {
    fn into_cause(self) -> Option<Cause> {
        self.err().map(|e| Cause::Failed(e.to_string()))
    }
}

#[derive(Clone)]
pub(crate) struct Supervisor(Arc<Inner>);

struct Inner {
    first: OnceLock<ServiceFailure>,
    /// Fires at the first failure.
    failed: CancellationToken,
    /// Failures after the first (often its consequences), counted, not logged each.
    more: AtomicU64,
    points: FailPoints,
    /// When the fail points' delays count from.
    started: Instant,
    /// Fail points that fired (each fires once).
    fired: AtomicU64,
}

impl Supervisor {
    pub fn new(points: FailPoints) -> Supervisor {
        let inner = Arc::new(Inner {
            first: OnceLock::new(),
            failed: CancellationToken::new(),
            more: AtomicU64::new(0),
            points,
            started: Instant::now(),
            fired: AtomicU64::new(0),
        });
        if let Ok(mut live) = LIVE.lock() {
            live.retain(|w| w.strong_count() > 0);
            live.push(Arc::downgrade(&inner));
        }
        Supervisor(inner)
    }

    /// The first failure, if any.
    pub fn failure(&self) -> Option<&ServiceFailure> {
        self.0.first.get()
    }

    /// Resolves at the first failure.
    pub async fn failed(&self) -> ServiceFailure {
        self.0.failed.cancelled().await;
        self.0
            .first
            .get()
            .cloned()
            .expect("set before the token fires")
    }

    /// Failures after the first.
    pub fn more(&self) -> u64 {
        self.0.more.load(Ordering::Relaxed)
    }

    /// Records a failure; the first one is logged (once) and fires [`Supervisor::failed`].
    pub fn fail(&self, service: Service, scope: Option<String>, cause: Cause) {
        self.0.fail(ServiceFailure {
            service,
            scope,
            cause,
        });
    }

    /// Runs a service: a panic, an error, or a return before `stop` fires is a failure.
    pub fn service<F>(
        &self,
        service: Service,
        scope: Option<String>,
        stop: CancellationToken,
        run: F,
    ) -> impl Future<Output = ()> + Send + 'static
    where
        F: Future + Send + 'static,
        F::Output: ServiceEnd + Send,
    {
        let sup = self.clone();
        let point = self.0.points.get(service);
        async move {
            let run = async {
                let Some(point) = point else {
                    return run.await.into_cause();
                };
                tokio::pin!(run);
                tokio::select! {
                    end = &mut run => end.into_cause(),
                    _ = sup.due(&point) => {
                        if !sup.claim(service) {
                            // Fired in another task of the service (another queue's
                            // producer): this one carries on.
                            return run.await.into_cause();
                        }
                        match point.action {
                            Action::Panic => panic!("fail point {service}=panic ({FAILPOINTS_ENV})"),
                            // Ends as if the service had returned.
                            Action::Return => None,
                        }
                    }
                }
            };
            let ended = CATCHER
                .scope((), AssertUnwindSafe(run).catch_unwind())
                .await;
            let cause = match ended {
                Ok(Some(cause)) => cause,
                Ok(None) if stop.is_cancelled() => return,
                Ok(None) => Cause::Returned,
                Err(panic) => Cause::Panicked(panic_message(panic.as_ref())),
            };
            sup.fail(service, scope, cause);
        }
    }

    /// Runs a per-job task: its end is normal, a panic is a failure of the executor.
    pub fn job<F>(&self, run: F) -> impl Future<Output = ()> + Send + 'static
    where
        F: Future<Output = ()> + Send + 'static,
    {
        use futures::FutureExt;
        // The executor's fail point, first thing in the task (guarded like the rest). A
        // combinator: `then` keeps either the check or the job, never both (see `task`).
        let sup = self.clone();
        let checked =
            futures::future::lazy(move |_| sup.failpoint(Service::Executor)).then(move |()| run);
        self.task(Service::Executor, checked)
    }

    /// Runs a helper task of `service` (a connection's driver, a job): its end is normal, a
    /// panic is a failure of `service`.
    ///
    /// Made of combinators, not an `async` block: an `async` wrapper holds the future it
    /// wraps twice (as its captured value, and again once moved into the `.await`), and a
    /// job's task is mostly its future — two such wrappers made every job in flight four
    /// times its size (+5.5 MiB at 512 HTTP slots in `jobwarden bench`'s worker-alone phase).
    pub fn task<F>(&self, service: Service, run: F) -> impl Future<Output = ()> + Send + 'static
    where
        F: Future<Output = ()> + Send + 'static,
    {
        use futures::FutureExt;
        let sup = self.clone();
        CATCHER
            .scope((), AssertUnwindSafe(run).catch_unwind())
            .map(move |ended| {
                if let Err(panic) = ended {
                    let cause = Cause::Panicked(panic_message(panic.as_ref()));
                    sup.fail(service, None, cause);
                }
            })
    }

    /// A fail point inside a service's code (for parts that are not tasks of their own, like
    /// flow control, and per-job tasks): panics once its delay has passed, as
    /// `JOBWARDEN_FAILPOINTS` says. A `return` action makes no sense inside code and acts as
    /// a panic there.
    pub fn failpoint(&self, service: Service) {
        if let Some(p) = self.0.points.get(service) {
            let due = match &p.when {
                When::After(after) => Instant::now() >= self.0.started + *after,
                When::Triggered(t) => t.0.is_cancelled(),
            };
            if due && self.claim(service) {
                panic!("fail point {service}=panic ({FAILPOINTS_ENV})");
            }
        }
    }

    /// The `unsupervised` fail point: a task spawned outside the supervisor that panics (only
    /// [`report_unsupervised_panics`]'s hook can notice it).
    pub fn spawn_unsupervised_failpoint(&self) {
        if let Some(p) = self.0.points.get(Service::Unsupervised) {
            let sup = self.clone();
            tokio::spawn(async move {
                sup.due(&p).await;
                panic!("fail point unsupervised=panic ({FAILPOINTS_ENV})");
            });
        }
    }

    /// Resolves when `point` is due.
    async fn due(&self, point: &Point) {
        match &point.when {
            When::After(after) => tokio::time::sleep_until(self.0.started + *after).await,
            When::Triggered(t) => t.0.cancelled().await,
        }
    }

    /// Takes `service`'s fail point: true the first time only (a point fires once).
    fn claim(&self, service: Service) -> bool {
        self.0.fired.fetch_or(service.bit(), Ordering::SeqCst) & service.bit() == 0
    }
}

impl Inner {
    fn fail(&self, failure: ServiceFailure) {
        if self.first.set(failure.clone()).is_ok() {
            error!(service = %failure.service, scope = failure.scope.as_deref(), cause = %failure.cause,
                   exit_code = EXIT_SERVICE_FAILED,
                   "a service of this worker failed: the worker stops (what becomes of its jobs follows)");
            self.failed.cancel();
        } else {
            self.more.fetch_add(1, Ordering::Relaxed);
            debug!(service = %failure.service, cause = %failure.cause, "another service failure");
        }
    }
}

tokio::task_local! {
    /// Set while a task runs inside a scope that catches and reports its panics (a
    /// supervised service, a per-job task, a handler): the panic hook leaves those alone.
    static CATCHER: ();
}

/// Runs `fut` in a scope whose panics its caller catches (the executor's guard around a
/// handler): [`report_unsupervised_panics`]'s hook leaves them to it.
pub(crate) fn caught<F: Future>(fut: F) -> impl Future<Output = F::Output> {
    CATCHER.scope((), fut)
}

/// Every live supervisor, for the panic hook.
static LIVE: Mutex<Vec<Weak<Inner>>> = Mutex::new(Vec::new());

std::thread_local! {
    /// Where the last panic on this thread happened (kept by the hook for the supervisor's
    /// message).
    static LAST_LOCATION: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Makes a panic in any task that no supervisor or handler guard catches — a task a library
/// spawned: the NATS client's connection, an HTTP connection, a PostgreSQL connection — a
/// failure of every worker in this process (reported as `unsupervised`, with where it
/// happened). It also gives supervised panics their location. The previous hook still runs
/// (the panic's usual message on stderr).
///
/// Process-wide: the `jobwarden` command installs it; a program that links jobwarden as a
/// library may, if a panic in any of its own unsupervised tasks should stop its workers too.
pub fn report_unsupervised_panics() {
    static INSTALLED: AtomicBool = AtomicBool::new(false);
    if INSTALLED.swap(true, Ordering::SeqCst) {
        return;
    }
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let location = info
            .location()
            .map(|l| format!("{}:{}:{}", l.file(), l.line(), l.column()));
        if CATCHER.try_with(|_| ()).is_ok() {
            LAST_LOCATION.with(|l| *l.borrow_mut() = location);
        } else {
            let message = panic_message(info.payload());
            let cause = match location {
                Some(at) => format!("a task outside the supervisor panicked at {at}: {message}"),
                None => format!("a task outside the supervisor panicked: {message}"),
            };
            // try_lock: a panic while the list is locked must not deadlock the hook.
            let live: Vec<Arc<Inner>> = LIVE
                .try_lock()
                .map(|l| l.iter().filter_map(Weak::upgrade).collect())
                .unwrap_or_default();
            for inner in live {
                inner.fail(ServiceFailure {
                    service: Service::Unsupervised,
                    scope: None,
                    cause: Cause::Panicked(cause.clone()),
                });
            }
        }
        previous(info);
    }));
}

/// A panic's message (its `&str` or `String` payload), with where it happened when the hook
/// saw it.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    let message = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(a panic without a message)".to_string());
    match LAST_LOCATION.with(|l| l.borrow_mut().take()) {
        Some(at) => format!("{message} (at {at})"),
        None => message,
    }
}

/// What a fail point does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// The service panics.
    Panic,
    /// The service's task ends as if it had returned.
    Return,
}

#[derive(Debug, Clone)]
struct Point {
    action: Action,
    when: When,
}

/// When a fail point fires.
#[derive(Debug, Clone)]
enum When {
    /// This long after the worker's start.
    After(Duration),
    /// When the test fires its trigger.
    Triggered(FailTrigger),
}

/// Fires the fail points added with [`FailPoints::on_trigger`]: an in-process test makes a
/// service fail exactly when it has set the scene (a job running, say).
#[derive(Debug, Clone, Default)]
pub struct FailTrigger(CancellationToken);

impl FailTrigger {
    pub fn new() -> FailTrigger {
        FailTrigger::default()
    }

    pub fn fire(&self) {
        self.0.cancel();
    }
}

/// Injected failures, a **test hook**: `service=action[@delay]` entries separated by commas,
/// e.g. `scheduler=panic`, `api=return@2s`. The action is `panic` or `return` (the service's
/// task ends as if it had returned); the delay counts from the worker's start (default 0).
/// Each point fires once. `jobwarden run` reads them from `JOBWARDEN_FAILPOINTS`; library
/// users pass them to [`Worker::failpoints`](super::Worker::failpoints). Never set it in
/// production: it makes the worker fail on purpose.
#[derive(Debug, Clone, Default)]
pub struct FailPoints(Vec<(Service, Point)>);

/// The environment variable `jobwarden run` reads [`FailPoints`] from.
pub const FAILPOINTS_ENV: &str = "JOBWARDEN_FAILPOINTS";

impl FailPoints {
    fn get(&self, service: Service) -> Option<Point> {
        self.0
            .iter()
            .find(|(s, _)| *s == service)
            .map(|(_, p)| p.clone())
    }

    /// Adds a point: `service` does `action` when `trigger` fires.
    pub fn on_trigger(mut self, service: Service, action: Action, trigger: &FailTrigger) -> Self {
        let when = When::Triggered(trigger.clone());
        self.0.push((service, Point { action, when }));
        self
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::str::FromStr for FailPoints {
    type Err = String;

    fn from_str(spec: &str) -> Result<FailPoints, String> {
        let mut points = Vec::new();
        for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let bad = |why: String| {
                format!(
                    "{FAILPOINTS_ENV}: entry {entry:?}: {why}; write service=panic or \
                     service=return, optionally @delay (e.g. scheduler=panic@2s)"
                )
            };
            let (service, action) = entry.split_once('=').ok_or_else(|| bad("no '='".into()))?;
            let service: Service = service.trim().parse().map_err(bad)?;
            let (action, after) = match action.split_once('@') {
                Some((a, d)) => (
                    a,
                    humantime::parse_duration(d.trim())
                        .map_err(|e| bad(format!("delay {d:?}: {e}")))?,
                ),
                None => (action, Duration::ZERO),
            };
            let action = match action.trim() {
                "panic" => Action::Panic,
                "return" => Action::Return,
                other => return Err(bad(format!("unknown action {other:?}"))),
            };
            let when = When::After(after);
            points.push((service, Point { action, when }));
        }
        Ok(FailPoints(points))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn points(spec: &str) -> FailPoints {
        spec.parse().expect("valid fail points")
    }

    #[test]
    fn fail_points_parse_and_refuse_with_the_valid_names() {
        let p = points("scheduler=panic, api=return@2s");
        let when = |s| match p.get(s) {
            Some(Point {
                action,
                when: When::After(after),
            }) => Some((action, after)),
            _ => None,
        };
        assert_eq!(
            when(Service::Scheduler),
            Some((Action::Panic, Duration::ZERO))
        );
        assert_eq!(
            when(Service::Api),
            Some((Action::Return, Duration::from_secs(2)))
        );
        assert!(p.get(Service::Cron).is_none());
        assert!(points("").is_empty());
        let e = "schedular=panic".parse::<FailPoints>().unwrap_err();
        assert!(e.contains("schedular") && e.contains("scheduler"), "{e}");
        let e = "scheduler=explode".parse::<FailPoints>().unwrap_err();
        assert!(e.contains("explode"), "{e}");
        assert!("scheduler".parse::<FailPoints>().is_err());
        assert!("scheduler=panic@soon".parse::<FailPoints>().is_err());
        for s in Service::ALL {
            assert_eq!(s.name().parse::<Service>(), Ok(s));
        }
    }

    async fn panics(message: &'static str) {
        panic!("{message}")
    }

    async fn first_failure(sup: &Supervisor) -> ServiceFailure {
        tokio::time::timeout(Duration::from_secs(5), sup.failed())
            .await
            .expect("a failure is reported")
    }

    /// Every service, through its fail point: a panic and an early return are each noticed
    /// under the service's name.
    #[tokio::test]
    async fn every_service_is_covered_by_its_fail_point() {
        // (`unsupervised` is a task outside any wrapper: the command's test covers it.)
        for service in Service::ALL
            .into_iter()
            .filter(|s| *s != Service::Unsupervised)
        {
            for action in ["panic", "return"] {
                let sup = Supervisor::new(points(&format!("{service}={action}")));
                let stop = CancellationToken::new();
                // A service that would run until stopped.
                let forever = {
                    let stop = stop.clone();
                    async move { stop.cancelled().await }
                };
                tokio::spawn(sup.service(service, None, stop.clone(), forever));
                let f = first_failure(&sup).await;
                assert_eq!(f.service, service);
                match action {
                    "panic" => assert_eq!(
                        f.cause,
                        Cause::Panicked(format!(
                            "fail point {service}=panic (JOBWARDEN_FAILPOINTS)"
                        ))
                    ),
                    _ => assert_eq!(f.cause, Cause::Returned),
                }
                assert_eq!(sup.more(), 0);
            }
        }
    }

    #[tokio::test]
    async fn a_service_that_returns_before_its_stop_is_a_failure_after_it_is_not() {
        let sup = Supervisor::new(FailPoints::default());
        let stop = CancellationToken::new();
        tokio::spawn(sup.service(Service::Cron, None, stop.clone(), async {}))
            .await
            .unwrap();
        assert_eq!(sup.failure().map(|f| f.service), Some(Service::Cron));
        assert_eq!(
            sup.failure().map(|f| f.cause.clone()),
            Some(Cause::Returned)
        );

        let sup = Supervisor::new(FailPoints::default());
        stop.cancel();
        tokio::spawn(sup.service(Service::Cron, None, stop.clone(), async {}))
            .await
            .unwrap();
        assert_eq!(
            sup.failure(),
            None,
            "a return after the stop is the normal end"
        );
    }

    #[tokio::test]
    async fn an_error_is_a_failure_with_its_cause_and_only_the_first_counts_as_the_cause() {
        let sup = Supervisor::new(FailPoints::default());
        let stop = CancellationToken::new();
        let gone: Result<(), String> = Err("connection task gone".into());
        tokio::spawn(sup.service(Service::NatsClient, None, stop.clone(), async move { gone }))
            .await
            .unwrap();
        tokio::spawn(sup.service(Service::Janitor, None, stop, panics("after the first")))
            .await
            .unwrap();
        let f = sup.failure().unwrap();
        assert_eq!(f.service, Service::NatsClient);
        assert_eq!(f.cause, Cause::Failed("connection task gone".into()));
        assert_eq!(
            f.to_string(),
            "service nats-client failed: connection task gone"
        );
        assert_eq!(sup.more(), 1);
    }

    #[test]
    fn a_jobs_guard_adds_little_to_the_size_of_its_future() {
        // Every job in flight is a task this size: a guard made of `async` blocks held the
        // job's future several times over.
        let sup = Supervisor::new(FailPoints::default());
        let big = [0u8; 4096];
        let job = async move {
            tokio::task::yield_now().await;
            std::hint::black_box(&big);
        };
        let alone = std::mem::size_of_val(&job);
        let guarded = std::mem::size_of_val(&sup.job(job));
        assert!(
            guarded <= alone + 128,
            "a job of {alone} bytes is {guarded} bytes guarded"
        );
    }

    #[tokio::test]
    async fn a_job_task_ends_normally_and_its_panic_fails_the_executor() {
        let sup = Supervisor::new(FailPoints::default());
        tokio::spawn(sup.job(async {})).await.unwrap();
        assert_eq!(sup.failure(), None);
        tokio::spawn(sup.job(panics("ledger entry missing")))
            .await
            .unwrap();
        let f = sup.failure().unwrap();
        assert_eq!(f.service, Service::Executor);
        assert_eq!(f.cause, Cause::Panicked("ledger entry missing".into()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_delayed_fail_point_fires_after_its_delay_once() {
        let sup = Supervisor::new(points("heartbeat=panic@10s, executor=panic@10s"));
        let stop = CancellationToken::new();
        let forever = {
            let stop = stop.clone();
            async move { stop.cancelled().await }
        };
        tokio::spawn(sup.service(Service::Heartbeat, None, stop.clone(), forever));
        // A job before the delay runs normally.
        tokio::spawn(sup.job(async {})).await.unwrap();
        tokio::time::sleep(Duration::from_secs(9)).await;
        assert_eq!(sup.failure(), None);
        let f = first_failure(&sup).await;
        assert_eq!(f.service, Service::Heartbeat);
        // The executor's point fires for one job only.
        tokio::spawn(sup.job(async {})).await.unwrap();
        tokio::spawn(sup.job(async {})).await.unwrap();
        assert_eq!(sup.more(), 1);
    }
}
