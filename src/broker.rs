//! JetStream: connection, idempotent provisioning of the stream and per-lane consumers, and
//! publishing jobs.
//!
//! Subject scheme — a queue has eleven delivery **lanes** ([`Lane`]):
//! - `<prefix>.<queue>` — the bare subject: a job at the default priority (5). Plain
//!   producers publish here, with or without an envelope.
//! - `<prefix>.<queue>.<p>` (p = 0…9, 0 first) — a priority band. These filters do not overlap
//!   the bare subject (nor each other), so each lane gets its own durable consumer on the
//!   work-queue stream (JetStream 2.9 forbids overlapping filters there).
//!
//! One durable pull consumer per lane (`jobwarden-<queue>` for the bare subject,
//! `jobwarden-<queue>~p<p>` for band p; `~` cannot occur in a queue name, so no two lanes of
//! any queues share a name), shared by every pod: explicit ack, `max_deliver` -1 (Postgres
//! counts attempts, not the broker), no backoff list, and `ack_wait` above stale_after +
//! sweep_every (invariant 5). No other consumer is ever created: the janitor and the adopter
//! read the stream directly (`STREAM.MSG.GET` with `next_by_subj`, NATS 2.9+), so nothing of
//! theirs can overlap a lane's filter on the work-queue stream.
//!
//! Every call to the server is bounded in time ([`BROKER_CALL_LIMIT`]): a NATS outage must
//! never hold up work that only needs PostgreSQL.

use crate::config::NatsConfig;
use crate::job::{Envelope, DEFAULT_PRIORITY};
use crate::redact::Secrets;
use async_nats::jetstream::{self, consumer, stream};
use async_nats::HeaderMap;
use std::future::Future;
use std::str::FromStr;
use std::time::{Duration, SystemTime};
use tracing::{info, warn};

/// The longest any single request to the NATS server may take (a publish waiting for the
/// stream's answer, a consumer or stream info, a read of one message).
pub const BROKER_CALL_LIMIT: Duration = Duration::from_secs(5);

/// How long a pod waits before re-creating a stream or consumer it finds gone.
const RECREATE_AFTER: Duration = Duration::from_secs(2);

/// Consumers older versions of the janitor created (and may have left behind when killed
/// mid-round). Never a queue's consumer: those are `jobwarden-<queue>`, and a queue named
/// `orphans-x` is told apart by its filter (`is_janitor_leftover`).
const OLD_JANITOR_PREFIX: &str = "jobwarden-orphans-";

/// Where a queue's consumer stands in the stream, for broker-loss repair: a queued job whose
/// message has a sequence at or below `gone_upto` was delivered (or purged); none above
/// `last_seq` exists; messages stored before `created` belong to an earlier incarnation of
/// the stream.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamPosition {
    pub gone_upto: u64,
    pub last_seq: u64,
    pub created: SystemTime,
    /// Messages delivered and not acked yet (the adopter scans them).
    pub ack_pending: usize,
    /// Highest stream sequence acked contiguously.
    pub ack_floor: u64,
    /// Highest stream sequence delivered.
    pub delivered: u64,
    /// Messages on the queue's subject not delivered yet.
    pub undelivered: u64,
}

/// One delivery lane of a queue: its bare subject (`band: None`, the default priority) or a
/// priority band `<prefix>.<queue>.<p>`. Workers pull from the highest-priority lane that has
/// messages; the scheduler, the CLI and the client publish a job to the lane of its priority
/// ([`Lane::of`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Lane {
    pub queue: String,
    pub band: Option<u8>,
}

impl Lane {
    /// The queue's bare subject (default priority).
    pub fn bare(queue: &str) -> Lane {
        Lane {
            queue: queue.to_string(),
            band: None,
        }
    }

    /// The lane a job of `priority` is published to: the bare subject for the default
    /// priority, its band otherwise.
    pub fn of(queue: &str, priority: i16) -> Lane {
        Lane {
            queue: queue.to_string(),
            band: crate::contract::Priority::new(priority.into())
                .ok()
                .filter(|p| *p != crate::contract::Priority::DEFAULT)
                .map(|p| p.get() as u8),
        }
    }

    /// Every lane of a queue, highest priority first (the bare subject right before band 5,
    /// which has the same priority).
    pub fn all(queue: &str) -> Vec<Lane> {
        let mut lanes: Vec<Lane> = crate::contract::Priority::all()
            .map(|p| Lane {
                queue: queue.to_string(),
                band: Some(p.get() as u8),
            })
            .collect();
        lanes.insert(DEFAULT_PRIORITY as usize, Lane::bare(queue));
        lanes
    }

    /// The priority of the lane's jobs (0 first).
    pub fn priority(&self) -> i16 {
        self.band.map(i16::from).unwrap_or(DEFAULT_PRIORITY)
    }

