//! Configuration: a TOML file layered under `JOBWARDEN_…` environment variables, turned into
//! a typed [`Config`] and validated once, at start-up, with every problem reported at once.
//!
//! Environment variables use `__` between levels: `JOBWARDEN_DATABASE__URL`,
//! `JOBWARDEN_WORKER__HOSTNAME`, `JOBWARDEN_QUEUES__EMAIL__CONCURRENCY`.
//! See `docs/configuration.md` and `examples/jobwarden.toml`.

use crate::backoff::Backoff;
use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

mod load;
mod retention;
pub mod telemetry;
mod values;
pub use retention::{Policy, QueueKeep, RetentionConfig, FINISHED};
pub use values::{KeepFor, KeyFrom, Listen, ListenAddr, RateLimit};

pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";
pub const DEFAULT_SCHEMA: &str = "jobwarden";
pub const DEFAULT_POOL_SIZE: usize = 16;
pub const DEFAULT_NATS_URL: &str = "nats://127.0.0.1:4222";
pub const DEFAULT_STREAM: &str = "JOBS";
pub const DEFAULT_SUBJECT_PREFIX: &str = "jobs";
pub const DEFAULT_ACK_WAIT: Duration = Duration::from_secs(600);
pub const DEFAULT_DUPLICATE_WINDOW: Duration = Duration::from_secs(120);
pub const DEFAULT_MAX_ACK_PENDING: i64 = 20_000;
pub const DEFAULT_API_LISTEN: ListenAddr = ListenAddr(std::net::SocketAddr::V4(
    std::net::SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, 7433),
));
/// Where Prometheus and the kubelet reach a worker (`/metrics`, `/livez`, `/readyz`).
pub const DEFAULT_OPS_LISTEN: Listen = Listen::At(ListenAddr(std::net::SocketAddr::V4(
    std::net::SocketAddrV4::new(std::net::Ipv4Addr::UNSPECIFIED, 7434),
)));
pub const DEFAULT_HEARTBEAT_EVERY: Duration = Duration::from_secs(5);
pub const DEFAULT_STALE_AFTER: Duration = Duration::from_secs(300);
pub const DEFAULT_SWEEP_EVERY: Duration = Duration::from_secs(30);
pub const DEFAULT_DEAD_AFTER: Duration = Duration::from_secs(15);
pub const DEFAULT_REAP_EVERY: Duration = Duration::from_secs(1);
pub const DEFAULT_BROKER_LOST_AFTER: Duration = Duration::from_secs(15);
pub const DEFAULT_SCHEDULER_EVERY: Duration = Duration::from_millis(250);
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
/// What a drain needs beyond `worker.shutdown_grace`: up to 10 s to stop and release the jobs
/// still running, up to 10 s for the last settles, and 10 s of margin. A pod's
/// `terminationGracePeriodSeconds` must cover both, plus the application's own stop time.
pub const DRAIN_OVERHEAD: Duration = Duration::from_secs(30);
/// The pod's `terminationGracePeriodSeconds`, as the manifests pass it to the sidecar (the
/// downward API cannot): the worker warns at start-up when `shutdown_grace` does not fit.
pub const TERMINATION_GRACE_ENV: &str = "JOBWARDEN_POD_TERMINATION_GRACE_SECONDS";
pub use crate::contract::DEFAULT_MAX_PAYLOAD_BYTES;
pub const DEFAULT_CLAIM_BATCH: usize = 256;
pub const DEFAULT_PULL_MAX_BYTES: usize = 8 * 1024 * 1024;
pub const DEFAULT_ADOPT_AFTER: Duration = Duration::from_secs(5);
pub const DEFAULT_UNSERVED_GRACE: Duration = Duration::from_secs(3600);
/// After a drain asked for through the API, how long the worker waits for a stop signal
/// before it exits by itself: longer than a pod's termination (its preStop drain, then the
/// application's stop, then SIGTERM; 120 s in `k8s/`).
pub const DEFAULT_DRAINED_EXIT_AFTER: Duration = Duration::from_secs(300);
/// Dead-letter events go to `<EVENTS_PREFIX>.dead.<queue>` (core NATS, outside the stream).
pub const EVENTS_PREFIX: &str = "jobwarden";
pub const DEFAULT_CONCURRENCY: usize = 10;
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
pub const DEFAULT_MAX_ATTEMPTS: u32 = 5;

/// The whole configuration. Every field has a default, so an empty file is valid except that
/// at least one queue must be named.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub database: DatabaseConfig,
    pub nats: NatsConfig,
    pub worker: WorkerConfig,
    /// The handler used by queues that name none.
    pub handler: Option<HandlerConfig>,
    pub queues: BTreeMap<String, QueueConfig>,
    /// Named cron schedules; every worker runs them, each fire is enqueued once.
    pub cron: BTreeMap<String, crate::cron::CronConfig>,
    pub dashboard: DashboardConfig,
    /// How long finished jobs and rows are kept (pruned by one worker at a time).
    pub retention: RetentionConfig,
    /// OpenTelemetry over OTLP (off unless an endpoint is set, here or by `OTEL_*`).
    pub telemetry: telemetry::TelemetryConfig,
}

/// The web dashboard a worker can serve. Off unless `listen` is set.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DashboardConfig {
    /// Address to serve it on, e.g. `127.0.0.1:7435` (port 0 picks a free one).
    pub listen: Option<ListenAddr>,
    /// With a token, those who give it may retry and discard jobs; without, the dashboard
    /// is read-only. Its actions are recorded as done by `dashboard:admin`.
    pub admin_token: Option<String>,
    /// More admin tokens, by name (`alice = "…"`): actions are recorded as done by
    /// `dashboard:<name>` (bulk actions, pauses), so each person or program can have its own.
    pub admin_tokens: std::collections::BTreeMap<String, String>,
}

