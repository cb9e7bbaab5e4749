//! PostgreSQL: the only module that talks to the database. Every statement lives in
//! `src/store/sql/<method>.sql`, and each method is named after the table and the transition
//! it makes (`job_claim`, `job_settle`, `worker_beat`).
//!
//! Connections come from a deadpool pool built on a `tokio_postgres::Config` (so TCP
//! keepalives and timeouts can be set), with `search_path` set to the configured schema.

mod chain;
mod cron;
mod dashboard;
mod flow;
mod inspect;
mod jobs;
mod liveness;
mod messages;
mod ops;
pub mod tls;
pub use chain::{ChainRound, PipelineJob};
pub use dashboard::{
    Bounded, JobFilter, JobSummary, QueueOverview, ScheduledJob, DASHBOARD_QUERY_LIMIT,
};
pub use flow::Grant;
pub use inspect::{AttemptRow, JobRow};
pub use liveness::{Reclaimed, Registration};
pub use messages::{UnservedRow, PUBLISH_RETRY};
pub use ops::{QueueStats, WorkerRow};

use crate::config::DatabaseConfig;
use crate::job::{JobStatus, NewJob};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use serde_json::Value;
use std::str::FromStr;
use std::time::Duration;
use tokio_postgres_rustls::MakeRustlsConnect;

mod embedded {
    refinery::embed_migrations!("./migrations");
}

/// The schema's migrations, in order. Most are the files of `migrations/` as they are; a
/// template (`V14__one_contract.sql`, whose `{{NAME}}` placeholders are the job contract's
/// limits) is rendered from `crate::contract` first, so the SQL checks and the Rust checks
/// read one source of truth. (A rendered template is fixed once applied: refinery refuses a
/// database whose applied migration differs, so a changed limit takes a new migration.)
fn migrations() -> Vec<refinery::Migration> {
    embedded::migrations::runner()
        .get_migrations()
        .iter()
        .map(|m| match m.sql() {
            Some(sql) if sql.contains("{{") => {
                let name = format!("V{}__{}", m.version(), m.name());
                refinery::Migration::unapplied(&name, &crate::contract::render_sql(sql))
                    .expect("a rendered migration keeps its name")
            }
            _ => m.clone(),
        })
        .collect()
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("PostgreSQL at {target} is unreachable: {cause}; check database.url and that the server is running")]
    Unreachable { target: String, cause: String },
    #[error("PostgreSQL at {target}: the TLS handshake failed: {cause}; check database.url's sslmode and sslrootcert (the CA that signed the server's certificate), and that its host is a name the certificate was issued for (verify-full)")]
    Tls { target: String, cause: String },
    #[error("PostgreSQL at {target} refused the connection: {reason}; check database.url (user, password, database name) and the server's pg_hba.conf")]
    Refused { target: String, reason: String },
    #[error("database error: {}", describe_db_error(.0))]
    Db(#[from] tokio_postgres::Error),
    #[error("database pool: {0}")]
    Pool(String),
    #[error("migration failed: {0}")]
    Migrate(String),
    #[error("schema {schema} is at migration {have}, this build needs {need}: run `jobwarden migrate` (a role allowed to migrate), or set worker.migrate = true")]
    SchemaBehind {
        schema: String,
        have: i32,
        need: i32,
    },
    #[error("database.url is invalid: {0}")]
    BadUrl(String),
    /// A fenced write matched no row: the job was taken from this owner.
    #[error("job {job_id}: lease {lease} is no longer held by this worker (ownership lost)")]
    LostOwnership { job_id: String, lease: i64 },
}

/// The server's own words for an error (message, detail, hint), not tokio-postgres's
/// generic "db error".
fn describe_db_error(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => {
            let mut s = db.message().to_string();
            if let Some(d) = db.detail() {
                s.push_str(&format!(" ({d})"));
            }
            if let Some(h) = db.hint() {
                s.push_str(&format!("; hint: {h}"));
            }
            s
        }
        None => e.to_string(),
    }
}