    /// The lane's durable consumer.
    pub fn consumer_name(&self) -> String {
        match self.band {
            None => format!("jobwarden-{}", self.queue),
            Some(p) => format!("jobwarden-{}~p{p}", self.queue),
        }
    }

    /// The lane's subject under `prefix`.
    pub fn subject(&self, prefix: &str) -> String {
        match self.band {
            None => format!("{prefix}.{}", self.queue),
            Some(p) => format!("{prefix}.{}.{p}", self.queue),
        }
    }
}

impl std::fmt::Display for Lane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.band {
            None => write!(f, "{}", self.queue),
            Some(p) => write!(f, "{} (band {p})", self.queue),
        }
    }
}

/// A message read straight from the stream.
#[derive(Debug, Clone)]
pub struct StoredMessage {
    pub subject: String,
    pub seq: u64,
    pub stored_ns: i128,
    /// Its headers, except any the NATS client could not hold (see `unreadable`).
    pub headers: HeaderMap,
    pub payload: bytes::Bytes,
    /// Why the NATS client cannot read this message's headers (a lone CR in a value, a line
    /// without a colon, bytes that are not UTF-8), if it cannot. async-nats 0.51 panics in
    /// its connection task on a lone CR: such a message must never be delivered to a
    /// consumer of ours, so whoever reads it raw takes it out of the stream.
    pub unreadable: Option<String>,
}

/// Headers as the stream stored them (`NATS/1.0\r\nName: value\r\n…`), read leniently:
/// every header a NATS client can carry is kept; the reason the rest cannot be is returned.
pub fn parse_stored_headers(raw: &[u8]) -> (HeaderMap, Option<String>) {
    let mut headers = HeaderMap::new();
    let Ok(text) = std::str::from_utf8(raw) else {
        return (headers, Some("its headers are not UTF-8".into()));
    };
    let mut problem = None;
    for line in text.split("\r\n").skip(1).filter(|l| !l.is_empty()) {
        let bad = |what: &str| {
            format!(
                "header line {:?} {what}",
                line.chars().take(80).collect::<String>()
            )
        };
        let Some((name, value)) = line.split_once(':') else {
            problem.get_or_insert_with(|| bad("has no colon"));
            continue;
        };
        let value = value.trim();
        if value.contains(['\r', '\n']) {
            problem.get_or_insert_with(|| bad("holds a lone CR or LF"));
            continue;
        }
        match (
            async_nats::HeaderName::from_str(name),
            async_nats::HeaderValue::from_str(value),
        ) {
            (Ok(n), Ok(v)) => headers.append(n, v),
            _ => {
                problem.get_or_insert_with(|| bad("is not a valid header"));
            }
        }
    }
    (headers, problem)
}

/// Nanoseconds since the Unix epoch of a NATS timestamp.
pub fn unix_nanos(t: &async_nats::datetime::DateTime) -> i128 {
    t.unix_timestamp_nanos()
}

/// A NATS timestamp as a `SystemTime`.
pub fn system_time(t: &async_nats::datetime::DateTime) -> SystemTime {
    let ns = unix_nanos(t).max(0) as u128;
    SystemTime::UNIX_EPOCH + Duration::from_nanos(ns.min(u64::MAX as u128) as u64)
}

#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("NATS at {url} is unreachable: {cause}; check nats.url and that nats-server is running with JetStream (-js)")]
    Unreachable { url: String, cause: String },
    /// The server answered and will never let this client in as configured: its
    /// credentials, its TLS settings (a certificate not trusted, TLS not offered), its URL.
    #[error("NATS at {url} refused the connection: {cause}; check nats.url and the credentials and TLS settings of [nats]")]
    Refused { url: String, cause: String },
    /// A setting of `[nats]` that cannot be used as it is (a file that cannot be read, a
    /// seed that is not a user seed); the cause names the setting.
    #[error("{cause}")]
    Setting { cause: String },
    /// The stream exists but is not what jobwarden can use (not a work queue).
    #[error("stream {stream}: {cause}")]
    WrongStream { stream: String, cause: String },
    /// Another consumer of the work-queue stream filters the same subject.
    #[error("consumer {consumer}: {cause}")]
    ConsumerConflict { consumer: String, cause: String },
    #[error("JetStream is not enabled on the NATS server at {url} ({cause}); start nats-server with -js")]
    NoJetStream { url: String, cause: String },
    #[error("stream {stream}: {cause}")]
    Stream { stream: String, cause: String },
    #[error("consumer {consumer}: {cause}")]
    Consumer { consumer: String, cause: String },
    #[error("publish to {subject} failed: {cause}")]
    Publish { subject: String, cause: String },
    /// A message the server can never take: over its max_payload.
    #[error("the message for job {id} is {size} bytes with its headers, over the NATS server's max_payload of {limit} bytes; store large data elsewhere and pass a reference in the payload")]
    TooLarge {
        id: String,
        size: usize,
        limit: usize,
    },
    #[error("{what}: no answer from the NATS server within {}s", BROKER_CALL_LIMIT.as_secs())]
    TimedOut { what: String },
    /// A job no worker would accept as a message (a row stored before the job contract
    /// existed, or written by hand): it can never be published.
    #[error("job {id} cannot be published: {reason}")]
    Unpublishable { id: String, reason: String },
}

