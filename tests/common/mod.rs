//! Shared test harness: each test gets a throwaway nats-server (free port, temp store, killed
//! on drop) and its own PostgreSQL schema (dropped on drop) in the test database
//! (`JOBWARDEN_TEST_DATABASE_URL`, default `postgres://postgres@127.0.0.1:5432/test`).
#![allow(dead_code)]

use jobwarden::broker::{Broker, Lane};
use jobwarden::config::Config;
use jobwarden::store::Store;
pub mod completions;
pub mod evidence;
pub mod generators;
pub mod keyed;
#[path = "../../src/bin/jobwarden/testkit.rs"]
pub mod testkit;
pub mod tools;

use jobwarden::worker::{RunningWorker, Stats, Worker};
use jobwarden::Handler;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use testkit::{unique_name, NatsServer};
use tokio_util::sync::CancellationToken;

pub fn test_database_url() -> String {
    std::env::var("JOBWARDEN_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

pub fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,jobwarden=info".into()),
        )
        .with_test_writer()
        .try_init();
}

pub struct TestEnv {
    /// The nats-server; in a cluster ([`TestEnv::on_nats_cluster`]), its first server.
    pub nats: NatsServer,
    /// The cluster's other servers (none for a single server).
    pub nats_peers: Vec<NatsServer>,
    pub config: Config,
    pub store: Store,
    pub broker: Broker,
}

impl TestEnv {
    /// Starts a nats-server, migrates a fresh schema and parses `queues_toml` (queue sections
    /// and anything else) on top of test-friendly defaults.
    pub async fn new(extra_toml: &str) -> TestEnv {
        TestEnv::with_database(&test_database_url(), extra_toml).await
    }

    /// Like [`TestEnv::new`] against another PostgreSQL (a throwaway cluster).
    pub async fn with_database(database_url: &str, extra_toml: &str) -> TestEnv {
        TestEnv::with_servers(database_url, "", "", extra_toml).await
    }

    /// Like [`TestEnv::new`] with extra nats-server settings (e.g. `max_payload: 8192`).
    pub async fn with_nats_conf(nats_conf: &str, extra_toml: &str) -> TestEnv {
        TestEnv::with_servers(&test_database_url(), nats_conf, "", extra_toml).await
    }

    /// The most general form: a PostgreSQL URL, extra nats-server settings, extra lines for
    /// the `[nats]` section (authentication, TLS), and the rest of the configuration.
    pub async fn with_servers(
        database_url: &str,
        nats_conf: &str,
        nats_toml: &str,
        extra_toml: &str,
    ) -> TestEnv {
        init_logs();
        let nats = NatsServer::start_with_conf(nats_conf).expect("start nats-server");
        TestEnv::assemble(vec![nats], database_url, nats_toml, extra_toml).await
    }

    /// Like [`TestEnv::with_database`] on a JetStream cluster of three servers, named to
    /// every client by their seed list, with the stream kept in three copies.
    pub async fn on_nats_cluster(database_url: &str, extra_toml: &str) -> TestEnv {
        init_logs();
        let nodes = NatsServer::start_cluster(3).expect("start a nats-server cluster");
        TestEnv::assemble(nodes, database_url, "replicas = 3", extra_toml).await
    }