/// A connection that failed before the server could say why: the network, or TLS (whose
/// reason is in the error's sources, e.g. "invalid peer certificate: UnknownIssuer").
fn unreachable(target: &str, e: &tokio_postgres::Error) -> StoreError {
    let mut cause = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let text = s.to_string();
        if !cause.contains(&text) {
            cause.push_str(": ");
            cause.push_str(&text);
        }
        source = s.source();
    }
    if cause.contains("TLS") {
        StoreError::Tls {
            target: target.to_string(),
            cause,
        }
    } else {
        StoreError::Unreachable {
            target: target.to_string(),
            cause,
        }
    }
}

/// Errors of a server that is starting up, shutting down or out of connections (SQLSTATE
/// classes 08, 53, 57): worth waiting for, unlike a refusal.
fn is_transient(e: &tokio_postgres::Error) -> bool {
    e.as_db_error()
        .is_some_and(|db| matches!(&db.code().code()[..2], "08" | "53" | "57"))
}

impl StoreError {
    /// The error with `secrets` masked in every text it carries (the typed database error
    /// is the server's, which never repeats a password).
    fn scrubbed(self, secrets: &crate::redact::Secrets) -> StoreError {
        let clean = |s: String| secrets.scrub(&s).into_owned();
        match self {
            StoreError::Unreachable { target, cause } => StoreError::Unreachable {
                target,
                cause: clean(cause),
            },
            StoreError::Tls { target, cause } => StoreError::Tls {
                target,
                cause: clean(cause),
            },
            StoreError::Refused { target, reason } => StoreError::Refused {
                target,
                reason: clean(reason),
            },
            StoreError::Pool(m) => StoreError::Pool(clean(m)),
            StoreError::BadUrl(m) => StoreError::BadUrl(clean(m)),
            other => other,
        }
    }

    /// The server went away or is restarting (a closed connection, an unreachable server,
    /// SQLSTATE classes 08, 53, 57): worth doing again once it is back.
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::Unreachable { .. } => true,
            StoreError::Db(e) => e.is_closed() || e.as_db_error().is_none() || is_transient(e),
            StoreError::Migrate(m) => {
                m.contains("connection closed") || m.contains("error communicating")
            }
            _ => false,
        }
    }

    /// PostgreSQL refused a row because a unique index holds its key already.
    pub fn is_unique_violation(&self) -> bool {
        let StoreError::Db(e) = self else {
            return false;
        };
        e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION)
    }

    /// PostgreSQL's reason when it refused the data of a statement rather than failing to
    /// run it: a data exception (class 22: a value out of range, an invalid byte sequence),
    /// an integrity constraint (class 23), a program limit (class 54: a value too large) or
    /// an exception a trigger raised (P0001). `None` for connection and server failures and
    /// for errors no data causes (a missing column): those are worth retrying, not blaming
    /// on one job.
    pub fn rejected_data(&self) -> Option<String> {
        let StoreError::Db(e) = self else { return None };
        let db = e.as_db_error()?;
        let code = db.code().code();
        (matches!(&code[..2], "22" | "23" | "54") || code == "P0001")
            .then(|| format!("{} (SQLSTATE {code})", db.message()))
    }
}

impl From<deadpool_postgres::PoolError> for StoreError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        StoreError::Pool(e.to_string())
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// One message of a claim batch (or an adoption), with the queue's defaults filled in.
#[derive(Debug, Clone)]
pub struct ClaimInput {
    pub job: NewJob,
    pub max_attempts: i32,
    /// The message's `traceparent` header, kept with the job for every attempt.
    pub traceparent: Option<String>,
}

/// What the claim statement made of a batch: one answer per input, in input order.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimAnswer {
    /// False when this worker is not registered (others declared it dead): nothing was
    /// claimed or inserted, and every answer is [`Claim::Duplicate`].
    pub alive: bool,
    pub claims: Vec<Claim>,
}

/// What the claim statement made of one message.
#[derive(Debug, Clone, PartialEq)]
pub enum Claim {
    /// This worker owns the job now under `lease`. `payload` is the row's payload when the
    /// row existed before (Postgres is the truth), `None` when it was created from the message.
    Claimed {
        lease: i64,
        attempt: i32,
        max_attempts: i32,
        timeout_ms: Option<i32>,
        payload: Option<Value>,
        /// The job's own backoff, if it has one.
        backoff: Option<crate::backoff::Backoff>,
        /// The trace context stored with the job.
        traceparent: Option<String>,
        /// The row existed with another payload than the message's: the message is
        /// another job that reused this id.
        conflict: bool,
    },
    /// The job exists and is not claimable now (terminal, running elsewhere, or waiting).
    /// `conflict`: it holds another payload than the message's.
    NotClaimable { status: JobStatus, conflict: bool },
    /// No row came back: another transaction inserted this id or idempotency key concurrently.
    Duplicate,
    /// The id belongs to a job of another queue.
    WrongQueue(String),
}