impl BrokerError {
    /// No wait can cure it: the configuration or the server's settings must change first.
    /// Decided by the variant, which the connection and provisioning code choose from the
    /// client's error kinds and JetStream's error codes (never from the text).
    pub fn is_fatal(&self) -> bool {
        matches!(
            self,
            BrokerError::Refused { .. }
                | BrokerError::Setting { .. }
                | BrokerError::WrongStream { .. }
                | BrokerError::ConsumerConflict { .. }
        )
    }
}

/// Whether a connection failed for a reason no retry cures: the server refused the
/// credentials, TLS cannot be set up, the URL does not parse, or the server's certificate
/// was rejected (a rustls error inside the I/O error of the handshake).
fn connect_refused(e: &async_nats::ConnectError) -> bool {
    use async_nats::ConnectErrorKind as K;
    match e.kind() {
        K::Authentication | K::AuthorizationViolation | K::Tls | K::ServerParse => true,
        K::Io => crate::causes::tls_refused(e),
        K::Dns | K::TimedOut | K::MaxReconnects => false,
    }
}

/// JetStream refused a consumer because another one filters the same subject of the
/// work-queue stream (error code 10100).
fn not_unique(e: &async_nats::jetstream::stream::ConsumerError) -> bool {
    matches!(
        e.kind(),
        async_nats::jetstream::stream::ConsumerErrorKind::JetStream(j)
            if j.error_code() == async_nats::jetstream::ErrorCode::CONSUMER_WQ_CONSUMER_NOT_UNIQUE
    )
}

/// Runs one server call, giving up after [`BROKER_CALL_LIMIT`].
pub async fn bounded<T, E: std::fmt::Display>(
    what: &str,
    call: impl Future<Output = std::result::Result<T, E>>,
) -> Result<T> {
    match tokio::time::timeout(BROKER_CALL_LIMIT, call).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(BrokerError::Stream {
            stream: what.to_string(),
            cause: e.to_string(),
        }),
        Err(_) => Err(BrokerError::TimedOut {
            what: what.to_string(),
        }),
    }
}

pub type Result<T, E = BrokerError> = std::result::Result<T, E>;

#[derive(Clone)]
pub struct Broker {
    pub client: async_nats::Client,
    pub js: jetstream::Context,
    cfg: NatsConfig,
}

/// Adds the configured authentication and TLS to `opts`. Files are read now, so a missing or
/// unreadable one is an error that names the setting and the file. The nkey seeds read are
/// added to `secrets`.
async fn auth_options(
    cfg: &NatsConfig,
    mut opts: async_nats::ConnectOptions,
    secrets: &mut Secrets,
) -> std::result::Result<async_nats::ConnectOptions, String> {
    // async-nats builds its TLS configuration from rustls' process-wide provider: make it
    // ring (the one this build uses), whatever else a program linking us enabled.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let readable = |key: &str, path: &str| -> std::result::Result<(), String> {
        std::fs::File::open(path)
            .map(|_| ())
            .map_err(|e| format!("cannot read nats.{key} {path}: {e}"))
    };
    if let Some(path) = &cfg.credentials_file {
        // Its seed line, to hide should anything echo it (async-nats reads the file itself).
        if let Ok(text) = std::fs::read_to_string(path) {
            for line in text.lines().map(str::trim).filter(|l| l.starts_with("SU")) {
                secrets.add(line);
            }
        }
        opts = opts
            .credentials_file(path)
            .await
            .map_err(|e| format!("cannot read nats.credentials_file {path}: {e}"))?;
    }
    if let Some(path) = &cfg.nkey_seed_file {
        let seed = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read nats.nkey_seed_file {path}: {e}"))?;
        let seed = seed.trim();
        secrets.add(seed);
        // A user seed starts "SU"; say so rather than let the handshake fail obscurely.
        if !seed.starts_with("SU") || seed.lines().count() != 1 {
            return Err(format!(
                "nats.nkey_seed_file {path} does not hold a user nkey seed (one line starting \
                 \"SU\", as `nsc`/`nk -gen user` write it)"
            ));
        }
        opts = opts.nkey(seed.to_string());
    }
    if let Some(token) = &cfg.token {
        opts = opts.token(token.clone());
    }
    if let (Some(user), Some(password)) = (&cfg.user, &cfg.password) {
        opts = opts.user_and_password(user.clone(), password.clone());
    }
    if let Some(ca) = &cfg.tls_ca_file {
        readable("tls_ca_file", ca)?;
        opts = opts.add_root_certificates(ca.into());
    }
    if let (Some(cert), Some(key)) = (&cfg.tls_cert_file, &cfg.tls_key_file) {
        readable("tls_cert_file", cert)?;
        readable("tls_key_file", key)?;
        opts = opts.add_client_certificate(cert.into(), key.into());
    }
    if cfg.tls_required {
        opts = opts.require_tls(true);
    }
    Ok(opts)
}