impl DashboardConfig {
    /// Every admin token with the name its actions are recorded under (`admin_token` is
    /// `admin`).
    pub fn named_admin_tokens(&self) -> Vec<(&str, &str)> {
        let mut all: Vec<(&str, &str)> = self
            .admin_token
            .iter()
            .map(|t| ("admin", t.as_str()))
            .collect();
        all.extend(
            self.admin_tokens
                .iter()
                .map(|(n, t)| (n.as_str(), t.as_str())),
        );
        all
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DatabaseConfig {
    pub url: String,
    /// Schema holding jobwarden's tables; several installations can share one database.
    pub schema: String,
    pub pool_size: usize,
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NatsConfig {
    /// The server, or the servers of a cluster: one URL, several separated by commas
    /// (`nats://n1:4222,nats://n2:4222`), or a TOML list of them (kept here joined by
    /// commas). The client joins one and learns the rest of the cluster from it.
    #[serde(deserialize_with = "values::one_or_list")]
    pub url: String,
    /// Authentication: one of a credentials file (JWT + nkey), an nkey seed file, a token,
    /// or a user and password.
    pub credentials_file: Option<String>,
    pub nkey_seed_file: Option<String>,
    pub token: Option<String>,
    pub user: Option<String>,
    pub password: Option<String>,
    /// TLS: the CA that signed the server's certificate (PEM; default: the system store),
    /// a client certificate and key for servers that verify clients, and whether TLS is
    /// required even when the server does not ask for it (`tls://` URLs require it).
    pub tls_ca_file: Option<String>,
    pub tls_cert_file: Option<String>,
    pub tls_key_file: Option<String>,
    pub tls_required: bool,
    pub stream: String,
    /// Jobs are published to `<subject_prefix>.<queue>`.
    pub subject_prefix: String,
    /// Create or update the stream and consumers at start (turn off when an operator or the
    /// NACK controller provisions them).
    pub provision: bool,
    #[serde(with = "humantime_serde")]
    pub ack_wait: Duration,
    #[serde(with = "humantime_serde")]
    pub duplicate_window: Duration,
    pub max_ack_pending: i64,
    /// Copies JetStream keeps of the stream when this worker creates it (a cluster: 3).
    pub replicas: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkerConfig {
    /// Overrides the machine's hostname in the worker id (pods, tests).
    pub hostname: Option<String>,
    /// Local API (progress reports, health). Port 0 picks a free one.
    pub api_listen: ListenAddr,
    /// Metrics and health for Prometheus and the kubelet (`/metrics`, `/livez`, `/readyz`),
    /// reachable from outside the pod; `"off"` serves them on `api_listen` only.
    pub ops_listen: Listen,
    #[serde(with = "humantime_serde")]
    pub heartbeat_every: Duration,
    #[serde(with = "humantime_serde")]
    pub stale_after: Duration,
    #[serde(with = "humantime_serde")]
    pub sweep_every: Duration,
    /// A worker whose heartbeat is older than this is dead: its jobs are reclaimed.
    #[serde(with = "humantime_serde")]
    pub dead_after: Duration,
    /// How often the heartbeat reaper looks for dead workers.
    #[serde(with = "humantime_serde")]
    pub reap_every: Duration,
    /// A `queued` job older than this, on a queue whose consumer has nothing left to
    /// deliver, lost its message and is republished.
    #[serde(with = "humantime_serde")]
    pub broker_lost_after: Duration,
    #[serde(with = "humantime_serde")]
    pub scheduler_every: Duration,
    #[serde(with = "humantime_serde")]
    pub shutdown_grace: Duration,
    pub max_payload_bytes: usize,
    /// Most messages claimed in one statement.
    pub claim_batch: usize,
    /// Most bytes one pull request may bring (never below the server's max_payload, or a
    /// message larger than the budget could never be delivered).
    pub pull_max_bytes: usize,
    /// A message delivered to a worker that stops before claiming it (killed, paused, or
    /// shut down with pull requests open) is adopted from the stream after this long
    /// without a row, instead of waiting out `nats.ack_wait`.
    #[serde(with = "humantime_serde")]
    pub adopt_after: Duration,
    /// Messages on a subject no pod serves (a queue whose workers are not deployed yet, a
    /// typo) wait this long, visible in `jobwarden stats`, before they become dead jobs that
    /// keep their payload.
    #[serde(with = "humantime_serde")]
    pub unserved_grace: Duration,
    /// A worker drained through the API (`POST /v1/drain`, the preStop hook) and then not
    /// stopped within this long exits (status 0), so its orchestrator starts it again: a
    /// drained worker takes no jobs while its liveness probe passes.
    #[serde(with = "humantime_serde")]
    pub drained_exit_after: Duration,
    /// Run migrations at start-up (under an advisory lock).
    pub migrate: bool,
}

/// How a queue's jobs reach the application.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum HandlerConfig {
    /// POST the job as JSON to a local URL.
    Http { url: String },
    /// Run a command per job: payload on stdin, progress as JSON lines on stdout.
    Exec {
        command: Vec<String>,
        #[serde(default)]
        env: BTreeMap<String, String>,
    },
    /// A Rust handler registered by a program that links jobwarden as a library.
    Rust { name: String },
}

impl HandlerConfig {
    /// Masks what may be a secret: an http handler URL's password and secret query
    /// parameters, and an exec handler's environment variables named like secrets
    /// (`API_TOKEN`, `DB_PASSWORD`).
    fn redact(&mut self) {
        match self {
            HandlerConfig::Http { url } => *url = crate::redact::url(url),
            HandlerConfig::Exec { env, .. } => {
                for (name, value) in env.iter_mut() {
                    if crate::redact::is_secret_name(name) {
                        *value = crate::redact::MASK.to_string();
                    }
                }
            }
            HandlerConfig::Rust { .. } => {}
        }
    }

    /// What [`HandlerConfig::redact`] masks, as values to scrub from text.
    fn secrets(&self, into: &mut crate::redact::Secrets) {
        match self {
            HandlerConfig::Http { url } => {
                into.add_url(url);
            }
            HandlerConfig::Exec { env, .. } => {
                for (name, value) in env {
                    if crate::redact::is_secret_name(name) {
                        into.add(value);
                    }
                }
            }
            HandlerConfig::Rust { .. } => {}
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QueueConfig {
    /// Jobs of this queue running at once in one worker.
    pub concurrency: usize,
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    pub max_attempts: u32,
    pub backoff: Backoff,
    /// Overrides worker.stale_after for this queue's jobs.
    #[serde(with = "humantime_serde", default)]
    pub stale_after: Option<Duration>,
    /// A job of this queue that carries no expiry of its own (`expires_at_ms`,
    /// `expires_in`) and is not started this long after it is enqueued never runs: it ends
    /// `cancelled` as expired. None by default.
    #[serde(with = "humantime_serde", default)]
    pub expire_after: Option<Duration>,
    /// Where this queue's messages carry their job's key when the envelope names none:
    /// `"payload:/customer/id"` (an RFC 6901 JSON pointer into the payload) or
    /// `"header:X-Customer"` (a NATS header). Messages only (SQL, the CLI, the Rust client
    /// and cron name the key itself). None by default.
    pub key_from: Option<KeyFrom>,
    /// Jobs of one key that come within this window collapse into the last one, which runs
    /// once the key has been quiet this long (`docs/configuration.md`). Keyed jobs only; a
    /// job's own `debounce`/`throttle` replaces it. None by default.
    #[serde(with = "humantime_serde", default)]
    pub debounce: Option<Duration>,
    /// A debounced job runs at the latest this long after the first of its collapsed jobs
    /// came, however busy its key (at least `debounce`). None: no bound.
    #[serde(with = "humantime_serde", default)]
    pub debounce_max_wait: Option<Duration>,
    /// At most one job of a key per window; the others end at once (`cancelled`,
    /// `throttled: ...`). Keyed jobs only; not with debounce. None by default.
    #[serde(with = "humantime_serde", default)]
    pub throttle: Option<Duration>,
    /// A job's idempotency key is held this long only (a job with the same key within it is
    /// the same job; after it, a new one). None by default: held for ever.
    #[serde(with = "humantime_serde", default)]
    pub unique_for: Option<Duration>,
    /// Priorities are strict by default (0 = none); with N, every Nth pull serves the
    /// lower-priority lanes that have work, in turn, so they never starve.
    pub fair_every: u32,
    /// Jobs of this queue running at once across every worker (none by default).
    pub global_concurrency: Option<u32>,
    /// Starts of this queue's jobs per window across every worker, e.g. "100/1m".
    #[serde(alias = "limit")]
    pub rate_limit: Option<RateLimit>,
    /// Jobs of one key (`key`) running at once across every worker (none by default). The
    /// queue's jobs are then parked in PostgreSQL as they arrive and started within their
    /// keys' limits: one key's backlog never holds up another key's jobs.
    pub key_concurrency: Option<u32>,
    /// Starts of one key's jobs per window across every worker, e.g. "5/1s" (never more in
    /// any window). Makes the queue keyed, like key_concurrency.
    pub key_rate_limit: Option<RateLimit>,
    /// Free slots go round the keys that have work, in turn (weighted by `key_limits`),
    /// instead of in publish order: a key with ten jobs is not held up by a key with ten
    /// thousand.
    pub fair_by_key: bool,
    /// Jobs of one key run one at a time, in the order they were published; a retry holds
    /// the key's later jobs until it completes (or dies: see `ordered_on_dead`).
    pub ordered_by_key: bool,
    /// In an ordered queue, what a dead job does to its key's later jobs: "block" (the
    /// default: they wait until it is retried or skipped) or "skip" (they go on).
    pub ordered_on_dead: OnDead,
    pub handler: Option<HandlerConfig>,
    /// Override `[retention]` for this queue's finished jobs.
    pub keep_completed: Option<KeepFor>,
    pub keep_cancelled: Option<KeepFor>,
    pub keep_dead: Option<KeepFor>,
    /// At most this many finished jobs of this queue kept, newest first.
    pub keep_count: Option<i64>,
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        DatabaseConfig {
            url: DEFAULT_DATABASE_URL.into(),
            schema: DEFAULT_SCHEMA.into(),
            pool_size: DEFAULT_POOL_SIZE,
            connect_timeout: Duration::from_secs(5),
        }
    }
}

impl NatsConfig {
    /// The servers of `url`, each checked: a NATS URL (`nats://` or `tls://`) with a host and
    /// a port the client can parse. The error names the server, by its place in the list
    /// when there are several, and says how to write one.
    pub fn servers(&self) -> Result<Vec<async_nats::ServerAddr>, String> {
        let given: Vec<&str> = self
            .url
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        if given.is_empty() {
            return Err(format!(
                "nats.url is empty; give the server's URL (e.g. \"{DEFAULT_NATS_URL}\"), or a \
                 cluster's servers separated by commas or as a list: \
                 [\"nats://n1:4222\", \"nats://n2:4222\"]"
            ));
        }
        let many = given.len() > 1;
        given
            .iter()
            .enumerate()
            .map(|(i, server)| {
                let which = if many {
                    format!(
                        "nats.url: server {} of {} ({:?})",
                        i + 1,
                        given.len(),
                        crate::redact::url(server)
                    )
                } else {
                    format!("nats.url {:?}", crate::redact::url(server))
                };
                if !server.starts_with("nats://") && !server.starts_with("tls://") {
                    return Err(format!(
                        "{which} must start with nats:// or tls://, e.g. nats://nats:4222{}",
                        if many {
                            "; separate servers with commas"
                        } else {
                            ""
                        }
                    ));
                }
                // The parser's words quote no part of the URL (the caller scrubs them anyway).
                server.parse::<async_nats::ServerAddr>().map_err(|e| {
                    format!("{which} is not a server address ({e}); write it as nats://host:port")
                })
            })
            .collect()
    }
}

impl Default for NatsConfig {
    fn default() -> Self {
        NatsConfig {
            url: DEFAULT_NATS_URL.into(),
            credentials_file: None,
            nkey_seed_file: None,
            token: None,
            user: None,
            password: None,
            tls_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
            tls_required: false,
            stream: DEFAULT_STREAM.into(),
            subject_prefix: DEFAULT_SUBJECT_PREFIX.into(),
            provision: true,
            ack_wait: DEFAULT_ACK_WAIT,
            duplicate_window: DEFAULT_DUPLICATE_WINDOW,
            max_ack_pending: DEFAULT_MAX_ACK_PENDING,
            replicas: 1,
        }
    }
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            hostname: None,
            api_listen: DEFAULT_API_LISTEN,
            ops_listen: DEFAULT_OPS_LISTEN,
            heartbeat_every: DEFAULT_HEARTBEAT_EVERY,
            stale_after: DEFAULT_STALE_AFTER,
            sweep_every: DEFAULT_SWEEP_EVERY,
            dead_after: DEFAULT_DEAD_AFTER,
            reap_every: DEFAULT_REAP_EVERY,
            broker_lost_after: DEFAULT_BROKER_LOST_AFTER,
            scheduler_every: DEFAULT_SCHEDULER_EVERY,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
            claim_batch: DEFAULT_CLAIM_BATCH,
            pull_max_bytes: DEFAULT_PULL_MAX_BYTES,
            adopt_after: DEFAULT_ADOPT_AFTER,
            unserved_grace: DEFAULT_UNSERVED_GRACE,
            drained_exit_after: DEFAULT_DRAINED_EXIT_AFTER,
            migrate: true,
        }
    }
}

/// How a keyed queue parks and takes its jobs, as this worker declares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyRules {
    /// At most this many jobs of one key run at once across all workers (`None`: no limit).
    pub concurrency: Option<u32>,
    /// Turns go round the keys with work (else publish order).
    pub fair: bool,
    /// One job of a key at a time, in publish order.
    pub ordered: bool,
    /// In an ordered queue, a dead job holds its key's later jobs back (else they go on).
    pub dead_blocks: bool,
    /// Starts of one key's jobs per window across all workers (`None`: no limit).
    pub rate: Option<RateLimit>,
}

/// What a dead job does to its key's later jobs in an ordered queue (`ordered_on_dead`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnDead {
    /// They wait until the dead job is retried (and completes) or skipped
    /// (`jobwarden keys skip`).
    #[default]
    Block,
    /// They go on; the dead job stays in the dead letters.
    Skip,
}

impl QueueConfig {
    /// The queue's debounce, throttle and unique_for, in whole milliseconds.
    pub fn gate(&self) -> crate::contract::Gate {
        let ms = |d: Option<Duration>| d.map(|d| d.as_millis().min(i64::MAX as u128) as i64);
        crate::contract::Gate {
            debounce_ms: ms(self.debounce),
            max_wait_ms: ms(self.debounce_max_wait),
            throttle_ms: ms(self.throttle),
            unique_for_ms: ms(self.unique_for),
        }
    }