/// A finished attempt to record.
#[derive(Debug, Clone)]
pub struct SettleInput {
    pub id: String,
    pub lease: i64,
    pub status: JobStatus,
    pub delay: Duration,
    pub error: Option<String>,
    pub result: Option<Value>,
    /// What the attempts table says of this attempt (`completed`, `retry`, `dead`, …).
    pub outcome: &'static str,
    /// A graceful release gives the attempt back.
    pub refund: bool,
}

impl SettleInput {
    /// An attempt that completed its job with no error and nothing refunded: what
    /// `job_settle_completed.sql` writes (and `job_settle.sql` writes the same way).
    pub fn is_plain_completion(&self) -> bool {
        self.status == JobStatus::Completed
            && self.outcome == "completed"
            && self.error.is_none()
            && !self.refund
    }
}

/// A scheduled job that became due, locked for publishing.
#[derive(Debug, Clone)]
pub struct DueJob {
    pub id: String,
    pub queue: String,
    pub payload: Value,
    pub priority: i16,
    pub max_attempts: i32,
    pub timeout_ms: Option<i32>,
    pub generation: i32,
}

/// What became of one round of due jobs handed to the publisher.
#[derive(Debug, Clone, Default)]
pub struct PublishReport {
    /// Taken by the stream: (id, stream sequence).
    pub published: Vec<(String, u64)>,
    /// Answered `duplicate`: their message id was taken; published again next round under
    /// the next generation.
    pub duplicates: Vec<String>,
    /// Failed for now (broker unreachable, timed out): retried after a short wait.
    pub failed: Vec<String>,
    /// Can never be published (over the server's max_payload, or refused by the job
    /// contract): (id, reason), dead-lettered.
    pub unpublishable: Vec<(String, String)>,
    /// Why the first failed publish failed (for the log).
    pub first_error: Option<String>,
}

/// What one round of the scheduler did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DueRound {
    pub locked: usize,
    pub published: usize,
    pub duplicates: usize,
    pub failed: usize,
    /// Dead-lettered as unpublishable: (id, queue, reason).
    pub dead: Vec<(String, String, String)>,
    /// Why the first failed publish failed.
    pub first_error: Option<String>,
}

/// Result of an enqueue through the store.
#[derive(Debug, Clone, PartialEq)]
pub struct Enqueued {
    pub id: String,
    pub status: JobStatus,
    /// False when the id or idempotency key existed already (the existing job is returned).
    pub created: bool,
    pub generation: i32,
    /// Whether the job holds the payload that was enqueued (always, when created).
    pub same_payload: bool,
}

/// Connections for operator queries, per process.
const OPS_POOL_SIZE: usize = 4;

#[derive(Clone)]
pub struct Store {
    pool: Pool,
    /// Connections planned with PostgreSQL's defaults, for operator queries: the worker's
    /// own connections discourage seq scans and nested loops, which suits its key lookups
    /// and batch joins but not a report over the whole table.
    ops_pool: Pool,
    schema: String,
    target: String,
    /// How to open a connection of its own (LISTEN cannot use a pooled one).
    pg: tokio_postgres::Config,
    tls: MakeRustlsConnect,
    /// The TLS settings, for the start-up log ("sslmode verify-full, CA /etc/ca.pem").
    tls_line: String,
}

impl Store {
    /// Builds the pool and checks that the server answers. The errors name the server
    /// (`host:port/db`), never the URL's password: whatever a parser or the client says is
    /// scrubbed of it.
    pub async fn connect(cfg: &DatabaseConfig) -> Result<Store> {
        let mut secrets = crate::redact::Secrets::new();
        secrets.add_url(&cfg.url);
        Store::open(cfg).await.map_err(|e| e.scrubbed(&secrets))
    }