impl Broker {
    /// Connects (the client reconnects by itself afterwards) and checks that JetStream answers.
    pub async fn connect(cfg: &NatsConfig) -> Result<Broker> {
        // The URL is shown without its credentials, and whatever the client says is scrubbed
        // of every secret of the connection before it becomes part of an error.
        let redacted = crate::redact::url(&cfg.url);
        let mut secrets = Secrets::new();
        secrets.add_url(&cfg.url);
        for value in [&cfg.password, &cfg.token].into_iter().flatten() {
            secrets.add(value);
        }
        let opts = async_nats::ConnectOptions::new()
            .name("jobwarden")
            .connection_timeout(Duration::from_secs(5))
            .max_reconnects(None);
        let opts = auth_options(cfg, opts, &mut secrets).await;
        // The seeds read too are hidden from the process's log from now on.
        crate::redact::remember(&secrets);
        let opts = opts.map_err(|cause| BrokerError::Setting {
            cause: secrets.scrub(&cause).into_owned(),
        })?;
        let servers = cfg.servers().map_err(|cause| BrokerError::Setting {
            cause: secrets.scrub(&cause).into_owned(),
        })?;
        let client = opts.connect(servers).await.map_err(|e| {
            let (url, cause) = (redacted.clone(), secrets.scrub(&e.to_string()).into_owned());
            if connect_refused(&e) {
                BrokerError::Refused { url, cause }
            } else {
                BrokerError::Unreachable { url, cause }
            }
        })?;
        let js = jetstream::new(client.clone());
        // Ask the JetStream API directly: async-nats' typed account query does not parse
        // 2.9's answer, and all we need is "JetStream answers".
        let reply = client
            .request("$JS.API.INFO", "".into())
            .await
            .map_err(|e| BrokerError::NoJetStream {
                url: redacted.clone(),
                cause: secrets.scrub(&e.to_string()).into_owned(),
            })?;
        let info: serde_json::Value = serde_json::from_slice(&reply.payload).unwrap_or_default();
        if let Some(err) = info.get("error") {
            return Err(BrokerError::NoJetStream {
                url: redacted,
                cause: err.to_string(),
            });
        }
        Ok(Broker {
            client,
            js,
            cfg: cfg.clone(),
        })
    }

    /// How the connection authenticates and whether it is encrypted (never the secrets).
    pub fn security_line(&self) -> String {
        let c = &self.cfg;
        let auth = if let Some(p) = &c.credentials_file {
            format!("credentials file {p}")
        } else if let Some(p) = &c.nkey_seed_file {
            format!("nkey seed file {p}")
        } else if c.token.is_some() {
            "token".to_string()
        } else if let Some(u) = &c.user {
            format!("user {u} with password")
        } else if c.url.contains('@') {
            "credentials in the URL".to_string()
        } else {
            "none".to_string()
        };
        let tls = if self.client.server_info().tls_required
            || c.tls_required
            || c.url.starts_with("tls://")
        {
            let ca = c
                .tls_ca_file
                .as_deref()
                .map(|p| format!(", CA {p}"))
                .unwrap_or_else(|| ", CA from the system store".into());
            let cert = c
                .tls_cert_file
                .as_deref()
                .map(|p| format!(", client certificate {p}"))
                .unwrap_or_default();
            format!("on{ca}{cert}")
        } else {
            "off".to_string()
        };
        format!("NATS authentication: {auth}; TLS: {tls}")
    }

    /// Which server of the seed list the client joined, and what it says of its cluster.
    pub fn joined_line(&self) -> String {
        let info = self.client.server_info();
        let seeds = self
            .cfg
            .url
            .split(',')
            .filter(|s| !s.trim().is_empty())
            .count();
        let cluster = match &info.cluster {
            Some(name) => format!(
                "cluster {name}, advertising {} client URLs",
                info.connect_urls.len()
            ),
            None => "no cluster".to_string(),
        };
        format!(
            "NATS: joined server {} at {}:{} ({cluster}), from {seeds} seed{} ({})",
            info.server_name,
            info.host,
            info.port,
            if seeds == 1 { "" } else { "s" },
            crate::redact::url(&self.cfg.url)
        )
    }

