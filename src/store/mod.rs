//! PostgreSQL: the only module that talks to the database. Every statement lives in
//! `src/store/sql/<method>.sql`, and each method is named after the table and the transition
//! it makes (`job_claim`, `job_settle`, `worker_beat`).
//!
//! Connections come from a deadpool pool built on a `tokio_postgres::Config` (so TCP
//! keepalives and timeouts can be set), with `search_path` set to the configured schema.

mod inspect;
mod liveness;
mod ops;
pub use inspect::{AttemptRow, JobRow};
pub use liveness::{Incarnation, Reclaimed};
pub use ops::{format_stats, QueueStats};

use crate::config::DatabaseConfig;
use crate::job::{JobStatus, NewJob};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use serde_json::Value;
use std::str::FromStr;
use std::time::Duration;
use tokio_postgres::NoTls;

mod embedded {
    refinery::embed_migrations!("./migrations");
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("PostgreSQL at {target} is unreachable: {cause}; check database.url and that the server is running")]
    Unreachable { target: String, cause: String },
    #[error("database error: {0}")]
    Db(#[from] tokio_postgres::Error),
    #[error("database pool: {0}")]
    Pool(String),
    #[error("migration failed: {0}")]
    Migrate(String),
    #[error("database.url is invalid: {0}")]
    BadUrl(String),
    /// A fenced write matched no row: the job was taken from this owner.
    #[error("job {job_id}: lease {lease} is no longer held by this worker (ownership lost)")]
    LostOwnership { job_id: String, lease: i64 },
}

impl StoreError {
    /// PostgreSQL's reason when it rejected the data of a statement (a value out of range,
    /// an invalid byte sequence) rather than failing to run it; `None` for connection and
    /// server failures, which are worth retrying.
    pub fn rejected_data(&self) -> Option<String> {
        let StoreError::Db(e) = self else { return None };
        let db = e.as_db_error()?;
        // Class 22: data exception (22008 out of range, 22021 invalid byte sequence, 22P02…).
        db.code()
            .code()
            .starts_with("22")
            .then(|| db.message().to_string())
    }
}

impl From<deadpool_postgres::PoolError> for StoreError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        StoreError::Pool(e.to_string())
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// One message of a claim batch, with the queue's defaults filled in.
#[derive(Debug, Clone)]
pub struct ClaimInput {
    pub job: NewJob,
    pub max_attempts: i32,
    /// The message's `traceparent` header, kept with the job for every attempt.
    pub traceparent: Option<String>,
}

/// What the claim statement made of one id.
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
    },
    /// The job exists and is not claimable now (terminal, running elsewhere, or waiting).
    NotClaimable(JobStatus),
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

/// Result of an enqueue through the store.
#[derive(Debug, Clone, PartialEq)]
pub struct Enqueued {
    pub id: String,
    pub status: JobStatus,
    /// False when the id or idempotency key existed already (the existing job is returned).
    pub created: bool,
    pub generation: i32,
}

#[derive(Clone)]
pub struct Store {
    pool: Pool,
    schema: String,
    target: String,
}

impl Store {
    /// Builds the pool and checks that the server answers.
    pub async fn connect(cfg: &DatabaseConfig) -> Result<Store> {
        let mut pg = tokio_postgres::Config::from_str(&cfg.url).map_err(|e| {
            StoreError::BadUrl(format!("{e}; expected postgres://user@host:5432/db"))
        })?;
        // Plans that do not depend on table statistics. A jobs table that grows fast is
        // often not analyzed yet; the planner, believing it tiny, then picks plans that are
        // quadratic in the batch size (a nested loop matching every batch row against every
        // row of this worker) or scan the whole table per batch. Every statement here is a
        // key lookup or a hash join between a batch and the rows it names, so seq scans and
        // nested loops are discouraged (still used where nothing else applies).
        pg.options(format!(
            "-c search_path={} -c enable_seqscan=off -c enable_nestloop=off",
            cfg.schema
        ))
        .connect_timeout(cfg.connect_timeout)
        .keepalives(true)
        .keepalives_idle(Duration::from_secs(10))
        .keepalives_interval(Duration::from_secs(5))
        .keepalives_retries(3)
        .tcp_user_timeout(Duration::from_secs(30))
        .application_name("jobwarden");
        let target = describe_target(&pg);
        let mgr = Manager::from_config(
            pg,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(mgr)
            .max_size(cfg.pool_size)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(Duration::from_secs(30)))
            .create_timeout(Some(cfg.connect_timeout))
            .recycle_timeout(Some(Duration::from_secs(5)))
            .build()
            .map_err(|e| StoreError::Pool(e.to_string()))?;
        let store = Store {
            pool,
            schema: cfg.schema.clone(),
            target,
        };
        store.ping().await?;
        Ok(store)
    }