    async fn open(cfg: &DatabaseConfig) -> Result<Store> {
        let (url, tls) = tls::PgTls::split(&cfg.url).map_err(StoreError::BadUrl)?;
        let mut pg = tokio_postgres::Config::from_str(&url).map_err(|e| {
            StoreError::BadUrl(format!("{e}; expected postgres://user@host:5432/db"))
        })?;
        pg.ssl_mode(tls.pg_mode());
        let tls_line = tls.describe();
        let connector = tls.connector().map_err(StoreError::BadUrl)?;
        // The worker's own connections plan without seq scans and nested loops. A jobs table
        // that grows fast is often not analyzed yet, and a statement's generic plan is cached
        // from whatever size the table had when it was made: measured, the settle's cached plan
        // then became a nested loop that unnests the whole batch again for every job row
        // (290 ms per settle, 3,430 jobs/s instead of 30,000). Every hot-path statement is a
        // key lookup or a hash join between a batch and the rows it names, so seq scans and
        // nested loops are discouraged there (still used where nothing else applies).
        // Operator queries (dashboard, `jobs`, `stats`, `workers`, `dlq`) plan normally, on
        // connections of their own (see `ops_pool`).
        //
        // JIT is off: these statements run in a millisecond, and the disabled plan types above
        // add a huge cost that would push every one of them past the JIT thresholds, making
        // PostgreSQL compile machine code for each execution (hundreds of ms).
        let mut ops_pg = pg.clone();
        ops_pg.options(format!("-c search_path={} -c jit=off", cfg.schema));
        pg.options(format!(
            "-c search_path={} -c enable_seqscan=off -c enable_nestloop=off -c jit=off",
            cfg.schema
        ));
        for c in [&mut pg, &mut ops_pg] {
            c.connect_timeout(cfg.connect_timeout)
                .keepalives(true)
                .keepalives_idle(Duration::from_secs(10))
                .keepalives_interval(Duration::from_secs(5))
                .keepalives_retries(3)
                .tcp_user_timeout(Duration::from_secs(30))
                .application_name("jobwarden");
        }
        let target = describe_target(&pg);
        let pool_of = |pg: &tokio_postgres::Config, size: usize| {
            let mgr = Manager::from_config(
                pg.clone(),
                connector.clone(),
                ManagerConfig {
                    recycling_method: RecyclingMethod::Fast,
                },
            );
            Pool::builder(mgr)
                .max_size(size)
                .runtime(Runtime::Tokio1)
                .wait_timeout(Some(Duration::from_secs(30)))
                .create_timeout(Some(cfg.connect_timeout))
                .recycle_timeout(Some(Duration::from_secs(5)))
                .build()
                .map_err(|e| StoreError::Pool(e.to_string()))
        };
        let pool = pool_of(&pg, cfg.pool_size)?;
        // Connections are opened when first asked for: a worker nobody inspects opens none.
        let ops_pool = pool_of(&ops_pg, OPS_POOL_SIZE)?;
        let store = Store {
            pool,
            ops_pool,
            schema: cfg.schema.clone(),
            target,
            pg,
            tls: connector,
            tls_line,
        };
        store.ping().await?;
        Ok(store)
    }

    /// Listens for `NOTIFY jobwarden_enqueue` from this schema's `enqueue()` (sent when the
    /// enqueuing transaction commits) on a connection of its own. Returns the receiver, which
    /// gets one message per wake-up (several notifications may fold into one), and the
    /// connection's driver, which the caller spawns (under its supervisor: a panic in it is
    /// the caller's failure). The driver subscribes, then ends — closing the receiver — when
    /// the connection ends, the subscription fails, or the receiver is dropped: open it
    /// again then.
    pub async fn listen_enqueues(
        &self,
    ) -> Result<(
        tokio::sync::mpsc::Receiver<()>,
        impl std::future::Future<Output = ()> + Send + 'static,
    )> {
        use futures::StreamExt;
        let (client, mut conn) = self
            .pg
            .connect(self.tls.clone())
            .await
            .map_err(|e| unreachable(&self.target, &e))?;
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let schema = self.schema.clone();
        let driver = async move {
            let mut messages = futures::stream::poll_fn(move |cx| conn.poll_message(cx));
            let drive = async {
                loop {
                    tokio::select! {
                        _ = tx.closed() => return,
                        m = messages.next() => match m {
                            Some(Ok(tokio_postgres::AsyncMessage::Notification(n)))
                                if n.payload() == schema =>
                            {
                                let _ = tx.try_send(());
                            }
                            Some(Ok(_)) => {}
                            Some(Err(_)) | None => return,
                        },
                    }
                }
            };
            tokio::pin!(drive);
            // The statement only progresses while the connection is driven: both at once.
            tokio::select! {
                _ = &mut drive => return,
                subscribed = client.batch_execute("LISTEN jobwarden_enqueue") => {
                    if subscribed.is_err() {
                        return;
                    }
                }
            }
            // The connection lives as long as its client: kept until the driver ends.
            drive.await;
            drop(client);
        };
        Ok((rx, driver))
    }