    /// The server's version, e.g. "2.9.10".
    pub fn server_version(&self) -> String {
        self.client.server_info().version
    }

    /// One line saying which server features this worker relies on.
    pub fn features_line(&self) -> String {
        let v = self.server_version();
        let (major, minor) = parse_version(&v);
        let newer = (major, minor) >= (2, 10);
        format!(
            "nats-server {v} (max_payload {} bytes): using JetStream work-queue stream, durable \
             pull consumers with max_bytes pulls, explicit and in-progress acks, message dedup \
             (Nats-Msg-Id), STREAM.MSG.GET next_by_subj and MSG.DELETE (adoption, unserved \
             subjects), all available since 2.9; {}",
            self.max_payload(),
            if newer {
                "2.10+ detected (term reasons available; not required)"
            } else {
                "pre-2.10 server: term reasons are not sent (not required)"
            }
        )
    }

    pub fn stream_name(&self) -> &str {
        &self.cfg.stream
    }

    /// The largest message the server takes (payload plus headers).
    pub fn max_payload(&self) -> usize {
        self.client.server_info().max_payload
    }

    /// The subject prefix (`jobs`).
    pub fn subject_prefix(&self) -> &str {
        &self.cfg.subject_prefix
    }

    fn is_janitor_consumer(&self, name: &str, filter: &str) -> bool {
        is_janitor_leftover(&self.cfg.subject_prefix, name, filter)
    }

    /// The subject a queue's default-priority jobs are published to.
    pub fn subject(&self, queue: &str) -> String {
        Lane::bare(queue).subject(&self.cfg.subject_prefix)
    }

    /// The subject of a lane.
    pub fn lane_subject(&self, lane: &Lane) -> String {
        lane.subject(&self.cfg.subject_prefix)
    }

    /// Creates the stream if missing, or updates the settings jobwarden owns (subjects,
    /// duplicate window) while keeping an operator's other settings (replicas, limits).
    pub async fn provision_stream(&self) -> Result<()> {
        let name = self.cfg.stream.clone();
        let subjects = format!("{}.>", self.cfg.subject_prefix);
        let err = |cause: String| BrokerError::Stream {
            stream: name.clone(),
            cause,
        };
        match self.js.get_stream(&name).await {
            Ok(mut s) => {
                let info = s.info().await.map_err(|e| err(e.to_string()))?;
                let mut config = info.config.clone();
                if config.retention != stream::RetentionPolicy::WorkQueue {
                    return Err(BrokerError::WrongStream {
                        stream: name.clone(),
                        cause: format!(
                            "exists with retention {:?}; jobwarden needs a work-queue stream: \
                             delete it or set nats.stream to another name",
                            config.retention
                        ),
                    });
                }
                if config.num_replicas.max(1) < self.cfg.replicas {
                    warn!(
                        stream = %name,
                        "the stream keeps {} copies, nats.replicas asks for {}; jobwarden does \
                         not change an existing stream's replicas: `nats stream edit {name} \
                         --replicas {}` (or set nats.replicas to match)",
                        config.num_replicas.max(1),
                        self.cfg.replicas,
                        self.cfg.replicas
                    );
                }
                let mut changed = false;
                if !config.subjects.contains(&subjects) {
                    config.subjects.push(subjects);
                    changed = true;
                }
                if config.duplicate_window < self.cfg.duplicate_window {
                    config.duplicate_window = self.cfg.duplicate_window;
                    changed = true;
                }
                if changed {
                    self.js
                        .update_stream(config)
                        .await
                        .map_err(|e| err(e.to_string()))?;
                }
            }
            Err(_) => {
                self.js
                    .create_stream(stream::Config {
                        name: name.clone(),
                        subjects: vec![subjects],
                        retention: stream::RetentionPolicy::WorkQueue,
                        storage: stream::StorageType::File,
                        duplicate_window: self.cfg.duplicate_window,
                        num_replicas: self.cfg.replicas,
                        ..Default::default()
                    })
                    .await
                    .map_err(|e| err(e.to_string()))?;
                info!(stream = %name, replicas = self.cfg.replicas, "created stream");
            }
        }
        Ok(())
    }