    /// How the queue parks and takes its jobs by key (`None`: it is not keyed).
    pub fn key_rules(&self) -> Option<KeyRules> {
        (self.key_concurrency.is_some()
            || self.key_rate_limit.is_some()
            || self.fair_by_key
            || self.ordered_by_key)
            .then_some(KeyRules {
                concurrency: if self.ordered_by_key {
                    Some(1)
                } else {
                    self.key_concurrency
                },
                fair: self.fair_by_key,
                ordered: self.ordered_by_key,
                dead_blocks: self.ordered_on_dead == OnDead::Block,
                rate: self.key_rate_limit,
            })
    }
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            concurrency: DEFAULT_CONCURRENCY,
            timeout: DEFAULT_TIMEOUT,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            backoff: Backoff::default(),
            stale_after: None,
            expire_after: None,
            key_from: None,
            debounce: None,
            debounce_max_wait: None,
            throttle: None,
            unique_for: None,
            fair_every: 0,
            global_concurrency: None,
            rate_limit: None,
            key_concurrency: None,
            key_rate_limit: None,
            fair_by_key: false,
            ordered_by_key: false,
            ordered_on_dead: OnDead::Block,
            handler: None,
            keep_completed: None,
            keep_cancelled: None,
            keep_dead: None,
            keep_count: None,
        }
    }
}

/// Every problem found in a configuration, one per line.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration:\n  - {}", .0.join("\n  - "))]
pub struct ConfigErrors(pub Vec<String>);

/// Top-level sections an environment variable may set (others, like
/// `JOBWARDEN_TEST_DATABASE_URL` or `JOBWARDEN_CONFIG`, are not configuration).
/// Reads one environment variable (the process's, or a test's).
type EnvVar<'a> = &'a dyn Fn(&str) -> Option<String>;

const ENV_SECTIONS: [&str; 9] = [
    "database",
    "retention",
    "telemetry",
    "nats",
    "worker",
    "handler",
    "queues",
    "cron",
    "dashboard",
];

impl Config {
    /// Loads the file (if any) and the environment, then validates. `path` must exist when
    /// given.
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigErrors> {
        Config::load_with(path, true)
    }

    /// Like [`Config::load`], for commands that only need the connections (enqueue, jobs,
    /// migrate): queues are not required.
    pub fn load_connections(path: Option<&Path>) -> Result<Config, ConfigErrors> {
        Config::load_with(path, false)
    }

    fn load_with(path: Option<&Path>, require_queues: bool) -> Result<Config, ConfigErrors> {
        let mut fig = Figment::from(Serialized::defaults(Config::default()));
        if let Some(p) = path {
            if !p.exists() {
                return Err(ConfigErrors(vec![format!(
                    "configuration file {} does not exist; pass an existing file with --config \
                     (see examples/jobwarden.toml)",
                    p.display()
                )]));
            }
            fig = fig.merge(Toml::file(p));
        }
        let env = Env::prefixed("JOBWARDEN_").split("__").filter(|k| {
            // The key may or may not be split into a dotted path yet.
            let first = k.as_str().split("__").next().unwrap_or("");
            let first = first.split('.').next().unwrap_or("").to_ascii_lowercase();
            ENV_SECTIONS.contains(&first.as_str())
        });
        // Secrets and URLs are taken as written: figment reads other values like TOML, so
        // `JOBWARDEN_NATS__PASSWORD=00424242` would become the number 424242 (a type error
        // at best, a wrong password at worst).
        let verbatim: Vec<(String, String)> = env
            .iter()
            .filter(|(k, _)| is_verbatim(k.as_str()))
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        let mut fig = fig.merge(env.filter(|k| !is_verbatim(&k.as_str().replace("__", "."))));
        for (key, value) in verbatim {
            fig = fig.merge(Serialized::default(&key, value));
        }
        // The standard OpenTelemetry variables fill what the file left unset.
        let otel_env = |k: &str| std::env::var(k).ok();
        let loaded = Config::from_figment_with(fig, require_queues, Some(&otel_env));
        // The process hides these from its log lines and its last words (see redact.rs).
        if let Ok(c) = &loaded {
            crate::redact::remember(&c.secrets());
        }
        loaded
    }

    /// Parses a TOML string (no environment), then validates. For tests and embedders.
    pub fn from_toml(text: &str) -> Result<Config, ConfigErrors> {
        Config::from_figment(
            Figment::from(Serialized::defaults(Config::default())).merge(Toml::string(text)),
            true,
        )
    }

    fn from_figment(fig: Figment, require_queues: bool) -> Result<Config, ConfigErrors> {
        Config::from_figment_with(fig, require_queues, None)
    }

    fn from_figment_with(
        fig: Figment,
        require_queues: bool,
        otel_env: Option<EnvVar<'_>>,
    ) -> Result<Config, ConfigErrors> {
        let mut config: Config = load::extract_all(&fig).map_err(|errs| {
            // Whatever was given for a secret, even of the wrong type, stays out of the
            // messages (and of the log, should they be logged).
            let secrets = load::raw_secrets(&fig);
            crate::redact::remember(&secrets);
            ConfigErrors(
                errs.iter()
                    .map(|e| secrets.scrub(&load::describe_load_error(e)).into_owned())
                    .collect(),
            )
        })?;
        if let Some(var) = otel_env {
            config.telemetry.fill_from_env(var);
        }
        // A rule's message may quote a value (a URL, a connection string): never a secret.
        config
            .validate_with(require_queues)
            .map_err(|ConfigErrors(errs)| {
                let secrets = config.secrets();
                ConfigErrors(errs.iter().map(|e| secrets.scrub(e).into_owned()).collect())
            })?;
        Ok(config)
    }

    /// Checks the rules serde cannot express. Reports every violation, not just the first.
    pub fn validate(&self) -> Result<(), ConfigErrors> {
        self.validate_with(true)
    }

    fn validate_with(&self, require_queues: bool) -> Result<(), ConfigErrors> {
        // A duration long enough to overflow the sums and multiples below is an error, not a
        // panic; no setting needs more than ten years.
        let too_long: Vec<String> = self
            .durations()
            .into_iter()
            .filter(|(_, d)| *d > MAX_DURATION)
            .map(|(name, d)| format!("{name} ({}) is too long: at most 3650 days", fmt_dur(d)))
            .collect();
        if !too_long.is_empty() {
            return Err(ConfigErrors(too_long));
        }
        let mut errs = Vec::new();
        self.check_timing(&mut errs);
        self.check_worker_identity_and_ports(&mut errs);
        self.check_database(&mut errs);
        self.check_nats(&mut errs);
        self.check_retention(&mut errs);
        if require_queues && self.queues.is_empty() {
            errs.push(
                "no queues configured; add at least one [queues.<name>] section \
                 (see examples/jobwarden.toml)"
                    .into(),
            );
        }
        for (name, c) in &self.cron {
            if let Err(mut e) = crate::cron::Schedule::new(name, c) {
                errs.append(&mut e);
            }
        }
        for (name, q) in &self.queues {
            self.check_queue(name, q, &mut errs);
        }
        if errs.is_empty() {
            Ok(())
        } else {
            Err(ConfigErrors(errs))
        }
    }

    /// Durations and sizes that must hold together (invariant 5's ack_wait first).
    fn check_timing(&self, errs: &mut Vec<String>) {
        let w = &self.worker;
        let n = &self.nats;
        // Invariant 5: a message must outlive the time it takes to notice its job is stale,
        // or JetStream redelivers a job that its owner is still running.
        if n.ack_wait <= w.stale_after + w.sweep_every {
            errs.push(format!(
                "nats.ack_wait ({}) must be greater than worker.stale_after ({}) + \
                 worker.sweep_every ({}); raise nats.ack_wait or lower the other two",
                fmt_dur(n.ack_wait),
                fmt_dur(w.stale_after),
                fmt_dur(w.sweep_every)
            ));
        }
        for (name, q) in &self.queues {
            if let Some(stale) = q.stale_after {
                if n.ack_wait <= stale + w.sweep_every {
                    errs.push(format!(
                        "nats.ack_wait ({}) must be greater than queues.{name}.stale_after ({}) + \
                         worker.sweep_every ({}); raise nats.ack_wait or lower the other two",
                        fmt_dur(n.ack_wait),
                        fmt_dur(stale),
                        fmt_dur(w.sweep_every)
                    ));
                }
            }
        }
        if w.dead_after < w.heartbeat_every * 2 {
            errs.push(format!(
                "worker.dead_after ({}) must be at least twice worker.heartbeat_every ({}), or \
                 a live worker that misses one beat is declared dead",
                fmt_dur(w.dead_after),
                fmt_dur(w.heartbeat_every)
            ));
        }
        for (name, d) in [
            ("worker.reap_every", w.reap_every),
            ("worker.broker_lost_after", w.broker_lost_after),
            ("worker.sweep_every", w.sweep_every),
            ("worker.scheduler_every", w.scheduler_every),
            ("worker.drained_exit_after", w.drained_exit_after),
            ("retention.pause", self.retention.pause),
            ("retention.every", self.retention.every),
        ] {
            if d.is_zero() {
                errs.push(format!(
                    "{name} ({}) must be above zero, e.g. \"1s\"",
                    fmt_dur(d)
                ));
            }
        }
        if w.adopt_after < Duration::from_millis(100) || w.unserved_grace.is_zero() {
            errs.push(format!(
                "worker.adopt_after ({}) must be at least 100ms and worker.unserved_grace ({}) \
                 above zero",
                fmt_dur(w.adopt_after),
                fmt_dur(w.unserved_grace)
            ));
        }
        if w.pull_max_bytes < w.max_payload_bytes {
            errs.push(format!(
                "worker.pull_max_bytes ({}) must be at least worker.max_payload_bytes ({}), or a \
                 message of the largest allowed size could never be fetched",
                w.pull_max_bytes, w.max_payload_bytes
            ));
        }
        if w.heartbeat_every.is_zero() || w.heartbeat_every >= w.stale_after {
            errs.push(format!(
                "worker.heartbeat_every ({}) must be above zero and below worker.stale_after ({})",
                fmt_dur(w.heartbeat_every),
                fmt_dur(w.stale_after)
            ));
        }
        if w.claim_batch == 0 || w.claim_batch > 10_000 {
            errs.push(format!(
                "worker.claim_batch ({}) must be from 1 to 10000",
                w.claim_batch
            ));
        }
        if w.max_payload_bytes < 64 {
            errs.push(format!(
                "worker.max_payload_bytes ({}) must be at least 64",
                w.max_payload_bytes
            ));
        }
    }