    /// Where the store points, for messages ("127.0.0.1:5432/test").
    pub fn target(&self) -> &str {
        &self.target
    }

    pub fn schema(&self) -> &str {
        &self.schema
    }

    async fn client(&self) -> Result<deadpool_postgres::Object> {
        self.pool.get().await.map_err(|e| match e {
            deadpool_postgres::PoolError::Backend(err) if err.as_db_error().is_none() => {
                StoreError::Unreachable {
                    target: self.target.clone(),
                    cause: err.to_string(),
                }
            }
            deadpool_postgres::PoolError::Timeout(_) => StoreError::Unreachable {
                target: self.target.clone(),
                cause: "timed out connecting".into(),
            },
            other => other.into(),
        })
    }

    pub async fn ping(&self) -> Result<()> {
        self.client().await?.simple_query("SELECT 1").await?;
        Ok(())
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
            let report = embedded::migrations::runner()
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

    // ---- workers ----------------------------------------------------------------------

    pub async fn worker_register(
        &self,
        id: &str,
        hostname: &str,
        pid: i32,
        boot_id: Option<&str>,
        proc_start: Option<i64>,
    ) -> Result<()> {
        let c = self.client().await?;
        let st = c
            .prepare_cached(include_str!("sql/worker_register.sql"))
            .await?;
        let version = env!("CARGO_PKG_VERSION");
        let pid_ns = crate::liveness::pid_namespace();
        c.execute(
            &st,
            &[
                &id,
                &hostname,
                &pid,
                &version,
                &boot_id,
                &proc_start,
                &pid_ns,
            ],
        )
        .await?;
        Ok(())
    }

    /// Refreshes this worker's heartbeat. `false`: the row says this worker stopped.
    pub async fn worker_beat(&self, id: &str) -> Result<bool> {
        let c = self.client().await?;
        let st = c
            .prepare_cached(include_str!("sql/worker_beat.sql"))
            .await?;
        Ok(c.execute(&st, &[&id]).await? == 1)
    }

    pub async fn worker_stop(&self, id: &str, reason: &str) -> Result<()> {
        let c = self.client().await?;
        let st = c
            .prepare_cached(include_str!("sql/worker_stop.sql"))
            .await?;
        c.execute(&st, &[&id, &reason]).await?;
        Ok(())
    }

    // ---- the hot path -----------------------------------------------------------------

    /// Claims a batch of delivered jobs in one statement. Ids must be distinct.
    pub async fn job_claim(
        &self,
        worker_id: &str,
        batch: &[ClaimInput],
    ) -> Result<Vec<(String, Claim)>> {
        let n = batch.len();
        let (mut ids, mut queues, mut payloads, mut prios) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        let mut backoffs: Vec<Option<Value>> = Vec::with_capacity(n);
        let traces: Vec<Option<&str>> = batch.iter().map(|c| c.traceparent.as_deref()).collect();
        let (mut maxes, mut timeouts, mut keys, mut run_ats) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        for c in batch {
            ids.push(c.job.id.as_str());
            queues.push(c.job.queue.as_str());
            payloads.push(&c.job.payload);
            prios.push(c.job.priority);
            maxes.push(c.max_attempts);
            timeouts.push(
                c.job
                    .timeout
                    .map(|d| d.as_millis().min(i32::MAX as u128) as i32),
            );
            keys.push(c.job.idempotency_key.as_deref());
            run_ats.push(c.job.run_at_ms);
            backoffs.push(
                c.job
                    .backoff
                    .as_ref()
                    .map(|b| serde_json::to_value(b).expect("serialises")),
            );
        }
        let client = self.client().await?;
        let st = client
            .prepare_cached(include_str!("sql/job_claim.sql"))
            .await?;
        let rows = client
            .query(
                &st,
                &[
                    &worker_id, &ids, &queues, &payloads, &prios, &maxes, &timeouts, &keys,
                    &run_ats, &backoffs, &traces,
                ],
            )
            .await?;
        let mut out: Vec<(String, Claim)> = Vec::with_capacity(n);
        let mut by_id = std::collections::HashMap::with_capacity(rows.len());
        for r in rows {
            let id: String = r.get(0);
            let status: String = r.get(1);
            let status = JobStatus::parse(&status).unwrap_or(JobStatus::Dead);
            let fresh: bool = r.get(7);
            let lease: i64 = r.get(4);
            let claimed = status == JobStatus::Processing
                && (fresh || r.get::<_, Option<Value>>(6).is_some());
            let queue: String = r.get(8);
            let input_queue = batch
                .iter()
                .find(|c| c.job.id == id)
                .map(|c| c.job.queue.as_str());
            let claim = if input_queue.is_some_and(|q| q != queue) {
                Claim::WrongQueue(queue)
            } else if claimed {
                Claim::Claimed {
                    lease,
                    attempt: r.get(2),
                    max_attempts: r.get(3),
                    timeout_ms: r.get(5),
                    payload: r.get(6),
                    backoff: r
                        .get::<_, Option<Value>>(9)
                        .and_then(|v| serde_json::from_value(v).ok()),
                    traceparent: r.get(10),
                }
            } else {
                Claim::NotClaimable(status)
            };
            by_id.insert(id, claim);
        }
        for c in batch {
            let claim = by_id.remove(&c.job.id).unwrap_or(Claim::Duplicate);
            out.push((c.job.id.clone(), claim));
        }
        Ok(out)
    }

    /// Settles finished attempts in one statement; returns the ids whose fenced write took
    /// effect. An id missing from the answer lost its ownership.
    pub async fn job_settle(&self, worker_id: &str, batch: &[SettleInput]) -> Result<Vec<String>> {
        let ids: Vec<&str> = batch.iter().map(|s| s.id.as_str()).collect();
        let leases: Vec<i64> = batch.iter().map(|s| s.lease).collect();
        let statuses: Vec<&str> = batch.iter().map(|s| s.status.as_str()).collect();
        let delays: Vec<i64> = batch
            .iter()
            .map(|s| s.delay.as_millis().min(i64::MAX as u128) as i64)
            .collect();
        let errors: Vec<Option<&str>> = batch.iter().map(|s| s.error.as_deref()).collect();
        let results: Vec<Option<&Value>> = batch.iter().map(|s| s.result.as_ref()).collect();
        let outcomes: Vec<&str> = batch.iter().map(|s| s.outcome).collect();
        let refunds: Vec<i32> = batch.iter().map(|s| i32::from(s.refund)).collect();
        let client = self.client().await?;
        let st = client
            .prepare_cached(include_str!("sql/job_settle.sql"))
            .await?;
        let rows = client
            .query(
                &st,
                &[
                    &worker_id, &ids, &leases, &statuses, &delays, &errors, &results, &outcomes,
                    &refunds,
                ],
            )
            .await?;
        Ok(rows.into_iter().map(|r| r.get(0)).collect())
    }

    /// Which of these attempts (id, lease, status settled to) this worker settled already:
    /// for a settle that was retried after its commit answer may have been lost.
    pub async fn job_settled_check(
        &self,
        worker_id: &str,
        batch: &[SettleInput],
    ) -> Result<Vec<String>> {
        let ids: Vec<&str> = batch.iter().map(|s| s.id.as_str()).collect();
        let leases: Vec<i64> = batch.iter().map(|s| s.lease).collect();
        let statuses: Vec<&str> = batch.iter().map(|s| s.status.as_str()).collect();
        let client = self.client().await?;
        let st = client
            .prepare_cached(include_str!("sql/job_settled_check.sql"))
            .await?;
        let rows = client
            .query(&st, &[&worker_id, &ids, &leases, &statuses])
            .await?;
        Ok(rows.into_iter().map(|r| r.get(0)).collect())
    }

    /// Records a progress report (fenced). `LostOwnership` when the lease moved on.
    pub async fn job_progress(
        &self,
        id: &str,
        worker_id: &str,
        lease: i64,
        stage: Option<&str>,
        progress: Option<f32>,
        message: Option<&str>,
    ) -> Result<()> {
        let client = self.client().await?;
        let st = client
            .prepare_cached(include_str!("sql/job_progress.sql"))
            .await?;
        let n = client
            .execute(&st, &[&id, &worker_id, &lease, &stage, &progress, &message])
            .await?;
        if n == 1 {
            Ok(())
        } else {
            Err(StoreError::LostOwnership {
                job_id: id.to_string(),
                lease,
            })
        }
    }

    /// Records undeliverable messages as dead jobs; returns the ids that were inserted (an id
    /// that exists already is left alone and goes to the poison table instead).
    pub async fn job_dead_invalid(
        &self,
        worker_id: &str,
        items: &[(String, String, Value, String)],
    ) -> Result<Vec<String>> {
        let ids: Vec<&str> = items.iter().map(|i| i.0.as_str()).collect();
        let queues: Vec<&str> = items.iter().map(|i| i.1.as_str()).collect();
        let payloads: Vec<&Value> = items.iter().map(|i| &i.2).collect();
        let reasons: Vec<&str> = items.iter().map(|i| i.3.as_str()).collect();
        let client = self.client().await?;
        let st = client
            .prepare_cached(include_str!("sql/job_dead_invalid.sql"))
            .await?;
        let rows = client
            .query(&st, &[&worker_id, &ids, &queues, &payloads, &reasons])
            .await?;
        Ok(rows.into_iter().map(|r| r.get(0)).collect())
    }

    pub async fn poison_insert(
        &self,
        worker_id: &str,
        subject: &str,
        stream_seq: Option<i64>,
        reason: &str,
        body: &[u8],
    ) -> Result<()> {
        let client = self.client().await?;
        let st = client
            .prepare_cached(include_str!("sql/poison_insert.sql"))
            .await?;
        let kept = &body[..body.len().min(64 * 1024)];
        client
            .execute(
                &st,
                &[
                    &worker_id,
                    &subject,
                    &stream_seq,
                    &reason,
                    &kept,
                    &(body.len() as i32),
                ],
            )
            .await?;
        Ok(())
    }

    // ---- producer side ----------------------------------------------------------------

    /// Inserts a job (queued, or scheduled after `delay`). An existing id or idempotency key
    /// returns the existing job with `created: false`.
    pub async fn job_insert(
        &self,
        job: &NewJob,
        max_attempts: i32,
        delay: Duration,
    ) -> Result<Enqueued> {
        let client = self.client().await?;
        let st = client
            .prepare_cached(include_str!("sql/job_insert.sql"))
            .await?;
        let timeout_ms = job
            .timeout
            .map(|d| d.as_millis().min(i32::MAX as u128) as i32);
        let delay_ms = delay.as_millis().min(i64::MAX as u128) as i64;
        let backoff = job
            .backoff
            .as_ref()
            .map(|b| serde_json::to_value(b).expect("a backoff serialises"));
        let row = client
            .query_opt(
                &st,
                &[
                    &job.id,
                    &job.queue,
                    &job.payload,
                    &job.priority,
                    &max_attempts,
                    &timeout_ms,
                    &job.idempotency_key,
                    &delay_ms,
                    &backoff,
                ],
            )
            .await?;
        if let Some(r) = row {
            let status: String = r.get(1);
            return Ok(Enqueued {
                id: r.get(0),
                status: JobStatus::parse(&status).unwrap_or(JobStatus::Queued),
                created: true,
                generation: r.get(2),
            });
        }
        let existing = client
            .query_opt(
                "SELECT id, status, generation FROM jobs \
                 WHERE id = $1 OR (queue = $2 AND idempotency_key = $3) LIMIT 1",
                &[&job.id, &job.queue, &job.idempotency_key],
            )
            .await?
            .ok_or_else(|| StoreError::Pool("enqueue conflict but no existing row".into()))?;
        let status: String = existing.get(1);
        Ok(Enqueued {
            id: existing.get(0),
            status: JobStatus::parse(&status).unwrap_or(JobStatus::Queued),
            created: false,
            generation: existing.get(2),
        })
    }

    /// Publishes due scheduled jobs: locks up to `limit` of them (other pods skip locked
    /// rows), hands them to `publish`, and marks the ones it published as queued — all in one
    /// transaction, so a crash in between leaves them `scheduled` for the next round (a
    /// message published twice is absorbed by the claim). Returns how many were published.
    pub async fn job_publish_due<F, Fut>(&self, limit: i64, publish: F) -> Result<usize>
    where
        F: FnOnce(Vec<DueJob>) -> Fut,
        Fut: std::future::Future<Output = Vec<String>>,
    {
        let mut client = self.client().await?;
        let lock = client
            .prepare_cached(include_str!("sql/job_due_lock.sql"))
            .await?;
        let mark = client
            .prepare_cached(include_str!("sql/job_due_published.sql"))
            .await?;
        let tx = client.transaction().await?;
        let rows = tx.query(&lock, &[&limit]).await?;
        if rows.is_empty() {
            return Ok(0);
        }
        let due: Vec<DueJob> = rows
            .into_iter()
            .map(|r| DueJob {
                id: r.get(0),
                queue: r.get(1),
                payload: r.get(2),
                priority: r.get(3),
                max_attempts: r.get(4),
                timeout_ms: r.get(5),
                generation: r.get(6),
            })
            .collect();
        let published = publish(due).await;
        tx.execute(&mark, &[&published]).await?;
        tx.commit().await?;
        Ok(published.len())
    }

    /// A raw pooled client, for the inspection queries in `inspect.rs` and for tests.
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

/// Every statement file, for the test that prepares them all against the migrated schema.
pub const ALL_SQL: &[(&str, &str)] = &[
    ("job_claim", include_str!("sql/job_claim.sql")),
    ("job_settle", include_str!("sql/job_settle.sql")),
    (
        "job_settled_check",
        include_str!("sql/job_settled_check.sql"),
    ),
    ("job_progress", include_str!("sql/job_progress.sql")),
    ("job_insert", include_str!("sql/job_insert.sql")),
    ("job_dead_invalid", include_str!("sql/job_dead_invalid.sql")),
    ("poison_insert", include_str!("sql/poison_insert.sql")),
    ("job_due_lock", include_str!("sql/job_due_lock.sql")),
    (
        "job_due_published",
        include_str!("sql/job_due_published.sql"),
    ),
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
    ("job_release", include_str!("sql/job_release.sql")),
    ("job_requeue_lost", include_str!("sql/job_requeue_lost.sql")),
    ("jobs_owned", include_str!("sql/jobs_owned.sql")),
    ("workers_on_host", include_str!("sql/workers_on_host.sql")),
    ("job_retry_dead", include_str!("sql/job_retry_dead.sql")),
    ("job_cancel", include_str!("sql/job_cancel.sql")),
    ("job_purge_dead", include_str!("sql/job_purge_dead.sql")),
    ("job_stats", include_str!("sql/job_stats.sql")),
];