    /// Creates or updates a queue's durable pull consumer. A consumer an older janitor left
    /// on the same subject (killed mid-round) would make the work-queue stream refuse it
    /// ("filtered consumer not unique"): such leftovers are deleted and the creation retried.
    pub async fn provision_consumer(&self, lane: &Lane) -> Result<consumer::PullConsumer> {
        let name = lane.consumer_name();
        let subject = self.lane_subject(lane);
        let stream = self.stream().await?;
        let config = consumer::pull::Config {
            durable_name: Some(name.clone()),
            filter_subject: subject.clone(),
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait: self.cfg.ack_wait,
            max_deliver: -1,
            max_ack_pending: self.cfg.max_ack_pending,
            max_waiting: 512,
            ..Default::default()
        };
        let err = |cause: String| BrokerError::Consumer {
            consumer: name.clone(),
            cause,
        };
        match stream.create_consumer(config.clone()).await {
            Ok(c) => return Ok(c),
            Err(e) if not_unique(&e) => {
                let cleared = self.clear_janitor_consumers(&stream, &subject).await;
                if cleared == 0 {
                    return Err(BrokerError::ConsumerConflict {
                        consumer: name.clone(),
                        cause: format!(
                            "{e}; another consumer on the stream filters {subject}: remove it \
                             (work-queue streams allow one consumer per subject)"
                        ),
                    });
                }
            }
            Err(e) => return Err(err(e.to_string())),
        }
        stream
            .create_consumer(config)
            .await
            .map_err(|e| err(e.to_string()))
    }

    /// Deletes consumers an older janitor left on `subject`; returns how many.
    async fn clear_janitor_consumers(&self, stream: &stream::Stream, subject: &str) -> usize {
        use futures::TryStreamExt;
        let infos: Vec<consumer::Info> = match stream.consumers().try_collect().await {
            Ok(i) => i,
            Err(e) => {
                warn!(cause = %e, "cannot list the stream's consumers");
                return 0;
            }
        };
        let mut n = 0;
        for c in infos {
            let filter = c.config.filter_subject.as_str();
            if filter == subject
                && self.is_janitor_consumer(&c.name, filter)
                && stream.delete_consumer(&c.name).await.is_ok()
            {
                warn!(consumer = %c.name, %subject, "deleted a consumer an older janitor left behind");
                n += 1;
            }
        }
        n
    }

    /// Gets a queue's existing consumer (when provisioning is off).
    pub async fn consumer(&self, lane: &Lane) -> Result<consumer::PullConsumer> {
        let name = lane.consumer_name();
        let stream = self.stream().await?;
        let get = tokio::time::timeout(BROKER_CALL_LIMIT, stream.get_consumer(&name));
        match get.await {
            Ok(r) => r.map_err(|e| BrokerError::Consumer {
                consumer: name.clone(),
                cause: format!(
                    "{e}; create it (filter {}) or enable nats.provision",
                    self.lane_subject(lane)
                ),
            }),
            Err(_) => Err(BrokerError::TimedOut {
                what: format!("consumer {name}"),
            }),
        }
    }

    /// The queue's consumer, created again (with the stream, if that is gone too) when an
    /// operator deleted it and provisioning is on.
    pub async fn consumer_or_provision(&self, lane: &Lane) -> Result<consumer::PullConsumer> {
        match self.consumer(lane).await {
            Ok(c) => Ok(c),
            Err(e) if self.cfg.provision && !matches!(e, BrokerError::TimedOut { .. }) => {
                warn!(%lane, cause = %e, "the lane's consumer is gone; provisioning it again");
                // A stream deleted a moment ago is still being removed on the server, and
                // nats-server 2.9 breaks a stream created again before that is done (its
                // consumers can no longer read its messages). Wait, with jitter so pods do
                // not race each other, and let an operator's own re-creation win.
                let jitter = Duration::from_millis(rand::random::<u64>() % 1000);
                tokio::time::sleep(RECREATE_AFTER + jitter).await;
                let again = async {
                    self.provision_stream().await?;
                    self.provision_consumer(lane).await
                };
                match tokio::time::timeout(2 * BROKER_CALL_LIMIT, again).await {
                    Ok(r) => r,
                    Err(_) => Err(BrokerError::TimedOut {
                        what: format!("provisioning queue {lane}"),
                    }),
                }
            }
            Err(e) => Err(e),
        }
    }

    pub async fn stream(&self) -> Result<stream::Stream> {
        let get = tokio::time::timeout(BROKER_CALL_LIMIT, self.js.get_stream(&self.cfg.stream));
        match get.await {
            Ok(r) => r.map_err(|e| BrokerError::Stream {
                stream: self.cfg.stream.clone(),
                cause: format!("{e}; create it or enable nats.provision"),
            }),
            Err(_) => Err(BrokerError::TimedOut {
                what: format!("stream {}", self.cfg.stream),
            }),
        }
    }