    /// The worker's host name and the addresses it listens on.
    fn check_worker_identity_and_ports(&self, errs: &mut Vec<String>) {
        let w = &self.worker;
        if let Some(h) = &w.hostname {
            if h.is_empty() || h.contains(char::is_whitespace) {
                errs.push(format!(
                    "worker.hostname {h:?} must be non-empty without spaces"
                ));
            }
        }
        self.check_admin_tokens(errs);
    }

    /// `dashboard.admin_token` and `dashboard.admin_tokens`: long, visible ASCII, distinct,
    /// each named in lower case.
    fn check_admin_tokens(&self, errs: &mut Vec<String>) {
        let d = &self.dashboard;
        let mut seen: Vec<&str> = Vec::new();
        for (name, t) in d.named_admin_tokens() {
            let key = if d.admin_tokens.contains_key(name) {
                format!("dashboard.admin_tokens.{name}")
            } else {
                "dashboard.admin_token".to_string()
            };
            if key != "dashboard.admin_token"
                && (name.is_empty()
                    || name.len() > 64
                    || !name.bytes().all(|b| {
                        b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_'
                    }))
            {
                errs.push(format!(
                    "dashboard.admin_tokens: the name {name:?} is not 1 to 64 lower-case letters, \
                     digits, '-' or '_' (it is recorded as who acted, e.g. alice or ci-bot)"
                ));
            }
            if t.len() < 16 {
                errs.push(format!(
                    "{key} is shorter than 16 characters; use a long random one \
                     (e.g. `openssl rand -hex 24`)"
                ));
            }
            if !t.chars().all(|c| c.is_ascii_graphic()) {
                errs.push(format!(
                    "{key} may hold only visible ASCII characters (no spaces); \
                     e.g. the output of `openssl rand -hex 24`"
                ));
            }
            if seen.contains(&t) {
                errs.push(format!(
                    "{key} is the same token as another admin token: give each its own, \
                     so that what it did is recorded under its name"
                ));
            }
            seen.push(t);
        }
    }

    /// `[database]`.
    fn check_database(&self, errs: &mut Vec<String>) {
        if !self.database.url.starts_with("postgres://")
            && !self.database.url.starts_with("postgresql://")
            && !self.database.url.contains('=')
        {
            errs.push(format!(
                "database.url {:?} is not a PostgreSQL URL; use postgres://user@host:5432/db",
                crate::redact::url(&self.database.url)
            ));
        }
        if !valid_ident(&self.database.schema) {
            errs.push(format!(
                "database.schema {:?} must be a lowercase identifier ([a-z_][a-z0-9_]*)",
                self.database.schema
            ));
        }
        if self.database.pool_size < 2 {
            errs.push(format!(
                "database.pool_size ({}) must be at least 2",
                self.database.pool_size
            ));
        }
        if let Err(e) = crate::pg_url::PgTls::split(&self.database.url) {
            errs.push(format!("database.url: {e}"));
        }
    }

    /// `[nats]`.
    fn check_nats(&self, errs: &mut Vec<String>) {
        let n = &self.nats;
        if let Err(e) = n.servers() {
            errs.push(e);
        }
        if let Err(e) = self.telemetry.resolve() {
            errs.extend(e);
        }
        if !(1..=5).contains(&n.replicas) {
            errs.push(format!(
                "nats.replicas ({}) must be 1 to 5: JetStream keeps at most 5 copies of a \
                 stream; 3 on a three-server cluster",
                n.replicas
            ));
        }
        let auths: Vec<&str> = [
            ("credentials_file", n.credentials_file.is_some()),
            ("nkey_seed_file", n.nkey_seed_file.is_some()),
            ("token", n.token.is_some()),
            ("user", n.user.is_some() || n.password.is_some()),
        ]
        .into_iter()
        .filter(|(_, set)| *set)
        .map(|(k, _)| k)
        .collect();
        if auths.len() > 1 {
            errs.push(format!(
                "nats: {} are all set; a connection authenticates one way: keep one of \
                 credentials_file, nkey_seed_file, token, or user and password",
                auths.join(", ")
            ));
        }
        if n.user.is_some() != n.password.is_some() {
            errs.push("nats.user and nats.password go together: set both or neither".to_string());
        }
        if n.tls_cert_file.is_some() != n.tls_key_file.is_some() {
            errs.push(
                "nats.tls_cert_file and nats.tls_key_file go together: the client certificate \
                 and its private key (PEM files)"
                    .to_string(),
            );
        }
        if n.stream.is_empty()
            || !n
                .stream
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            errs.push(format!(
                "nats.stream {:?} must be letters, digits, '_' or '-'",
                n.stream
            ));
        }
        if n.subject_prefix.is_empty()
            || n.subject_prefix.contains(['*', '>', ' '])
            || n.subject_prefix.ends_with('.')
        {
            errs.push(format!(
                "nats.subject_prefix {:?} must be a plain subject like \"jobs\"",
                n.subject_prefix
            ));
        }
        if n.subject_prefix == EVENTS_PREFIX
            || n.subject_prefix.starts_with(&format!("{EVENTS_PREFIX}."))
        {
            errs.push(format!(
                "nats.subject_prefix {:?} would put jobwarden's own events \
                 ({EVENTS_PREFIX}.dead.<queue>) into the work stream; choose another prefix, \
                 e.g. \"jobs\"",
                n.subject_prefix
            ));
        }
        if n.duplicate_window < Duration::from_secs(1) {
            errs.push(format!(
                "nats.duplicate_window ({}) must be at least 1s",
                fmt_dur(n.duplicate_window)
            ));
        }
    }

    /// A queue's debounce, throttle and unique_for: each from 1ms to the longest delay, and
    /// the rules between them that a job's own fields follow (contract::check_gate_rules).
    fn check_gate(name: &str, q: &QueueConfig, errs: &mut Vec<String>) {
        let longest = Duration::from_millis(crate::contract::MAX_DELAY_MS as u64);
        for (field, d) in [
            ("debounce", q.debounce),
            ("debounce_max_wait", q.debounce_max_wait),
            ("throttle", q.throttle),
            ("unique_for", q.unique_for),
        ] {
            match d {
                Some(d) if d < Duration::from_millis(1) => errs.push(format!(
                    "queues.{name}.{field} ({}) must be at least 1ms, e.g. \"5s\"; leave it out \
                     for none",
                    fmt_dur(d)
                )),
                Some(d) if d > longest => errs.push(format!(
                    "queues.{name}.{field} ({}) must be at most {}, the longest delay",
                    fmt_dur(d),
                    fmt_dur(longest)
                )),
                _ => {}
            }
        }
        let shown = |f: &str| {
            let d = match f {
                "debounce" => q.debounce,
                _ => q.debounce_max_wait,
            };
            format!("\"{}\"", fmt_dur(d.unwrap_or_default()))
        };
        if let Err(e) =
            crate::contract::check_gate_rules(&q.gate(), |f| format!("queues.{name}.{f}"), shown)
        {
            errs.push(e.to_string());
        }
    }

    /// A queue's per-key settings.
    fn check_keys(name: &str, q: &QueueConfig, errs: &mut Vec<String>) {
        match q.key_concurrency {
            Some(0) => errs.push(format!(
                "queues.{name}.key_concurrency (0) must be at least 1 (leave it out for no \
                 per-key limit), e.g. key_concurrency = 2"
            )),
            Some(n) if n > 1_000_000 => errs.push(format!(
                "queues.{name}.key_concurrency ({n}) must be at most 1000000 (leave it out for \
                 no per-key limit)"
            )),
            _ => {}
        }
        if q.ordered_by_key && q.key_concurrency.is_some_and(|n| n > 1) {
            errs.push(format!(
                "queues.{name}: ordered_by_key runs one job of a key at a time, so \
                 key_concurrency ({}) cannot be above 1; leave key_concurrency out (or set it \
                 to 1), or drop ordered_by_key to run {0} of a key at once in any order",
                q.key_concurrency.unwrap_or_default()
            ));
        }
        if q.ordered_on_dead != OnDead::Block && !q.ordered_by_key {
            errs.push(format!(
                "queues.{name}.ordered_on_dead applies to ordered queues only: set \
                 ordered_by_key = true, or leave ordered_on_dead out"
            ));
        }
        if q.key_rules().is_some() && (q.global_concurrency.is_some() || q.rate_limit.is_some()) {
            let keyed = if q.key_concurrency.is_some() {
                "key_concurrency"
            } else if q.key_rate_limit.is_some() {
                "key_rate_limit"
            } else if q.ordered_by_key {
                "ordered_by_key"
            } else {
                "fair_by_key"
            };
            let global = if q.global_concurrency.is_some() {
                "global_concurrency"
            } else {
                "rate_limit"
            };
            errs.push(format!(
                "queues.{name}: {keyed} and {global} cannot be set together yet (a keyed \
                 queue's jobs start from PostgreSQL, where the queue-wide limits do not apply \
                 yet); use one of them, or two queues"
            ));
        }
    }

    /// One `[queues.<name>]` section.
    fn check_queue(&self, name: &str, q: &QueueConfig, errs: &mut Vec<String>) {
        if let Err(e) = crate::job::validate_queue_name(name) {
            errs.push(format!("queues.{name}: {e}"));
        }
        if let Some(n) = q.global_concurrency.filter(|&n| n > 1_000_000) {
            errs.push(format!(
                "queues.{name}.global_concurrency ({n}) must be at most 1000000 (leave it \
                 out for no cluster-wide cap)"
            ));
        }
        if q.global_concurrency == Some(0) {
            errs.push(format!(
                "queues.{name}.global_concurrency (0) must be at least 1 (leave it out for \
                 no cluster-wide cap), e.g. global_concurrency = 3"
            ));
        }
        Self::check_keys(name, q, errs);
        Self::check_gate(name, q, errs);
        if q.fair_every == 1 || q.fair_every > 1000 {
            errs.push(format!(
                "queues.{name}.fair_every ({}) must be 0 (strict priorities) or from 2 to \
                 1000, e.g. fair_every = 10 gives lower priorities every 10th pull",
                q.fair_every
            ));
        }
        if q.concurrency == 0 || q.concurrency > 10_000 {
            errs.push(format!(
                "queues.{name}.concurrency ({}) must be from 1 to 10000",
                q.concurrency
            ));
        }
        if q.max_attempts == 0 || q.max_attempts > 1000 {
            errs.push(format!(
                "queues.{name}.max_attempts ({}) must be from 1 to 1000",
                q.max_attempts
            ));
        }
        if q.timeout.is_zero() {
            errs.push(format!(
                "queues.{name}.timeout ({}) must be above zero, e.g. \"5m\"",
                fmt_dur(q.timeout)
            ));
        }
        if q.expire_after.is_some_and(|e| e < Duration::from_millis(1)) {
            errs.push(format!(
                "queues.{name}.expire_after ({}) must be at least 1ms (every job of the queue \
                 would expire at once), e.g. \"1h\"; leave it out for no expiry",
                fmt_dur(q.expire_after.unwrap_or_default())
            ));
        }
        if let Err(e) = q.backoff.validate() {
            errs.push(format!("queues.{name}.backoff: {e}"));
        }
        match q.handler.as_ref().or(self.handler.as_ref()) {
            None => errs.push(format!(
                "queues.{name} has no handler; set queues.{name}.handler or a top-level \
                 [handler], e.g. {{ kind = \"http\", url = \"http://127.0.0.1:8080/jobs\" }}"
            )),
            Some(HandlerConfig::Http { url }) => {
                if !url.starts_with("http://") {
                    errs.push(format!(
                        "queues.{name}.handler.url {:?} must start with http:// \
                         (the application runs beside the worker)",
                        crate::redact::url(url)
                    ));
                }
            }
            Some(HandlerConfig::Exec { command, .. }) => {
                if command.is_empty() || command[0].is_empty() {
                    errs.push(format!(
                        "queues.{name}.handler.command is empty; give the program and its \
                         arguments, e.g. [\"./bin/send-email\", \"--fast\"]"
                    ));
                }
            }
            Some(HandlerConfig::Rust { .. }) => {}
        }
    }

    /// The handler a queue uses (its own, else the top-level one).
    pub fn handler_for(&self, queue: &str) -> Option<&HandlerConfig> {
        self.queues
            .get(queue)
            .and_then(|q| q.handler.as_ref())
            .or(self.handler.as_ref())
    }

    /// A warning when a pod that gives this long between SIGTERM and SIGKILL
    /// (`terminationGracePeriodSeconds`) cannot fit a drain.
    pub fn termination_grace_warning(&self, grace: Duration) -> Option<String> {
        let need = self.worker.shutdown_grace + DRAIN_OVERHEAD;
        (grace < need).then(|| {
            format!(
                "terminationGracePeriodSeconds ({}) is shorter than a drain may take: \
                 worker.shutdown_grace ({}) + {} to release and settle what is left = {}, plus \
                 the application's own stop time; raise terminationGracePeriodSeconds to at least \
                 {} or lower worker.shutdown_grace, or jobs still running are killed without \
                 being given back (the heartbeat reaper takes them back after \
                 worker.dead_after, and each loses an attempt)",
                grace.as_secs(),
                fmt_dur(self.worker.shutdown_grace),
                fmt_dur(DRAIN_OVERHEAD),
                fmt_dur(need),
                need.as_secs()
            )
        })
    }

    /// [`Config::termination_grace_warning`] for the period in `JOBWARDEN_POD_TERMINATION_GRACE_SECONDS`,
    /// or a warning that the variable cannot be read.
    pub fn termination_grace_warning_from_env(&self) -> Option<String> {
        let text = std::env::var(TERMINATION_GRACE_ENV).ok()?;
        match text.trim().parse::<u64>() {
            Ok(secs) => self.termination_grace_warning(Duration::from_secs(secs)),
            Err(_) => Some(format!(
                "{TERMINATION_GRACE_ENV}={text:?} is not a whole number of seconds; set it to \
                 the pod's terminationGracePeriodSeconds, e.g. \"120\""
            )),
        }
    }

    /// Every secret this configuration holds: passwords and tokens, the credentials in its
    /// URLs, secret-named environment variables of exec handlers.
    pub fn secrets(&self) -> crate::redact::Secrets {
        let mut s = crate::redact::Secrets::new();
        s.add_url(&self.database.url).add_url(&self.nats.url);
        let t = &self.telemetry;
        for url in [&t.otlp_endpoint, &t.traces_endpoint, &t.metrics_endpoint]
            .into_iter()
            .flatten()
        {
            s.add_url(url);
        }
        let n = &self.nats;
        for value in [&n.password, &n.token, &self.dashboard.admin_token]
            .into_iter()
            .flatten()
            .chain(self.dashboard.admin_tokens.values())
        {
            s.add(value);
        }
        let queue_handlers = self.queues.values().filter_map(|q| q.handler.as_ref());
        for h in self.handler.iter().chain(queue_handlers) {
            h.secrets(&mut s);
        }
        s
    }

    /// The effective configuration as TOML, with passwords and tokens replaced by `****`
    /// (in the database, NATS and handler URLs, and exec handlers' environment variables
    /// named like secrets).
    pub fn to_redacted_toml(&self) -> String {
        let mut c = self.clone();
        c.database.url = crate::redact::url(&c.database.url);
        c.nats.url = crate::redact::url(&c.nats.url);
        let queue_handlers = c.queues.values_mut().filter_map(|q| q.handler.as_mut());
        for h in c.handler.iter_mut().chain(queue_handlers) {
            h.redact();
        }
        // Left out (a placeholder would not read back as a valid secret), and said so.
        let named = !std::mem::take(&mut c.dashboard.admin_tokens).is_empty();
        let hidden: Vec<&str> = [
            (
                "dashboard.admin_token",
                c.dashboard.admin_token.take().is_some(),
            ),
            ("dashboard.admin_tokens", named),
            ("nats.token", c.nats.token.take().is_some()),
            ("nats.password", c.nats.password.take().is_some()),
        ]
        .into_iter()
        .filter(|(_, set)| *set)
        .map(|(k, _)| k)
        .collect();
        let mut out = toml_string(&c);
        let notes: Vec<String> = hidden
            .iter()
            .map(|key| format!("# {key} is set (not shown)"))
            .collect();
        if !notes.is_empty() {
            out.push_str(&format!("\n{}\n", notes.join("\n")));
        }
        out
    }
}