    /// Where the store points, for messages ("127.0.0.1:5432/test").
    pub fn target(&self) -> &str {
        &self.target
    }

    /// The connection's TLS settings, e.g. "sslmode verify-full, CA /etc/ca.pem".
    pub fn tls_line(&self) -> &str {
        &self.tls_line
    }

    pub fn schema(&self) -> &str {
        &self.schema
    }

    async fn client(&self) -> Result<deadpool_postgres::Object> {
        self.pooled(&self.pool).await
    }

    /// A pooled client for operator queries (dashboard, inspection, stats): planned with
    /// PostgreSQL's defaults, unlike the worker's own connections ([`Store::raw`]).
    pub async fn ops(&self) -> Result<deadpool_postgres::Object> {
        self.pooled(&self.ops_pool).await
    }

    async fn pooled(&self, pool: &Pool) -> Result<deadpool_postgres::Object> {
        pool.get().await.map_err(|e| match e {
            deadpool_postgres::PoolError::Backend(err) if err.as_db_error().is_none() => {
                unreachable(&self.target, &err)
            }
            // Starting up, shutting down, out of connections: a passing state, retried.
            deadpool_postgres::PoolError::Backend(err) if is_transient(&err) => {
                StoreError::Unreachable {
                    target: self.target.clone(),
                    cause: describe_db_error(&err),
                }
            }
            // The server answered and said no (no such database, authentication): say why.
            deadpool_postgres::PoolError::Backend(err) => StoreError::Refused {
                target: self.target.clone(),
                reason: describe_db_error(&err),
            },
            deadpool_postgres::PoolError::Timeout(_) => StoreError::Unreachable {
                target: self.target.clone(),
                cause: "timed out connecting".into(),
            },
            other => other.into(),
        })
    }

    /// The database's clock (every due-time and staleness comparison uses it — invariant 4).
    pub async fn db_now(&self) -> Result<std::time::SystemTime> {
        Ok(self
            .client()
            .await?
            .query_one("SELECT now()", &[])
            .await?
            .get(0))
    }

    pub async fn ping(&self) -> Result<()> {
        self.client().await?.simple_query("SELECT 1").await?;
        Ok(())
    }

    /// Opens `connections` of the pool (at most its size) and prepares the hot path's
    /// statements on each (the claims and the settles), so that the first jobs after a start
    /// do not wait for a backend to be started and authenticated, nor for a statement to be
    /// parsed (measured at 5,000 jobs/s: a fresh worker's first claims took up to 9 ms cold,
    /// up to 2.5 ms warmed; 0.5 ms is typical). Returns how many connections it warmed.
    pub async fn warm_up(&self, connections: usize) -> Result<usize> {
        let n = connections.min(self.pool.status().max_size);
        let clients = futures::future::try_join_all((0..n).map(|_| self.client())).await?;
        futures::future::try_join_all(clients.iter().map(|c| async move {
            for sql in HOT_SQL {
                c.prepare_cached(sql).await?;
            }
            Ok::<_, StoreError>(())
        }))
        .await?;
        Ok(n)
    }

    /// Creates the schema and applies pending migrations, under an advisory lock so pods
    /// starting together do not race (refinery takes no lock of its own).
    pub async fn migrate(&self) -> Result<usize> {
        let mut client = self.client().await?;
        let key = format!("jobwarden.migrate.{}", self.schema);
        client
            .execute("SELECT pg_advisory_lock(hashtext($1))", &[&key])
            .await?;
        let outcome = async {
            client
                .batch_execute(&format!(
                    "CREATE SCHEMA IF NOT EXISTS \"{0}\"; SET search_path TO \"{0}\"",
                    self.schema
                ))
                .await?;
            // An older build starting during a rolling deploy finds migrations it does not
            // know (applied by a newer one): they only add, so it runs on, not aborts.
            let report = refinery::Runner::new(&migrations())
                .set_abort_missing(false)
                .set_migration_table_name("jobwarden_migrations")
                .run_async(&mut **client)
                .await
                .map_err(|e| StoreError::Migrate(e.to_string()))?;
            Ok::<_, StoreError>(report.applied_migrations().len())
        }
        .await;
        client
            .execute("SELECT pg_advisory_unlock(hashtext($1))", &[&key])
            .await?;
        outcome
    }