    /// The encoded message of a job envelope with `Nats-Msg-Id: <id>:<generation>`, checked
    /// against the server's max_payload (a message over it can never be published:
    /// [`BrokerError::TooLarge`]).
    pub fn job_message(
        &self,
        envelope: &Envelope,
        generation: i32,
    ) -> Result<(HeaderMap, bytes::Bytes)> {
        let msg_id = envelope.id.as_ref().map(|id| format!("{id}:{generation}"));
        self.message(envelope, msg_id.as_deref())
    }

    /// The encoded message of an envelope with the given `Nats-Msg-Id`.
    fn message(
        &self,
        envelope: &Envelope,
        msg_id: Option<&str>,
    ) -> Result<(HeaderMap, bytes::Bytes)> {
        let body = serde_json::to_vec(envelope).expect("an envelope always serialises");
        let id = envelope.id.clone().unwrap_or_default();
        let mut headers = HeaderMap::new();
        // The contract keeps CR and LF out of ids, but a row may predate it:
        // the checked constructor, never the one that panics (inside a service, or inside the
        // NATS client's own task).
        let value = |name: &str, v: &str| {
            async_nats::HeaderValue::from_str(v).map_err(|e| BrokerError::Unpublishable {
                id: id.clone(),
                reason: format!("{name} {v:?} cannot be a header value ({e})"),
            })
        };
        if let Some(m) = msg_id {
            headers.insert(
                async_nats::header::NATS_MESSAGE_ID,
                value("its Nats-Msg-Id", m)?,
            );
        }
        // Headers travel in the same frame and count against max_payload.
        // As async-nats counts them: "NATS/1.0\r\n", each "Name: value\r\n", then "\r\n".
        let header_len = if headers.is_empty() {
            0
        } else {
            let mut n = 12;
            for (name, values) in headers.iter() {
                let name: &str = name.as_ref();
                n += values
                    .iter()
                    .map(|v| name.len() + v.as_str().len() + 4)
                    .sum::<usize>();
            }
            n
        };
        let size = body.len() + header_len;
        let limit = self.max_payload();
        if size > limit {
            return Err(BrokerError::TooLarge { id, size, limit });
        }
        Ok((headers, body.into()))
    }

    /// Publishes a job envelope with `Nats-Msg-Id: <id>:<generation>` and returns the
    /// stream's acknowledgement future. A new generation per republish keeps JetStream's
    /// duplicate window from silently dropping a legitimate republish. The send is bounded;
    /// the caller bounds its wait for the acknowledgement.
    pub async fn publish_job(
        &self,
        queue: &str,
        envelope: &Envelope,
        generation: i32,
    ) -> Result<jetstream::context::PublishAckFuture> {
        let priority = envelope.priority.unwrap_or(DEFAULT_PRIORITY);
        let subject = self.lane_subject(&Lane::of(queue, priority));
        let (headers, body) = self.job_message(envelope, generation)?;
        let send = self.js.publish_with_headers(subject.clone(), headers, body);
        match tokio::time::timeout(BROKER_CALL_LIMIT, send).await {
            Ok(r) => r.map_err(|e| BrokerError::Publish {
                subject,
                cause: e.to_string(),
            }),
            Err(_) => Err(BrokerError::TimedOut {
                what: format!("publish to {subject}"),
            }),
        }
    }

    /// Publishes a job and waits (bounded) for the stream to confirm it.
    pub async fn publish_job_confirmed(
        &self,
        queue: &str,
        envelope: &Envelope,
        generation: i32,
    ) -> Result<jetstream::publish::PublishAck> {
        let ack = self.publish_job(queue, envelope, generation).await?;
        let priority = envelope.priority.unwrap_or(DEFAULT_PRIORITY);
        bounded(
            &format!(
                "publish to {}",
                self.lane_subject(&Lane::of(queue, priority))
            ),
            std::future::IntoFuture::into_future(ack),
        )
        .await
    }

    /// Where a lane's consumer stands in the stream (see [`StreamPosition`]).
    pub async fn stream_position(&self, lane: &Lane) -> Result<StreamPosition> {
        let mut consumer = self.consumer(lane).await?;
        let info = bounded("consumer info", consumer.info()).await?.clone();
        let mut stream = self.stream().await?;
        let sinfo = bounded("stream info", stream.info()).await?;
        let first = sinfo.state.first_sequence;
        // Nothing left to deliver: every message of the subject up to the end was delivered
        // (or purged, e.g. by a purge filtered on the subject, which moves no first sequence).
        let gone_upto = if info.num_pending == 0 {
            sinfo.state.last_sequence
        } else {
            info.delivered.stream_sequence.max(first.saturating_sub(1))
        };
        Ok(StreamPosition {
            gone_upto,
            last_seq: sinfo.state.last_sequence,
            created: system_time(&sinfo.created),
            ack_pending: info.num_ack_pending,
            ack_floor: info.ack_floor.stream_sequence,
            delivered: info.delivered.stream_sequence,
            undelivered: info.num_pending,
        })
    }