fn toml_string(c: &Config) -> String {
    toml::to_string(c).unwrap_or_else(|e| format!("# cannot render the configuration: {e}\n"))
}

fn valid_ident(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && s.len() <= 63
}

/// Whether a setting (a dotted path) may hold a secret, so that what is given for it is
/// never shown (not even in a type error) and the environment gives it verbatim: any URL
/// (`database.url`, `nats.url`, `queues.<name>.handler.url`: their user information) and
/// any setting named like a secret (`nats.password`, `nats.token`,
/// `dashboard.admin_token`, an exec handler's `env.API_TOKEN`).
fn is_secret_setting(path: &str) -> bool {
    let path = path.to_ascii_lowercase();
    let last = path.rsplit('.').next().unwrap_or("");
    last == "url" || crate::redact::is_secret_name(last)
}

/// Whether an environment variable's value is taken as written rather than read like a
/// TOML value: secrets, URLs, and `nats.user` (it goes with `nats.password`).
fn is_verbatim(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    key == "nats.user" || is_secret_setting(&key)
}

/// The longest duration a setting may have (ten years).
pub const MAX_DURATION: Duration = Duration::from_secs(3650 * 24 * 3600);

impl Config {
    /// Every duration setting, by its name in the file.
    fn durations(&self) -> Vec<(String, Duration)> {
        let (d, n, w) = (&self.database, &self.nats, &self.worker);
        let mut all: Vec<(String, Duration)> = [
            ("database.connect_timeout", d.connect_timeout),
            ("nats.ack_wait", n.ack_wait),
            ("nats.duplicate_window", n.duplicate_window),
            ("worker.heartbeat_every", w.heartbeat_every),
            ("worker.stale_after", w.stale_after),
            ("worker.sweep_every", w.sweep_every),
            ("worker.dead_after", w.dead_after),
            ("worker.reap_every", w.reap_every),
            ("worker.broker_lost_after", w.broker_lost_after),
            ("worker.scheduler_every", w.scheduler_every),
            ("worker.shutdown_grace", w.shutdown_grace),
            ("worker.adopt_after", w.adopt_after),
            ("worker.unserved_grace", w.unserved_grace),
            ("worker.drained_exit_after", w.drained_exit_after),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        for (name, q) in &self.queues {
            all.push((format!("queues.{name}.timeout"), q.timeout));
            all.push((format!("queues.{name}.backoff.base"), q.backoff.base));
            all.push((format!("queues.{name}.backoff.max"), q.backoff.max));
            if let Some(s) = q.stale_after {
                all.push((format!("queues.{name}.stale_after"), s));
            }
            if let Some(e) = q.expire_after {
                all.push((format!("queues.{name}.expire_after"), e));
            }
        }
        all
    }
}

/// Formats a duration the way the config file writes it ("5m", "30s", "250ms").
pub fn fmt_dur(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const OK: &str = r#"
        [handler]
        kind = "http"
        url = "http://127.0.0.1:8080/jobs"
        [queues.email]
        concurrency = 4
        max_attempts = 3
        backoff = { kind = "exponential", base = "5s" }
        [queues.pdf]
        handler = { kind = "exec", command = ["./render"] }
        backoff = { kind = "fixed", base = "10s" }
    "#;

    /// The per-key settings that contradict each other, or a queue-wide limit not built for
    /// keyed queues yet, are refused naming the setting and the fix; good ones make the
    /// queue keyed with the rules they say.
    #[test]
    fn per_key_settings_that_cannot_work_together_are_refused_at_load() {
        let with = |extra: &str| {
            let text = format!("[handler]\nkind = \"http\"\nurl = \"http://127.0.0.1:1/j\"\n[queues.hooks]\n{extra}\n");
            Config::from_toml(&text).map_err(|e| e.to_string())
        };
        for (extra, words) in [
            (
                "key_concurrency = 0",
                "queues.hooks.key_concurrency (0) must be at least 1",
            ),
            (
                "ordered_by_key = true\nkey_concurrency = 3",
                "key_concurrency (3) cannot be above 1",
            ),
            (
                "ordered_on_dead = \"skip\"",
                "ordered_on_dead applies to ordered queues only",
            ),
            (
                "key_concurrency = 2\nglobal_concurrency = 5",
                "key_concurrency and global_concurrency cannot be set together",
            ),
            (
                "fair_by_key = true\nrate_limit = \"10/1s\"",
                "fair_by_key and rate_limit cannot be set together",
            ),
        ] {
            let err = with(extra).expect_err(extra);
            assert!(err.contains(words), "{extra}: {err}");
        }
        let c =
            with("ordered_by_key = true\nordered_on_dead = \"skip\"\nkey_rate_limit = \"5/1s\"")
                .unwrap();
        let rules = c.queues["hooks"].key_rules().expect("keyed");
        assert_eq!(rules.concurrency, Some(1));
        assert!(rules.ordered && !rules.dead_blocks && !rules.fair);
        assert_eq!(rules.rate.map(|r| r.starts), Some(5));
        assert!(with("concurrency = 2").unwrap().queues["hooks"]
            .key_rules()
            .is_none());
    }

    #[test]
    fn parses_a_good_file_with_defaults() {
        let c = Config::from_toml(OK).unwrap();
        assert_eq!(c.queues["email"].concurrency, 4);
        assert_eq!(c.queues["email"].backoff.base, Duration::from_secs(5));
        assert_eq!(c.queues["pdf"].max_attempts, DEFAULT_MAX_ATTEMPTS);
        assert_eq!(c.nats.ack_wait, DEFAULT_ACK_WAIT);
        assert!(matches!(
            c.handler_for("pdf"),
            Some(HandlerConfig::Exec { .. })
        ));
        assert!(matches!(
            c.handler_for("email"),
            Some(HandlerConfig::Http { .. })
        ));
    }

    #[test]
    fn durations_too_long_to_compute_with_are_errors_not_panics() {
        let huge = "18446744073709551615s";
        for (section, key) in [
            ("queues.email", "stale_after"),
            ("queues.email", "timeout"),
            ("worker", "heartbeat_every"),
            ("worker", "shutdown_grace"),
            ("worker", "stale_after"),
            ("nats", "ack_wait"),
            ("database", "connect_timeout"),
        ] {
            let text = if section == "queues.email" {
                OK.replace(
                    "concurrency = 4",
                    &format!("concurrency = 4\n{key} = \"{huge}\""),
                )
            } else {
                format!("{OK}\n[{section}]\n{key} = \"{huge}\"\n")
            };
            let err = Config::from_toml(&text).unwrap_err().to_string();
            assert!(
                err.contains(&format!("{section}.{key} ("))
                    && err.contains("is too long: at most 3650 days"),
                "{section}.{key}: {err}"
            );
        }
        let text = OK.replace(
            "base = \"5s\" }",
            "base = \"5s\", max = \"18446744073709551615s\" }",
        );
        let err = Config::from_toml(&text).unwrap_err().to_string();
        assert!(err.contains("queues.email.backoff.max"), "{err}");
        // The longest allowed is fine.
        let text = format!("{OK}\n[worker]\nunserved_grace = \"3650days\"\n");
        Config::from_toml(&text).unwrap();
        // Counts stored as 32-bit integers stay in range.
        let text = OK.replace(
            "max_attempts = 3",
            "max_attempts = 4000000000\nglobal_concurrency = 3000000000",
        );
        let err = Config::from_toml(&text).unwrap_err().to_string();
        assert!(
            err.contains("queues.email.max_attempts (4000000000) must be from 1 to 1000"),
            "{err}"
        );
        assert!(
            err.contains("queues.email.global_concurrency (3000000000) must be at most"),
            "{err}"
        );
        // A zero names the one setting that is zero, and its value.
        let text = format!("{OK}\n[worker]\nscheduler_every = \"0s\"\n");
        let err = Config::from_toml(&text).unwrap_err().to_string();
        assert!(
            err.contains("worker.scheduler_every (0s) must be above zero"),
            "{err}"
        );
        assert!(!err.contains("worker.sweep_every"), "{err}");
        // A queue's expire_after of zero would expire every job at once; ten years and more
        // is too long, like every duration.
        let text = OK.replace(
            "max_attempts = 3",
            "max_attempts = 3\nexpire_after = \"0s\"",
        );
        let err = Config::from_toml(&text).unwrap_err().to_string();
        assert!(
            err.contains("queues.email.expire_after (0s) must be at least 1ms"),
            "{err}"
        );
        let text = OK.replace(
            "max_attempts = 3",
            "max_attempts = 3\nexpire_after = \"11y\"",
        );
        let err = Config::from_toml(&text).unwrap_err().to_string();
        assert!(err.contains("queues.email.expire_after"), "{err}");
    }

    #[test]
    fn ack_wait_must_exceed_stale_plus_sweep() {
        let text = format!(
            "{OK}\n[nats]\nack_wait = \"5m\"\n[worker]\nstale_after = \"5m\"\nsweep_every = \"30s\"\n"
        );
        let err = Config::from_toml(&text).unwrap_err().to_string();
        assert!(err.contains("nats.ack_wait (5m)"), "{err}");
        assert!(err.contains("worker.stale_after (5m)"), "{err}");
        assert!(err.contains("worker.sweep_every (30s)"), "{err}");
    }

    #[test]
    fn reports_every_error_at_once() {
        let text = r#"
            [database]
            schema = "Bad-Schema"
            [queues.email]
            concurrency = 0
            max_attempts = 0
            handler = { kind = "http", url = "https://example.com" }
            [queues."bad.name"]
            handler = { kind = "exec", command = [] }
        "#;
        let errs = Config::from_toml(text).unwrap_err().0;
        let all = errs.join("\n");
        assert!(all.contains("database.schema"), "{all}");
        assert!(all.contains("queues.email.concurrency (0)"), "{all}");
        assert!(all.contains("queues.email.max_attempts"), "{all}");
        assert!(all.contains("must start with http://"), "{all}");
        assert!(all.contains("queues.bad.name"), "{all}");
        assert!(all.contains("handler.command is empty"), "{all}");
        assert!(errs.len() >= 6, "{all}");
    }

    #[test]
    fn every_value_of_the_wrong_type_or_form_is_reported_at_once() {
        let text = r#"
            [worker]
            stale_after = "soon"
            api_listen = "localhost"
            ops_listen = "on"
            stale_afterr = "1s"
            [dashboard]
            listen = "7435"
            [queues.email]
            concurrency = "lots"
            rate_limit = "100 per minute"
            handler = { kind = "http", url = "http://127.0.0.1:1/" }
            [queues.pdf]
            max_attempts = -1
            limit = "5/forever"
            [cron.nightly]
            schedule = "every night"
            timezone = "Europe/Berln"
            queue = "email"
            priority = 12
        "#;
        let errs = Config::from_toml(text).unwrap_err().0;
        let all = errs.join("\n");
        for named in [
            "worker.stale_after",
            "worker.api_listen: \"localhost\" is not an address and port like 127.0.0.1:7433",
            "worker.ops_listen: \"on\" is not an address and port like",
            "stale_afterr",
            "dashboard.listen: \"7435\" is not an address and port",
            "queues.email.concurrency",
            "queues.email.rate_limit: \"100 per minute\" has no '/'",
            "queues.pdf.max_attempts",
            "queues.pdf.limit: \"5/forever\" has no valid duration",
            "cron.nightly.schedule: \"every night\" does not parse",
            "cron.nightly.timezone: \"Europe/Berln\" is not a known time zone",
            "cron.nightly.priority: 12 is not a whole number from 0 to 9",
        ] {
            assert!(all.contains(named), "{named} not in:\n{all}");
        }
        assert_eq!(errs.len(), 12, "{all}");
    }

    #[test]
    fn type_errors_name_the_field() {
        let err = Config::from_toml("[queues.email]\nconcurrency = \"lots\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("queues.email.concurrency"), "{err}");
        let err = Config::from_toml("[worker]\nstale_afterr = \"1s\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("stale_afterr"), "{err}");
    }

    #[test]
    fn a_subject_prefix_that_would_capture_the_event_subjects_is_refused() {
        let err = Config::from_toml(&format!("{OK}\n[nats]\nsubject_prefix = \"jobwarden\"\n"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("nats.subject_prefix"), "{err}");
        assert!(err.contains("jobwarden.dead"), "{err}");
    }

    #[test]
    fn a_rate_limit_is_read_once_and_named_when_it_does_not_parse() {
        let all = Config::from_toml(
            "[queues.email]\nrate_limit = \"100 per minute\"\n\
             [queues.email.handler]\nkind = \"http\"\nurl = \"http://127.0.0.1:1/\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            all.contains("queues.email.rate_limit: \"100 per minute\" has no '/'"),
            "{all}"
        );
        assert!(all.contains("e.g. \"100/1m\""), "{all}");
        // `limit` is accepted as another name.
        let c = Config::from_toml(
            "[queues.email]\nlimit = \"100/1m\"\n[queues.email.handler]\nkind = \"http\"\n\
             url = \"http://127.0.0.1:1/\"\n",
        )
        .unwrap();
        let limit = c.queues["email"].rate_limit.unwrap();
        assert_eq!((limit.starts, limit.window), (100, Duration::from_secs(60)));
        assert!(c.to_redacted_toml().contains("rate_limit = \"100/1m\""));
    }

    #[test]
    fn no_queues_is_an_error() {
        let err = Config::from_toml("").unwrap_err().to_string();
        assert!(err.contains("no queues configured"), "{err}");
    }

    #[test]
    fn dashboard_settings_are_checked() {
        // (A token that is no word of the messages: they are scrubbed of it.)
        let bad = format!("{OK}\n[dashboard]\nlisten = \"localhost\"\n");
        let errs = Config::from_toml(&bad).unwrap_err().0;
        assert!(
            errs.iter()
                .any(|e| e.contains("dashboard.listen: \"localhost\" is not an address")),
            "{errs:?}"
        );
        let bad = format!("{OK}\n[dashboard]\nadmin_token = \"tiny-tok\"\n");
        let errs = Config::from_toml(&bad).unwrap_err().0;
        assert!(
            errs.iter()
                .any(|e| e.contains("dashboard.admin_token is shorter than 16")),
            "{errs:?}"
        );
        let spaced = format!("{OK}\n[dashboard]\nadmin_token = \"a token with spaces in it\"\n");
        let errs = Config::from_toml(&spaced).unwrap_err().0;
        assert!(errs.iter().any(|e| e.contains("visible ASCII")), "{errs:?}");
        let ok = format!("{OK}\n[dashboard]\nlisten = \"127.0.0.1:0\"\n");
        assert!(Config::from_toml(&ok).is_ok());
        // Named tokens: each long, each its own, each named in lower case.
        let named = format!(
            "{OK}\n[dashboard]\nadmin_token = \"0123456789abcdef-main\"\n\
             [dashboard.admin_tokens]\nalice = \"tiny-2\"\nBob = \"0123456789abcdef-bob\"\n\
             carol = \"0123456789abcdef-main\"\n"
        );
        let errs = Config::from_toml(&named).unwrap_err().0;
        for says in [
            "dashboard.admin_tokens.alice is shorter than 16",
            "the name \"Bob\" is not 1 to 64 lower-case letters",
            "dashboard.admin_tokens.carol is the same token as another admin token",
        ] {
            assert!(errs.iter().any(|e| e.contains(says)), "{says}: {errs:?}");
        }
        let good = format!(
            "{OK}\n[dashboard]\n[dashboard.admin_tokens]\nci-bot = \"0123456789abcdef-ci\"\n"
        );
        let c = Config::from_toml(&good).unwrap();
        assert_eq!(
            c.dashboard.named_admin_tokens(),
            [("ci-bot", "0123456789abcdef-ci")]
        );
        assert!(!c.to_redacted_toml().contains("0123456789abcdef-ci"));
        assert!(c
            .to_redacted_toml()
            .contains("dashboard.admin_tokens is set"));
    }

    #[test]
    fn secrets_are_redacted() {
        let mut c = Config::from_toml(OK).unwrap();
        c.database.url = "postgres://app:hunter2@db/x".into();
        c.dashboard.admin_token = Some("dashboard-secret-0123456789".into());
        c.handler = Some(HandlerConfig::Http {
            url: "http://app:handler-pw@127.0.0.1:8080/jobs?token=query-tok".into(),
        });
        c.queues.get_mut("pdf").unwrap().handler = Some(HandlerConfig::Exec {
            command: vec!["./render".into()],
            env: [("API_TOKEN", "exec-tok"), ("RENDER_CACHE", "/tmp/render")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        });
        let out = c.to_redacted_toml();
        for secret in [
            "hunter2",
            "dashboard-secret",
            "handler-pw",
            "query-tok",
            "exec-tok",
        ] {
            assert!(!out.contains(secret), "{secret}: {out}");
        }
        assert!(
            out.contains("http://app:****@127.0.0.1:8080/jobs?token=****"),
            "{out}"
        );
        assert!(out.contains("API_TOKEN = \"****\""), "{out}");
        assert!(out.contains("RENDER_CACHE = \"/tmp/render\""), "{out}");
        // Every one of them is known, to be scrubbed from text.
        let all = "hunter2 dashboard-secret-0123456789 handler-pw query-tok exec-tok";
        assert_eq!(c.secrets().scrub(all), "**** **** **** **** ****");
        assert!(
            out.contains("# dashboard.admin_token is set (not shown)"),
            "{out}"
        );
        assert!(out.contains("[queues.email]"), "{out}");
        // The printed configuration reads back as the same configuration.
        let back = Config::from_toml(&c.to_redacted_toml()).unwrap();
        assert_eq!(back.queues["email"].concurrency, 4);
    }

    #[test]
    fn a_secret_of_the_wrong_type_or_in_a_broken_file_is_never_quoted() {
        for (text, path, value) in [
            ("[nats]\nuser = \"w\"\npassword = 24681357\n", "nats.password", "24681357"),
            ("[nats]\ntoken = 97531864\n", "nats.token", "97531864"),
            ("[dashboard]\nadmin_token = 1122334455667788\n", "dashboard.admin_token", "1122334455667788"),
            ("[database]\nurl = 55667788\n", "database.url", "55667788"),
            (
                "[queues.email.handler]\nkind = \"exec\"\ncommand = [\"x\"]\nenv = { API_TOKEN = 31415926 }\n",
                "queues.email.handler",
                "31415926",
            ),
        ] {
            let err = Config::from_toml(&format!("{OK}\n{text}")).unwrap_err().to_string();
            assert!(err.contains(path), "{err}");
            assert!(!err.contains(value), "{err}");
        }
        let err = Config::from_toml("[nats]\npassword = 24681357\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("quote it, e.g. password = \"…\""), "{err}");
        // A file that does not parse: where, and why, without the line itself.
        let err = Config::from_toml("[nats]\npassword = \"Unterminated-Secret-77\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 2"), "{err}");
        assert!(!err.contains("Unterminated"), "{err}");
        // Other settings still show what was found.
        let err = Config::from_toml("[queues.email]\nconcurrency = \"lots\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("\"lots\""), "{err}");
    }

    #[test]
    fn rule_messages_never_quote_a_secret() {
        let text = OK.replace(
            "url = \"http://127.0.0.1:8080/jobs\"",
            "url = \"https://app:handler-pw@127.0.0.1:8080/jobs\"",
        );
        let text =
            format!("{text}\n[database]\nurl = \"host=db user=app password=pass-A pass-B\"\n");
        let err = Config::from_toml(&text).unwrap_err().to_string();
        assert!(
            err.contains("\"https://app:****@127.0.0.1:8080/jobs\" must start with http://"),
            "{err}"
        );
        assert!(
            err.contains("database.url: a word after password=…"),
            "{err}"
        );
        for secret in ["handler-pw", "pass-A", "pass-B"] {
            assert!(!err.contains(secret), "{secret}: {err}");
        }
    }

    #[test]
    fn secrets_and_urls_from_the_environment_are_taken_as_written() {
        for key in [
            "database.url",
            "nats.url",
            "nats.user",
            "nats.password",
            "NATS.PASSWORD",
            "nats.token",
            "dashboard.admin_token",
            "handler.url",
            "queues.email.handler.url",
            "queues.pdf.handler.env.api_token",
        ] {
            assert!(is_verbatim(key), "{key}");
        }
        for key in [
            "queues.email.concurrency",
            "queues.pdf.handler.command",
            "nats.tls_required",
            "worker.hostname",
            "nats.nkey_seed_file",
        ] {
            assert!(!is_verbatim(key), "{key}");
        }
    }

    /// The errors of `OK` changed by `edit` (none when it is valid).
    fn errors_after(edit: impl FnOnce(&mut Config)) -> Vec<String> {
        let mut c = Config::from_toml(OK).unwrap();
        edit(&mut c);
        c.validate().err().map(|e| e.0).unwrap_or_default()
    }

    #[track_caller]
    fn accepted(edit: impl FnOnce(&mut Config)) {
        let errs = errors_after(edit);
        assert!(errs.is_empty(), "refused: {errs:?}");
    }

    /// Refused with exactly one error, which says `what`.
    #[track_caller]
    fn refused(edit: impl FnOnce(&mut Config), what: &str) {
        let errs = errors_after(edit);
        assert!(
            errs.len() == 1 && errs[0].contains(what),
            "expected one error saying {what:?}: {errs:?}"
        );
    }

    #[test]
    fn a_nats_cluster_is_named_by_a_comma_separated_string_or_a_list() {
        let seeds = ["nats://n1:4222", "nats://n2:4222", "nats://n3:4222"];
        for form in [
            format!("url = \"{}\"", seeds.join(",")),
            format!("url = [\"{}\"]", seeds.join("\", \"")),
        ] {
            let c = Config::from_toml(&format!("{OK}\n[nats]\n{form}\n")).unwrap();
            let servers: Vec<String> = c
                .nats
                .servers()
                .unwrap()
                .iter()
                .map(|s| s.as_url_str().to_string())
                .collect();
            assert_eq!(servers, seeds, "{form}");
            // `config show` writes it back in a form that reads the same.
            let again = Config::from_toml(&c.to_redacted_toml()).unwrap();
            assert_eq!(again.nats.url, c.nats.url, "{form}");
        }
        let err = Config::from_toml(&format!("{OK}\n[nats]\nurl = 4222\n")).unwrap_err();
        assert!(
            err.to_string().contains("nats.url: not a valid value"),
            "{err}"
        );
        // Each server's password hidden, each server shown.
        let c = Config::from_toml(&format!(
            "{OK}\n[nats]\nurl = [\"nats://w:Hunter22@n1:4222\", \"nats://w:Hunter22@n2:4222\"]\n"
        ))
        .unwrap();
        let shown = c.to_redacted_toml();
        assert!(!shown.contains("Hunter22"), "{shown}");
        assert!(
            shown.contains("nats://w:****@n1:4222,nats://w:****@n2:4222"),
            "{shown}"
        );
    }

    #[test]
    // Long on purpose: one case per rule, each at its edge.
    #[allow(clippy::too_many_lines)]
    fn each_worker_and_connection_rule_holds_at_its_edge() {
        let ms = Duration::from_millis;
        // Invariant 5, per queue too: ack_wait above stale_after + sweep_every.
        let edge = DEFAULT_ACK_WAIT - DEFAULT_SWEEP_EVERY;
        accepted(|c| email(c).stale_after = Some(edge - ms(1)));
        refused(
            |c| email(c).stale_after = Some(edge),
            "queues.email.stale_after (9m 30s)",
        );
        // A live worker that misses one beat is not declared dead.
        accepted(|c| c.worker.dead_after = c.worker.heartbeat_every * 2);
        refused(
            |c| c.worker.dead_after = c.worker.heartbeat_every * 2 - ms(1),
            "worker.dead_after (9s 999ms) must be at least twice",
        );
        // A beat below stale_after, and above zero.
        accepted(|c| {
            c.worker.heartbeat_every = c.worker.stale_after - ms(1);
            c.worker.dead_after = c.worker.stale_after * 2;
        });
        refused(
            |c| {
                c.worker.heartbeat_every = c.worker.stale_after;
                c.worker.dead_after = c.worker.stale_after * 2;
            },
            "worker.heartbeat_every (5m) must be above zero and below",
        );
        refused(
            |c| c.worker.heartbeat_every = Duration::ZERO,
            "worker.heartbeat_every (0s)",
        );
        accepted(|c| c.worker.adopt_after = ms(100));
        refused(
            |c| c.worker.adopt_after = ms(99),
            "worker.adopt_after (99ms)",
        );
        refused(
            |c| c.worker.unserved_grace = Duration::ZERO,
            "worker.unserved_grace (0s) above zero",
        );
        // The largest message allowed can be fetched.
        accepted(|c| c.worker.pull_max_bytes = c.worker.max_payload_bytes);
        refused(
            |c| c.worker.pull_max_bytes = c.worker.max_payload_bytes - 1,
            "worker.pull_max_bytes (1048575) must be at least",
        );
        for n in [1, 10_000] {
            accepted(|c| c.worker.claim_batch = n);
        }
        for n in [0, 10_001] {
            refused(|c| c.worker.claim_batch = n, "worker.claim_batch");
        }
        accepted(|c| c.worker.max_payload_bytes = 64);
        refused(
            |c| c.worker.max_payload_bytes = 63,
            "worker.max_payload_bytes (63) must be at least 64",
        );
        accepted(|c| c.worker.hostname = Some("pod-1".into()));
        for h in ["", "pod 1"] {
            refused(|c| c.worker.hostname = Some(h.into()), "worker.hostname");
        }
        accepted(|c| c.worker.ops_listen = Listen::Off);
        // The database: a URL of either scheme or a libpq key=value string.
        for url in [
            "postgres://app@db:5432/x",
            "postgresql://app@db:5432/x",
            "host=db user=app dbname=x",
        ] {
            accepted(|c| c.database.url = url.into());
        }
        let errs = errors_after(|c| c.database.url = "mysql://app@db/x".into());
        assert!(
            errs.iter().any(|e| e.contains("is not a PostgreSQL URL")),
            "{errs:?}"
        );
        let (longest, too_long) = ("s".repeat(63), "s".repeat(64));
        for schema in ["jobwarden_2", "_x", longest.as_str()] {
            accepted(|c| c.database.schema = schema.into());
        }
        for schema in ["job-warden", "Jobwarden", "2jobs", "", too_long.as_str()] {
            refused(|c| c.database.schema = schema.into(), "database.schema");
        }
        accepted(|c| c.database.pool_size = 2);
        refused(
            |c| c.database.pool_size = 1,
            "database.pool_size (1) must be at least 2",
        );
        // NATS: its URL schemes, one way to authenticate, names the server accepts.
        accepted(|c| c.nats.url = "tls://nats:4222".into());
        refused(
            |c| c.nats.url = "http://nats:4222".into(),
            "must start with nats:// or tls://",
        );
        // A cluster's servers, as NATS users write them.
        accepted(|c| c.nats.url = "nats://n1:4222,nats://n2:4222,nats://n3:4222".into());
        accepted(|c| c.nats.url = "nats://u:pw@n1:4222, tls://n2:4222 ,".into());
        refused(
            |c| c.nats.url = "nats://n1:4222,nats://n2:42x22,nats://n3:4222".into(),
            "nats.url: server 2 of 3 (\"nats://n2:42x22\") is not a server address",
        );
        refused(
            |c| c.nats.url = "nats://n1:4222,n2:4222".into(),
            "nats.url: server 2 of 2 (\"(not shown: neither a URL nor a connection string)\") must start with nats:// or tls://",
        );
        refused(|c| c.nats.url = " , ".into(), "nats.url is empty");
        accepted(|c| c.nats.replicas = 5);
        refused(|c| c.nats.replicas = 0, "nats.replicas (0) must be 1 to 5");
        refused(|c| c.nats.replicas = 6, "nats.replicas (6) must be 1 to 5");
        accepted(|c| c.nats.token = Some("t".into()));
        accepted(|c| {
            c.nats.user = Some("u".into());
            c.nats.password = Some("p".into());
        });
        refused(
            |c| {
                c.nats.credentials_file = Some("a.creds".into());
                c.nats.nkey_seed_file = Some("a.nk".into());
                c.nats.token = Some("t".into());
            },
            "nats: credentials_file, nkey_seed_file, token are all set",
        );
        // A password alone already means "user and password".
        let errs = errors_after(|c| {
            c.nats.token = Some("t".into());
            c.nats.password = Some("p".into());
        });
        assert!(
            errs.iter()
                .any(|e| e.contains("nats: token, user are all set")),
            "{errs:?}"
        );
        accepted(|c| c.nats.stream = "JOBS_2-a".into());
        for stream in ["", "JOBS.2", "JOBS 2"] {
            refused(|c| c.nats.stream = stream.into(), "nats.stream");
        }
        accepted(|c| c.nats.subject_prefix = "app.jobs".into());
        for prefix in ["", "jobs.", "jobs.*", "jobs.>", "my jobs"] {
            refused(
                |c| c.nats.subject_prefix = prefix.into(),
                "must be a plain subject",
            );
        }
        accepted(|c| c.nats.duplicate_window = Duration::from_secs(1));
        refused(
            |c| c.nats.duplicate_window = ms(999),
            "nats.duplicate_window (999ms) must be at least 1s",
        );
    }

    fn email(c: &mut Config) -> &mut QueueConfig {
        c.queues.get_mut("email").unwrap()
    }

    #[test]
    fn each_queue_rule_holds_at_its_edge() {
        for n in [1, 1_000_000] {
            accepted(|c| email(c).global_concurrency = Some(n));
        }
        refused(
            |c| email(c).global_concurrency = Some(1_000_001),
            "queues.email.global_concurrency (1000001) must be at most 1000000",
        );
        for n in [0, 2, 1000] {
            accepted(|c| email(c).fair_every = n);
        }
        for n in [1, 1001] {
            refused(|c| email(c).fair_every = n, "queues.email.fair_every");
        }
        for n in [1, 10_000] {
            accepted(|c| email(c).concurrency = n);
        }
        refused(
            |c| email(c).concurrency = 10_001,
            "queues.email.concurrency (10001) must be from 1 to 10000",
        );
        for n in [1, 1000] {
            accepted(|c| email(c).max_attempts = n);
        }
        refused(
            |c| email(c).max_attempts = 1001,
            "queues.email.max_attempts (1001) must be from 1 to 1000",
        );
        accepted(|c| email(c).rate_limit = Some("1000000/7d".parse().unwrap()));
        refused(
            |c| email(c).backoff.jitter = 2.0,
            "queues.email.backoff: jitter (2) must be between 0 and 1",
        );
    }

    #[test]
    fn a_pod_whose_termination_grace_cannot_fit_a_drain_is_warned_about() {
        let c = Config::from_toml(OK).unwrap();
        // shutdown_grace (30s) + DRAIN_OVERHEAD (30s).
        assert_eq!(c.termination_grace_warning(Duration::from_secs(60)), None);
        let w = c
            .termination_grace_warning(Duration::from_secs(59))
            .expect("59 s cannot fit a drain");
        assert!(
            w.contains("terminationGracePeriodSeconds (59) is shorter than a drain may take")
                && w.contains("raise terminationGracePeriodSeconds to at least 60"),
            "{w}"
        );
    }

    /// The pod gives its period in an environment variable. The environment is the whole
    /// process's, so each case runs in a child of this test binary: this test alone, the
    /// variable set when the child starts.
    #[test]
    fn the_pods_termination_grace_is_read_from_its_variable() {
        const CASE: &str = "JOBWARDEN_TEST_GRACE_CASE";
        let c = Config::from_toml(OK).unwrap();
        if let Ok(case) = std::env::var(CASE) {
            let got = c.termination_grace_warning_from_env();
            match case.as_str() {
                "unset" | "fits" => assert_eq!(got, None, "{case}"),
                "short" => {
                    let w = got.expect("59 s cannot fit a drain");
                    assert!(
                        w.contains("terminationGracePeriodSeconds (59) is shorter"),
                        "{w}"
                    );
                }
                _ => {
                    let w = got.expect("an unreadable period is said");
                    assert!(
                        w.contains("=\"2m\" is not a whole number of seconds"),
                        "{w}"
                    );
                }
            }
            return;
        }
        for (case, value) in [
            ("unset", None),
            ("fits", Some(" 60 ")),
            ("short", Some("59")),
            ("unreadable", Some("2m")),
        ] {
            let mut child = std::process::Command::new(std::env::current_exe().unwrap());
            child
                .args([
                    "--exact",
                    "config::tests::the_pods_termination_grace_is_read_from_its_variable",
                    "--test-threads=1",
                ])
                .env(CASE, case);
            match value {
                Some(v) => child.env(TERMINATION_GRACE_ENV, v),
                None => child.env_remove(TERMINATION_GRACE_ENV),
            };
            let out = child.output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success() && text.contains("1 passed"),
                "case {case}:\n{text}{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    #[test]
    fn the_example_file_shows_every_default_of_the_connections_and_the_worker() {
        // examples/jobwarden.toml: "every section and setting, with its default".
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/examples/jobwarden.toml"
        ))
        .unwrap();
        let example = Config::from_toml(&text).unwrap();
        let defaults = Config::default();
        let json = |v: Result<serde_json::Value, _>| v.unwrap();
        use serde_json::to_value;
        assert_eq!(
            json(to_value(&example.database)),
            json(to_value(&defaults.database))
        );
        assert_eq!(
            json(to_value(&example.nats)),
            json(to_value(&defaults.nats))
        );
        assert_eq!(
            json(to_value(&example.worker)),
            json(to_value(&defaults.worker))
        );
        assert_eq!(
            json(to_value(&example.retention)),
            json(to_value(&defaults.retention))
        );
    }
}