    async fn assemble(
        mut nodes: Vec<NatsServer>,
        database_url: &str,
        nats_toml: &str,
        extra_toml: &str,
    ) -> TestEnv {
        let schema = unique_name("t");
        let text = format!(
            "[database]\nurl = \"{}\"\nschema = \"{schema}\"\n\
             [nats]\nurl = \"{}\"\n{nats_toml}\n\
             [worker]\napi_listen = \"127.0.0.1:0\"\nops_listen = \"127.0.0.1:0\"\nhostname = \"test\"\nscheduler_every = \"50ms\"\n\
             {extra_toml}",
            database_url,
            NatsServer::seed_list(&nodes)
        );
        let config = Config::from_toml(&text).expect("test config");
        let store = Store::connect(&config.database).await.expect("connect db");
        store.migrate().await.expect("migrate");
        // A cluster's JetStream answers once its servers have elected a meta leader.
        let patience = Instant::now() + Duration::from_secs(if nodes.len() > 1 { 30 } else { 0 });
        let broker = loop {
            let ready = async {
                let broker = Broker::connect(&config.nats).await?;
                broker.provision_stream().await?;
                for q in config.queues.keys() {
                    for lane in Lane::all(q) {
                        broker.provision_consumer(&lane).await?;
                    }
                }
                Ok::<_, jobwarden::broker::BrokerError>(broker)
            };
            match ready.await {
                Ok(broker) => break broker,
                Err(e) if Instant::now() < patience => {
                    tracing::debug!("JetStream not ready yet: {e}");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(e) => panic!("NATS at {}: {e}", config.nats.url),
            }
        };
        let nats = nodes.remove(0);
        TestEnv {
            nats,
            nats_peers: nodes,
            config,
            store,
            broker,
        }
    }

    /// Every nats-server of this environment (one, or a cluster's).
    pub fn nats_servers(&mut self) -> impl Iterator<Item = &mut NatsServer> {
        std::iter::once(&mut self.nats).chain(self.nats_peers.iter_mut())
    }

    /// The Rust client on this environment's servers.
    pub fn client(&self) -> jobwarden::client::Client {
        jobwarden::client::Client::new(self.store.clone(), self.broker.clone())
    }

    /// Starts a worker with the given Rust handlers registered by name.
    pub async fn worker(&self, handlers: &[(&str, Arc<dyn Handler>)]) -> RunningWorker {
        self.worker_with(self.config.clone(), handlers).await
    }

    pub async fn worker_with(
        &self,
        config: Config,
        handlers: &[(&str, Arc<dyn Handler>)],
    ) -> RunningWorker {
        let mut w = Worker::new(config);
        for (name, h) in handlers {
            w = w.rust_handler(name, h.clone());
        }
        w.start(CancellationToken::new())
            .await
            .expect("worker start")
    }

    /// Publishes a raw body to `jobs.<queue>` like any producer with a plain NATS client.
    pub async fn publish_raw(&self, queue: &str, body: impl Into<Vec<u8>>) {
        self.broker
            .js
            .publish(format!("jobs.{queue}"), body.into().into())
            .await
            .expect("publish")
            .await
            .expect("publish ack");
    }

    /// Publishes `n` jobs `<prefix>-<i>` whose payload `{"hold": true}` makes
    /// [`RecordingApp`] hold them until released; returns their ids.
    pub async fn publish_held(&self, prefix: &str, n: usize) -> Vec<String> {
        let mut ids = Vec::new();
        for i in 0..n {
            let id = format!("{prefix}-{i}");
            self.publish_raw(
                "work",
                format!(r#"{{"id":"{id}","payload":{{"hold":true}}}}"#),
            )
            .await;
            ids.push(id);
        }
        ids
    }

    /// When worker `id` last beat, as the database recorded it.
    pub async fn heartbeat_at(&self, id: &str) -> std::time::SystemTime {
        let c = self.store.raw().await.unwrap();
        c.query_one("SELECT heartbeat_at FROM workers WHERE id = $1", &[&id])
            .await
            .unwrap()
            .get(0)
    }

    /// Waits (up to `secs`) for worker `id`'s next beat; returns whether it came.
    pub async fn wait_for_beat(&self, id: &str, secs: u64) -> bool {
        let first = self.heartbeat_at(id).await;
        wait_for(Duration::from_secs(secs), || async {
            self.heartbeat_at(id).await != first
        })
        .await
    }

    /// Creates the stream and `queue`'s bare consumer again under `config`'s NATS settings
    /// (another `ack_wait`, say), the old stream deleted first.
    pub async fn reprovision(&self, config: &jobwarden::config::Config, queue: &str) {
        self.broker
            .js
            .delete_stream(&config.nats.stream)
            .await
            .unwrap();
        let broker = jobwarden::broker::Broker::connect(&config.nats)
            .await
            .unwrap();
        broker.provision_stream().await.unwrap();
        broker
            .provision_consumer(&jobwarden::broker::Lane::bare(queue))
            .await
            .unwrap();
    }

    /// The one `int8` an SQL statement returns (e.g. a count).
    pub async fn scalar(&self, sql: &str) -> i64 {
        self.store
            .raw()
            .await
            .unwrap()
            .query_one(sql, &[])
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .get(0)
    }

    /// Count of jobs with `status`.
    pub async fn count(&self, status: &str) -> i64 {
        let c = self.store.raw().await.unwrap();
        c.query_one("SELECT count(*) FROM jobs WHERE status = $1", &[&status])
            .await
            .unwrap()
            .get(0)
    }

    pub async fn status_of(&self, id: &str) -> Option<String> {
        self.store.job_get(id).await.unwrap().map(|j| j.status)
    }

    /// The first column of `sql`'s rows, as text (for answers and failure messages).
    pub async fn strings(&self, sql: &str) -> Vec<String> {
        let c = self.store.raw().await.unwrap();
        c.query(sql, &[])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    }

    /// Waits up to `secs` for `n` jobs with `status`.
    pub async fn wait_count(&self, status: &str, n: i64, secs: u64) -> bool {
        wait_for(Duration::from_secs(secs), || async {
            self.count(status).await == n
        })
        .await
    }

    /// Waits up to `secs` for job `id` to reach `status`.
    pub async fn wait_status(&self, id: &str, status: &str, secs: u64) -> bool {
        wait_for(Duration::from_secs(secs), || async {
            self.status_of(id).await.as_deref() == Some(status)
        })
        .await
    }

    /// Runs the `jobwarden` binary against this environment's schema and servers.
    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        run_cli(
            args,
            &[
                ("JOBWARDEN_DATABASE__URL", &test_database_url()),
                ("JOBWARDEN_DATABASE__SCHEMA", &self.config.database.schema),
                ("JOBWARDEN_NATS__URL", &self.nats.url()),
            ],
        )
    }

    /// Enqueues job `id` of `queue` through PostgreSQL (the Rust client), as a producer that
    /// names its jobs would.
    pub async fn enqueue_id(
        &self,
        queue: &str,
        id: &str,
        payload: serde_json::Value,
    ) -> Result<jobwarden::store::Enqueued, jobwarden::client::ClientError> {
        jobwarden::client::Client::new(self.store.clone(), self.broker.clone())
            .enqueue(
                queue,
                payload,
                jobwarden::client::EnqueueOptions {
                    id: Some(id.to_string()),
                    ..Default::default()
                },
            )
            .await
    }

    /// Claims the plain job `id` of queue `work` as worker `worker` (registered here), as
    /// another pod's claim would.
    pub async fn claim_as(
        &self,
        worker: &str,
        id: &str,
        stale_after: Duration,
    ) -> jobwarden::store::ClaimAnswer {
        self.register_other(worker).await;
        self.store
            .job_claim(worker, stale_after, None, &[claim_input(id)])
            .await
            .unwrap()
    }

    /// The claim's fast path (`job_claim_new.sql`) for `ids` of queue work, as `worker`.
    pub async fn claim_new_as(
        &self,
        worker: &str,
        ids: &[&str],
    ) -> Vec<Option<jobwarden::store::Claim>> {
        self.register_other(worker).await;
        let inputs: Vec<_> = ids.iter().map(|id| claim_input(id)).collect();
        self.store
            .job_claim_new(worker, Duration::from_secs(60), &inputs)
            .await
            .unwrap()
    }

    /// Registers `worker` as a live worker of another pod.
    pub async fn register_other(&self, worker: &str) {
        let c = self.store.raw().await.unwrap();
        c.execute(
            "INSERT INTO workers (id, hostname, pid, version) VALUES ($1, 'other', 1, 'test') \
             ON CONFLICT DO NOTHING",
            &[&worker],
        )
        .await
        .unwrap();
    }

    /// Messages the queue's consumers still hold (not yet delivered + delivered, unacked),
    /// over all its lanes.
    pub async fn consumer_backlog(&self, queue: &str) -> (u64, usize) {
        let (mut pending, mut unacked) = (0, 0);
        for lane in Lane::all(queue) {
            let mut c = self.broker.consumer(&lane).await.unwrap();
            let info = c.info().await.unwrap();
            pending += info.num_pending;
            unacked += info.num_ack_pending;
        }
        (pending, unacked)
    }

    /// Waits until the consumer has nothing pending or unacked.
    pub async fn wait_consumer_drained(&self, queue: &str) {
        let drained = wait_for(Duration::from_secs(20), || async {
            self.consumer_backlog(queue).await == (0, 0)
        })
        .await;
        let last = self.consumer_backlog(queue).await;
        assert!(
            drained,
            "consumer {queue} still holds (pending, ack_pending) = {last:?}"
        );
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        // Drop the schema on a runtime (and connection) of its own: Drop cannot await, and the
        // pool's connections are driven by the test's runtime, which is blocked here.
        let db = self.config.database.clone();
        let _ = std::thread::spawn(move || {
            tokio::runtime::Runtime::new().unwrap().block_on(async {
                // Bounded: a test that panicked may have frozen its worker mid-transaction
                // (its runtime is blocked here); the schema is then left behind.
                let dropped = tokio::time::timeout(Duration::from_secs(10), async {
                    match Store::connect(&db).await {
                        Ok(store) => store.drop_schema().await.is_ok(),
                        Err(_) => false,
                    }
                })
                .await;
                if !matches!(dropped, Ok(true)) {
                    eprintln!("test schema {} was not dropped", db.schema);
                }
            })
        })
        .join();
    }
}

/// Polls `cond` every 20 ms until it holds or `limit` passes; returns whether it held.
pub async fn wait_for<F, Fut>(limit: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if cond().await {
            return true;
        }
        if start.elapsed() > limit {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn stat(c: &std::sync::atomic::AtomicU64) -> u64 {
    Stats::get(c)
}

/// A `jobwarden run` child process with a fixed hostname, like a StatefulSet pod.
pub struct ChildWorker {
    pub child: std::process::Child,
    pub hostname: String,
    _config: std::path::PathBuf,
}

impl ChildWorker {
    /// Starts `jobwarden run` with `config` (written to a temp file) as `hostname`.
    pub fn spawn(config: &Config, hostname: &str) -> ChildWorker {
        ChildWorker::spawn_with(config, hostname, None, &[])
    }

    /// Like [`ChildWorker::spawn`], with the process's log (stderr, at `warn`) written to
    /// `log`.
    pub fn spawn_logged(config: &Config, hostname: &str, log: &std::path::Path) -> ChildWorker {
        ChildWorker::spawn_with(config, hostname, Some(log), &[])
    }

    /// Like [`ChildWorker::spawn_logged`], with extra environment variables (they override
    /// the ones set here, `RUST_LOG` included).
    pub fn spawn_with_env(
        config: &Config,
        hostname: &str,
        log: &std::path::Path,
        envs: &[(&str, &str)],
    ) -> ChildWorker {
        ChildWorker::spawn_with(config, hostname, Some(log), envs)
    }

    fn spawn_with(
        config: &Config,
        hostname: &str,
        log: Option<&std::path::Path>,
        envs: &[(&str, &str)],
    ) -> ChildWorker {
        let path = std::env::temp_dir().join(format!(
            "jobwarden-{}-{hostname}-{:08x}.toml",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::write(&path, config.to_redacted_toml()).unwrap();
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_jobwarden"));
        cmd.args(["--config", path.to_str().unwrap(), "run"])
            .env("JOBWARDEN_WORKER__HOSTNAME", hostname)
            .env(
                "RUST_LOG",
                std::env::var("CHILD_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .envs(envs.iter().copied())
            .stdin(std::process::Stdio::null());
        if let Some(log) = log {
            cmd.stderr(std::fs::File::create(log).expect("create the worker's log file"));
        }
        let child = cmd.spawn().expect("spawn jobwarden run");
        ChildWorker {
            child,
            hostname: hostname.into(),
            _config: path,
        }
    }

    pub fn pid(&self) -> nix::unistd::Pid {
        nix::unistd::Pid::from_raw(self.child.id() as i32)
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        let _ = nix::sys::signal::kill(self.pid(), sig);
    }

    pub fn kill9(&mut self) {
        self.signal(nix::sys::signal::Signal::SIGKILL);
        let _ = self.child.wait();
    }

    /// SIGKILL without reaping: the process stays a zombie until this handle is dropped,
    /// as after `kill -9` from a shell whose parent has not waited for it yet.
    pub fn kill9_leaving_zombie(&mut self) {
        self.signal(nix::sys::signal::Signal::SIGKILL);
    }

    /// Waits for the process to exit, up to `limit`; returns its exit code.
    pub async fn wait_exit(&mut self, limit: Duration) -> Option<i32> {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Some(s) = self.child.try_wait().unwrap() {
                return Some(s.code().unwrap_or(-1));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }
}

impl Drop for ChildWorker {
    fn drop(&mut self) {
        self.signal(nix::sys::signal::Signal::SIGCONT);
        self.signal(nix::sys::signal::Signal::SIGKILL);
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self._config);
    }
}

/// Releases every job `app` holds, waits until the jobs `ids` have completed, and checks that
/// each ended with the attempt history `history` (e.g. `["owner_dead", "completed"]`).
pub async fn release_and_expect(
    env: &TestEnv,
    app: &RecordingApp,
    ids: &[String],
    history: &[&str],
) {
    app.release();
    assert!(
        env.wait_count("completed", ids.len() as i64, 10).await,
        "the released jobs did not complete: {} of {}",
        env.count("completed").await,
        ids.len()
    );
    for id in ids {
        assert_eq!(outcomes(&env.store, id).await, history, "{id}");
    }
}

/// One start of a job seen by [`RecordingApp`].
#[derive(Debug, Clone)]
pub struct Start {
    pub id: String,
    pub attempt: u64,
    pub worker: String,
    pub at: Instant,
    /// The progress URL the worker gave this attempt.
    pub progress_url: String,
}

/// One run of a job in [`RecordingApp`]: from the request's arrival until the app answered
/// or the worker went away (the request was dropped).
#[derive(Debug, Clone)]
pub struct Run {
    pub id: String,
    pub attempt: u64,
    pub worker: String,
    pub start: Instant,
    pub end: Instant,
    pub answered: bool,
}

/// Aborts a task when dropped.
struct AbortOnDrop(Option<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(t) = &self.0 {
            t.abort();
        }
    }
}

/// Records a run when the request's future ends, answered or dropped.
struct RunGuard {
    runs: Arc<std::sync::Mutex<Vec<Run>>>,
    run: Option<Run>,
}

impl Drop for RunGuard {
    fn drop(&mut self) {
        if let Some(mut run) = self.run.take() {
            run.end = Instant::now();
            self.runs.lock().unwrap().push(run);
        }
    }
}

/// A local application for the http handler that records every start and every answer.
/// Each answer is a receipt, `{"worker": <worker id>, "attempt": <n>}`, which becomes the job's
/// result. Payload `{"ms": N}` answers after N ms; `{"hold": true}` answers only after
/// [`RecordingApp::release`] (or never, for a job whose worker dies first); `{"chatty": true}`
/// reports progress every 5 ms while it runs; `{"fail_first": true}` fails its first attempt
/// with a 500 (a retry), after its `ms`.
pub struct RecordingApp {
    pub url: String,
    pub starts: Arc<std::sync::Mutex<Vec<Start>>>,
    /// Every run that ended (answered, or dropped because the worker went away).
    pub runs: Arc<std::sync::Mutex<Vec<Run>>>,
    /// (id, attempt, worker) of every 200 answered.
    pub answered: Arc<std::sync::Mutex<Vec<(String, u64, String)>>>,
    release: Arc<tokio::sync::Notify>,
    released: Arc<std::sync::atomic::AtomicBool>,
}

impl RecordingApp {
    pub async fn start() -> RecordingApp {
        use std::sync::atomic::AtomicBool;
        let starts = Arc::new(std::sync::Mutex::new(Vec::new()));
        let runs = Arc::new(std::sync::Mutex::new(Vec::new()));
        let answered = Arc::new(std::sync::Mutex::new(Vec::new()));
        let release = Arc::new(tokio::sync::Notify::new());
        let released = Arc::new(AtomicBool::new(false));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (s, a, r, rd, rn) = (
            starts.clone(),
            answered.clone(),
            release.clone(),
            released.clone(),
            runs.clone(),
        );
        let app = axum::Router::new().route(
            "/jobs",
            axum::routing::post(
                move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                    let (s, a, r, rd, rn) =
                        (s.clone(), a.clone(), r.clone(), rd.clone(), rn.clone());
                    async move {
                        let job: serde_json::Value = serde_json::from_slice(&body).unwrap();
                        let id = job["id"].as_str().unwrap().to_string();
                        let attempt = job["attempt"].as_u64().unwrap();
                        let worker = headers
                            .get("x-jobwarden-worker")
                            .map(|v| v.to_str().unwrap().to_string())
                            .unwrap_or_default();
                        let now = Instant::now();
                        s.lock().unwrap().push(Start {
                            id: id.clone(),
                            attempt,
                            worker: worker.clone(),
                            at: now,
                            progress_url: job["progress_url"].as_str().unwrap_or("").into(),
                        });
                        let mut guard = RunGuard {
                            runs: rn,
                            run: Some(Run {
                                id: id.clone(),
                                attempt,
                                worker: worker.clone(),
                                start: now,
                                end: now,
                                answered: false,
                            }),
                        };
                        // Chatty jobs report progress every 5 ms while they run (each
                        // report is a fenced write and an in-progress ack).
                        let chatty = job["payload"]["chatty"] == serde_json::json!(true);
                        let reporter = chatty.then(|| {
                            let url = job["progress_url"].as_str().unwrap_or("").to_string();
                            tokio::spawn(async move {
                                let http = reqwest::Client::new();
                                loop {
                                    let _ = http
                                        .post(&url)
                                        .header("content-type", "application/json")
                                        .body(r#"{"stage":"chatty"}"#)
                                        .send()
                                        .await;
                                    tokio::time::sleep(Duration::from_millis(5)).await;
                                }
                            })
                        });
                        let _stop_reporter = AbortOnDrop(reporter);
                        if job["payload"]["hold"] == serde_json::json!(true) {
                            while !rd.load(std::sync::atomic::Ordering::SeqCst) {
                                let notified = r.notified();
                                if rd.load(std::sync::atomic::Ordering::SeqCst) {
                                    break;
                                }
                                notified.await;
                            }
                        }
                        if let Some(ms) = job["payload"]["ms"].as_u64() {
                            tokio::time::sleep(Duration::from_millis(ms)).await;
                        }
                        // `{"fail_first": true}`: the first attempt fails (a retry).
                        if job["payload"]["fail_first"] == serde_json::json!(true) && attempt == 1 {
                            return (
                                axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                                axum::Json(serde_json::json!({"error": "first attempt fails"})),
                            );
                        }
                        // The answer is a receipt naming this run: the job's result then
                        // says whose answer was settled (see completions.rs).
                        let receipt = serde_json::json!({ "worker": worker, "attempt": attempt });
                        a.lock().unwrap().push((id, attempt, worker));
                        if let Some(run) = guard.run.as_mut() {
                            run.answered = true;
                        }
                        drop(guard);
                        (axum::http::StatusCode::OK, axum::Json(receipt))
                    }
                },
            ),
        );
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        RecordingApp {
            url: format!("http://{addr}/jobs"),
            starts,
            runs,
            answered,
            release,
            released,
        }
    }

    /// Lets every held request (now and later) answer.
    pub fn release(&self) {
        self.released
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.release.notify_waiters();
    }

    pub fn starts_of(&self, id: &str) -> Vec<Start> {
        self.starts
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.id == id)
            .cloned()
            .collect()
    }

    pub fn start_count(&self) -> usize {
        self.starts.lock().unwrap().len()
    }
}

/// Leaves messages (`bodies`, published to `jobs.work`) delivered to a worker that dies
/// before claiming them: a worker started with `config` waits for work, then receives them
/// and blocks on a lock held on `jobs`; it is killed with SIGKILL, its blocked statement is
/// ended (so it never commits), and the lock goes.
pub async fn strand_in_a_killed_worker(env: &TestEnv, config: &Config, bodies: &[String]) {
    let mut a = ChildWorker::spawn(config, "pod-a");
    // Started (its connections warmed, which the lock below would hold up) and pulling.
    let pulling = || async {
        let lane = jobwarden::broker::Lane::bare("work");
        let mut c = env.broker.consumer(&lane).await.unwrap();
        c.info().await.is_ok_and(|i| i.num_waiting > 0)
    };
    assert!(
        wait_for(Duration::from_secs(20), pulling).await,
        "the worker never pulled"
    );
    let mut locker = env.store.raw().await.unwrap();
    let tx = locker.transaction().await.unwrap();
    tx.batch_execute("LOCK TABLE jobs IN SHARE MODE")
        .await
        .unwrap();
    for body in bodies {
        env.publish_raw("work", body.as_str()).await;
    }
    let n = bodies.len();
    let c = env.store.raw().await.unwrap();
    let waiting = || async {
        let n: i64 = c
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE application_name = 'jobwarden' AND wait_event_type = 'Lock'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        n
    };
    assert!(
        wait_for(Duration::from_secs(20), || async {
            waiting().await > 0 && env.consumer_backlog("work").await == (0, n)
        })
        .await,
        "the worker never received them all and tried to claim"
    );
    a.kill9();
    c.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE application_name = 'jobwarden' AND wait_event_type = 'Lock'",
        &[],
    )
    .await
    .unwrap();
    tx.rollback().await.unwrap();
}

/// A handler that records every job id it is given, and fails the jobs named `fail-*`
/// (retryable).
pub fn recording() -> (Arc<dyn Handler>, Arc<std::sync::Mutex<Vec<String>>>) {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let s = seen.clone();
    let h = jobwarden::handler::from_fn(move |job| {
        let s = s.clone();
        async move {
            s.lock().unwrap().push(job.id.clone());
            if job.id.starts_with("fail-") {
                return Err(jobwarden::handler::JobError::retry("failing on purpose"));
            }
            if job.id.starts_with("slow-") {
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            Ok(None)
        }
    });
    (h, seen)
}

/// A claim input for a job `id` of queue work with an empty payload.
fn claim_input(id: &str) -> jobwarden::store::ClaimInput {
    jobwarden::store::ClaimInput {
        job: jobwarden::job::NewJob::plain(id.into(), "work".into(), serde_json::json!({})),
        max_attempts: 3,
        traceparent: None,
    }
}

/// Outcomes recorded in job_attempts for `id`, in order.
pub async fn outcomes(store: &Store, id: &str) -> Vec<String> {
    store
        .job_attempts(id)
        .await
        .unwrap()
        .into_iter()
        .map(|a| a.outcome)
        .collect()
}

/// Enqueue options that name the job's id.
pub fn with_id(id: &str) -> jobwarden::client::EnqueueOptions {
    jobwarden::client::EnqueueOptions {
        id: Some(id.into()),
        ..Default::default()
    }
}

/// Runs the `jobwarden` binary with extra environment variables and no standard input.
pub fn run_cli(args: &[&str], envs: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_jobwarden"));
    cmd.args(args).stdin(std::process::Stdio::null());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.output().expect("run jobwarden")
}

/// Standard output and error of a finished command, as text.
pub fn text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A handler that does what the payload's `kind` says: `flaky` fails its first attempt (a
/// retry), `bad` fails for good (dead), anything else completes.
pub fn by_kind() -> Arc<dyn Handler> {
    jobwarden::handler::from_fn(|job| async move {
        match job.payload["kind"].as_str() {
            Some("flaky") if job.attempt == 1 => {
                Err(jobwarden::handler::JobError::retry("try again"))
            }
            Some("bad") => Err(jobwarden::handler::JobError::permanent("bad input")),
            _ => Ok(None),
        }
    })
}

/// A worker's `/metrics` text (its ops port).
pub async fn metrics(w: &jobwarden::worker::RunningWorker) -> String {
    reqwest::get(format!("http://{}/metrics", w.ops_addr.unwrap()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}