    /// The first message on `subject` at or after sequence `from`, read straight from the
    /// stream (no consumer involved); `None` when there is none. The request is made here
    /// rather than through async-nats' message getter, which refuses (or, delivered through
    /// a subscription, panics on) headers it cannot hold: those are read leniently and
    /// reported in [`StoredMessage::unreadable`].
    pub async fn first_message(
        &self,
        _stream: &stream::Stream,
        subject: &str,
        from: u64,
    ) -> Result<Option<StoredMessage>> {
        #[derive(serde::Deserialize)]
        struct Answer {
            message: Option<Raw>,
            error: Option<ApiError>,
        }
        #[derive(serde::Deserialize)]
        struct ApiError {
            err_code: Option<u64>,
            description: Option<String>,
        }
        #[derive(serde::Deserialize)]
        struct Raw {
            subject: String,
            seq: u64,
            #[serde(default)]
            data: String,
            #[serde(default)]
            hdrs: Option<String>,
            time: String,
        }
        use base64::Engine;
        let what = format!("read of {subject} from sequence {from}");
        let request = serde_json::json!({"seq": from.max(1), "next_by_subj": subject});
        let answer: Answer = bounded(
            &what,
            self.js
                .request(format!("STREAM.MSG.GET.{}", self.cfg.stream), &request),
        )
        .await?;
        if let Some(e) = answer.error {
            if e.err_code == Some(jetstream::ErrorCode::NO_MESSAGE_FOUND.0) {
                return Ok(None);
            }
            return Err(BrokerError::Stream {
                stream: self.cfg.stream.clone(),
                cause: format!("{what}: {}", e.description.unwrap_or_default()),
            });
        }
        let Some(m) = answer.message else {
            return Ok(None);
        };
        let b64 = base64::engine::general_purpose::STANDARD;
        let corrupt = |e: String| BrokerError::Stream {
            stream: self.cfg.stream.clone(),
            cause: format!("{what}: {e}"),
        };
        let payload = b64.decode(&m.data).map_err(|e| corrupt(e.to_string()))?;
        let (headers, unreadable) = match &m.hdrs {
            Some(h) => parse_stored_headers(&b64.decode(h).map_err(|e| corrupt(e.to_string()))?),
            None => (HeaderMap::new(), None),
        };
        let stored = chrono::DateTime::parse_from_rfc3339(&m.time)
            .map_err(|e| corrupt(format!("time {:?}: {e}", m.time)))?;
        Ok(Some(StoredMessage {
            subject: m.subject,
            seq: m.seq,
            stored_ns: stored.timestamp_nanos_opt().unwrap_or(i64::MAX).into(),
            headers,
            payload: payload.into(),
            unreadable,
        }))
    }

    /// Deletes one message from the stream (bounded).
    pub async fn delete_message(&self, stream: &stream::Stream, seq: u64) -> Result<bool> {
        bounded("delete message", stream.delete_message(seq)).await
    }
}

/// Is consumer `name` with filter `filter` one an older janitor created (and may have left
/// behind)? A queue named `orphans-x` has the consumer `jobwarden-orphans-x` too, but its
/// filter is `<prefix>.orphans-x`, so it is never taken for one.
fn is_janitor_leftover(prefix: &str, name: &str, filter: &str) -> bool {
    name.strip_prefix(OLD_JANITOR_PREFIX)
        .is_some_and(|rest| filter != format!("{prefix}.orphans-{rest}"))
}

fn parse_version(v: &str) -> (u32, u32) {
    let mut it = v.trim_start_matches('v').split('.');
    let major = it.next().and_then(|s| s.parse().ok()).unwrap_or(0);
    let minor = it.next().and_then(|s| s.parse().ok()).unwrap_or(0);
    (major, minor)
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_old_janitor_consumer_is_told_from_a_queue_named_orphans() {
        use super::is_janitor_leftover;
        assert!(is_janitor_leftover(
            "jobs",
            "jobwarden-orphans-email",
            "jobs.email"
        ));
        // The queue `orphans-email` is served by `jobwarden-orphans-email` too.
        assert!(!is_janitor_leftover(
            "jobs",
            "jobwarden-orphans-email",
            "jobs.orphans-email"
        ));
        assert!(!is_janitor_leftover(
            "jobs",
            "jobwarden-email",
            "jobs.email"
        ));
    }

    #[test]
    fn versions_parse() {
        assert_eq!(super::parse_version("2.9.10"), (2, 9));
        assert_eq!(super::parse_version("v2.15.1"), (2, 15));
        assert_eq!(super::parse_version("junk"), (0, 0));
    }
}