    /// The schema version this build needs (its highest migration).
    pub fn required_version() -> i32 {
        migrations().iter().map(|m| m.version()).max().unwrap_or(0)
    }

    /// The schema version applied (highest migration), or 0.
    pub async fn schema_version(&self) -> Result<i32> {
        let client = self.client().await?;
        let row = client
            .query_opt("SELECT max(version)::int4 FROM jobwarden_migrations", &[])
            .await;
        match row {
            Ok(Some(r)) => Ok(r.get::<_, Option<i32>>(0).unwrap_or(0)),
            Ok(None) => Ok(0),
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) => Ok(0),
            Err(e) => Err(e.into()),
        }
    }

    /// Drops the whole schema (tests, `jobwarden demo` clean-up).
    pub async fn drop_schema(&self) -> Result<()> {
        self.client()
            .await?
            .batch_execute(&format!(
                "DROP SCHEMA IF EXISTS \"{}\" CASCADE",
                self.schema
            ))
            .await?;
        Ok(())
    }

    /// A raw pooled client of the worker's own connections (seq scans and nested loops
    /// discouraged), for tests and internal statements.
    pub async fn raw(&self) -> Result<deadpool_postgres::Object> {
        self.client().await
    }
}

fn describe_target(pg: &tokio_postgres::Config) -> String {
    let host = pg
        .get_hosts()
        .first()
        .map(|h| match h {
            tokio_postgres::config::Host::Tcp(s) => s.clone(),
            tokio_postgres::config::Host::Unix(p) => p.display().to_string(),
        })
        .unwrap_or_else(|| "localhost".into());
    let port = pg.get_ports().first().copied().unwrap_or(5432);
    let db = pg.get_dbname().unwrap_or("postgres");
    format!("{host}:{port}/{db}")
}

/// The claim and settle statements: the ones every job goes through. The hot path prepares
/// these very texts, so the warm-up's statements are the ones it finds cached.
const JOB_CLAIM_NEW_SQL: &str = include_str!("sql/job_claim_new.sql");
const JOB_CLAIM_SQL: &str = include_str!("sql/job_claim.sql");
const JOB_SETTLE_COMPLETED_SQL: &str = include_str!("sql/job_settle_completed.sql");
const JOB_SETTLE_SQL: &str = include_str!("sql/job_settle.sql");

/// The statements every job goes through, prepared on each connection at start
/// ([`Store::warm_up`]).
pub const HOT_SQL: &[&str] = &[
    JOB_CLAIM_NEW_SQL,
    JOB_CLAIM_SQL,
    JOB_SETTLE_COMPLETED_SQL,
    JOB_SETTLE_SQL,
];

/// Every statement file, for the test that prepares them all against the migrated schema.
pub const ALL_SQL: &[(&str, &str)] = &[
    ("job_explain", include_str!("sql/job_explain.sql")),
    ("flow_started", include_str!("sql/flow_started.sql")),
    ("flow_done", include_str!("sql/flow_done.sql")),
    ("job_claim", JOB_CLAIM_SQL),
    ("job_claim_new", JOB_CLAIM_NEW_SQL),
    ("job_settle", JOB_SETTLE_SQL),
    ("job_settle_completed", JOB_SETTLE_COMPLETED_SQL),
    (
        "job_settled_check",
        include_str!("sql/job_settled_check.sql"),
    ),
    ("job_progress", include_str!("sql/job_progress.sql")),
    ("job_insert", include_str!("sql/job_insert.sql")),
    ("job_published", include_str!("sql/job_published.sql")),
    ("job_dead_invalid", include_str!("sql/job_dead_invalid.sql")),
    ("poison_insert", include_str!("sql/poison_insert.sql")),
    ("job_due_lock", include_str!("sql/job_due_lock.sql")),
    (
        "job_due_published",
        include_str!("sql/job_due_published.sql"),
    ),
    (
        "job_dead_unpublishable",
        include_str!("sql/job_dead_unpublishable.sql"),
    ),
    ("job_adopt", include_str!("sql/job_adopt.sql")),
    ("jobs_existing", include_str!("sql/jobs_existing.sql")),
    ("job_dead_kept", include_str!("sql/job_dead_kept.sql")),
    (
        "job_dead_unserved_existing",
        include_str!("sql/job_dead_unserved_existing.sql"),
    ),
    ("unserved_record", include_str!("sql/unserved_record.sql")),
    ("unserved_list", include_str!("sql/unserved_list.sql")),
    ("worker_register", include_str!("sql/worker_register.sql")),
    ("worker_beat", include_str!("sql/worker_beat.sql")),
    ("worker_stop", include_str!("sql/worker_stop.sql")),
    (
        "job_reclaim_dead_owners",
        include_str!("sql/job_reclaim_dead_owners.sql"),
    ),
    (
        "job_reclaim_owners",
        include_str!("sql/job_reclaim_owners.sql"),
    ),
    (
        "job_reclaim_stale",
        include_str!("sql/job_reclaim_stale.sql"),
    ),
    ("job_reclaim_mine", include_str!("sql/job_reclaim_mine.sql")),
    ("job_requeue_lost", include_str!("sql/job_requeue_lost.sql")),
    ("jobs_owned", include_str!("sql/jobs_owned.sql")),
    ("workers_on_host", include_str!("sql/workers_on_host.sql")),
    ("job_retry_dead", include_str!("sql/job_retry_dead.sql")),
    ("job_cancel", include_str!("sql/job_cancel.sql")),
    ("chain_resolve", include_str!("sql/chain_resolve.sql")),
    ("chain_recheck", include_str!("sql/chain_recheck.sql")),
    (
        "chain_pending_ids",
        include_str!("sql/chain_pending_ids.sql"),
    ),
    ("chain_drop_then", include_str!("sql/chain_drop_then.sql")),
    ("chain_give_up", include_str!("sql/chain_give_up.sql")),
    ("pipeline_jobs", include_str!("sql/pipeline_jobs.sql")),
    ("pipeline_cancel", include_str!("sql/pipeline_cancel.sql")),
    (
        "pipeline_cancel_then",
        include_str!("sql/pipeline_cancel_then.sql"),
    ),
    ("job_purge_dead", include_str!("sql/job_purge_dead.sql")),
    ("job_stats", include_str!("sql/job_stats.sql")),
    ("job_depth", include_str!("sql/job_depth.sql")),
    ("workers_list", include_str!("sql/workers_list.sql")),
    (
        "dashboard_overview",
        include_str!("sql/dashboard_overview.sql"),
    ),
    ("dashboard_jobs", include_str!("sql/dashboard_jobs.sql")),
    (
        "dashboard_workers",
        include_str!("sql/dashboard_workers.sql"),
    ),
    (
        "dashboard_attempts",
        include_str!("sql/dashboard_attempts.sql"),
    ),
    (
        "dashboard_pipeline_counts",
        include_str!("sql/dashboard_pipeline_counts.sql"),
    ),
    (
        "dashboard_cron_fires",
        include_str!("sql/dashboard_cron_fires.sql"),
    ),
    (
        "dashboard_scheduled",
        include_str!("sql/dashboard_scheduled.sql"),
    ),
    ("job_discard_dead", include_str!("sql/job_discard_dead.sql")),
];

#[cfg(test)]
mod tests {
    use super::StoreError;

    #[test]
    fn a_server_that_went_away_is_transient_a_refusal_is_not() {
        let t = || "127.0.0.1:5432/test".to_string();
        assert!(StoreError::Unreachable {
            target: t(),
            cause: "connection closed".into()
        }
        .is_transient());
        assert!(StoreError::Migrate("db error: connection closed".into()).is_transient());
        assert!(!StoreError::Migrate("syntax error at or near \"x\"".into()).is_transient());
        assert!(!StoreError::Refused {
            target: t(),
            reason: "password authentication failed".into()
        }
        .is_transient());
        assert!(!StoreError::BadUrl("x".into()).is_transient());
    }
}
