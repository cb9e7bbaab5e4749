//! Workers and recovery: registration and heartbeats (with the thresholds each worker
//! declares, by which every other pod judges it), the heartbeat reaper, start-up
//! reconciliation, the stale sweep, graceful release and the self-fence give-back. Each
//! reclaim records its reason in `job_attempts`.

use super::jobs::ms;
use super::sql;
use super::{Result, Store};
use crate::job::JobStatus;
use crate::liveness::Incarnation;
use std::time::Duration;

/// A job taken back from its owner.
#[derive(Debug, Clone, PartialEq)]
pub struct Reclaimed {
    pub id: String,
    /// `scheduled` (runs again at once) or `dead` (that was its last attempt).
    pub status: JobStatus,
    pub owner: Option<String>,
    pub queue: String,
    pub traceparent: Option<String>,
}

/// What a worker registers about itself.
#[derive(Debug, Clone)]
pub struct Registration<'a> {
    pub id: &'a str,
    pub hostname: &'a str,
    pub pid: i32,
    pub boot_id: Option<&'a str>,
    pub proc_start: Option<i64>,
    pub pid_ns: Option<&'a str>,
    /// How often it beats, and after how much silence it counts as dead: every reaper
    /// judges it by these, not by its own settings.
    pub heartbeat_every: Duration,
    pub dead_after: Duration,
    /// The largest payload it decodes (`worker.max_payload_bytes`): SQL `enqueue()` refuses
    /// larger ones while it is alive.
    pub max_payload_bytes: usize,
    /// The queues it serves (a pause of a queue no running worker serves is refused).
    pub queues: Vec<String>,
}

fn reclaimed(rows: Vec<tokio_postgres::Row>) -> Vec<Reclaimed> {
    rows.into_iter()
        .map(|r| Reclaimed {
            id: r.get(0),
            status: JobStatus::parse(r.get(1)).unwrap_or(JobStatus::Scheduled),
            owner: r.get(2),
            queue: r.get(3),
            traceparent: r.get(4),
        })
        .collect()
}

/// What broker-loss repair needs to know of a lane's place in the stream: a queued job
/// whose message has a sequence at or below `gone_upto` was delivered (or purged); none
/// above `last_seq` exists; messages stored before `created` belong to an earlier
/// incarnation of the stream.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamBounds {
    pub gone_upto: u64,
    pub last_seq: u64,
    pub created: std::time::SystemTime,
}

impl Store {
    /// Registers (or re-registers) a worker, with the thresholds it declares.
    pub async fn worker_register(&self, w: &Registration<'_>) -> Result<()> {
        let c = self.client().await?;
        let st = c.prepare_cached(sql::WORKER_REGISTER).await?;
        let version = env!("CARGO_PKG_VERSION");
        c.execute(
            &st,
            &[
                &w.id,
                &w.hostname,
                &w.pid,
                &version,
                &w.boot_id,
                &w.proc_start,
                &w.pid_ns,
                &ms(w.heartbeat_every),
                &ms(w.dead_after),
                &(w.max_payload_bytes.min(i32::MAX as usize) as i32),
                &w.queues,
            ],
        )
        .await?;
        Ok(())
    }

    /// Refreshes this worker's heartbeat. `None`: the row says this worker stopped (others
    /// declared it dead). Otherwise how long before the answer the database stamped the
    /// heartbeat (measured on its own clock).
    pub async fn worker_beat(&self, id: &str) -> Result<Option<Duration>> {
        let c = self.client().await?;
        let st = c.prepare_cached(sql::WORKER_BEAT).await?;
        Ok(c.query_opt(&st, &[&id])
            .await?
            .map(|r| Duration::from_secs_f64(r.get::<_, f64>(0).max(0.0))))
    }

    pub async fn worker_stop(&self, id: &str, reason: &str) -> Result<()> {
        let c = self.client().await?;
        let st = c.prepare_cached(sql::WORKER_STOP).await?;
        c.execute(&st, &[&id, &reason]).await?;
        Ok(())
    }

    /// Declares dead the workers silent past the dead_after each declared, and takes back
    /// their jobs.
    pub async fn job_reclaim_dead_owners(&self, limit: i64) -> Result<Vec<Reclaimed>> {
        let c = self.raw().await?;
        let st = c.prepare_cached(sql::JOB_RECLAIM_DEAD_OWNERS).await?;
        Ok(reclaimed(c.query(&st, &[&limit]).await?))
    }

    /// Marks the given workers stopped and takes back their jobs (start-up reconciliation).
    pub async fn job_reclaim_owners(
        &self,
        owners: &[String],
        reason: &str,
    ) -> Result<Vec<Reclaimed>> {
        let c = self.raw().await?;
        let st = c.prepare_cached(sql::JOB_RECLAIM_OWNERS).await?;
        Ok(reclaimed(c.query(&st, &[&owners, &reason]).await?))
    }

    /// Takes back jobs past the stale deadline their owner declared (`fallback` judges jobs
    /// claimed by versions that stored none).
    pub async fn job_reclaim_stale(
        &self,
        limit: i64,
        fallback: Duration,
    ) -> Result<Vec<Reclaimed>> {
        let c = self.raw().await?;
        let st = c.prepare_cached(sql::JOB_RECLAIM_STALE).await?;
        Ok(reclaimed(c.query(&st, &[&limit, &ms(fallback)]).await?))
    }

    /// Gives back jobs the database says this worker owns but that no longer run in it
    /// (stopped by a self-fence): the attempt counts, like any reclaim.
    pub async fn job_reclaim_mine(
        &self,
        worker_id: &str,
        jobs: &[(String, i64)],
    ) -> Result<Vec<Reclaimed>> {
        let ids: Vec<&str> = jobs.iter().map(|(id, _)| id.as_str()).collect();
        let leases: Vec<i64> = jobs.iter().map(|(_, l)| *l).collect();
        let c = self.raw().await?;
        let st = c.prepare_cached(sql::JOB_RECLAIM_MINE).await?;
        Ok(reclaimed(c.query(&st, &[&worker_id, &ids, &leases]).await?))
    }

    /// Broker-loss repair for one queue: re-schedules `queued` jobs older than `deadline`
    /// whose message cannot be in the stream any more (see `job_requeue_lost.sql`).
    pub async fn job_requeue_lost(
        &self,
        queue: &str,
        priority: i16,
        deadline: Duration,
        limit: i64,
        stream: &StreamBounds,
    ) -> Result<Vec<String>> {
        let c = self.raw().await?;
        let st = c.prepare_cached(sql::JOB_REQUEUE_LOST).await?;
        let gone_upto = stream.gone_upto as i64;
        let last = stream.last_seq as i64;
        let rows = c
            .query(
                &st,
                &[
                    &queue,
                    &ms(deadline),
                    &limit,
                    &gone_upto,
                    &last,
                    &stream.created,
                    &priority,
                ],
            )
            .await?;
        Ok(rows.into_iter().map(|r| r.get(0)).collect())
    }

    /// The jobs the database says `worker_id` owns, with their leases.
    pub async fn jobs_owned(&self, worker_id: &str) -> Result<Vec<(String, i64)>> {
        let c = self.raw().await?;
        let st = c.prepare_cached(sql::JOBS_OWNED).await?;
        let rows = c.query(&st, &[&worker_id]).await?;
        Ok(rows.into_iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    /// Other registered, not stopped, incarnations of `hostname`.
    pub async fn workers_on_host(&self, hostname: &str, me: &str) -> Result<Vec<Incarnation>> {
        let c = self.raw().await?;
        let st = c.prepare_cached(sql::WORKERS_ON_HOST).await?;
        let rows = c.query(&st, &[&hostname, &me]).await?;
        Ok(rows
            .into_iter()
            .map(|r| Incarnation {
                id: r.get(0),
                pid: r.get(1),
                boot_id: r.get(2),
                proc_start: r.get(3),
                pid_ns: r.get(4),
            })
            .collect())
    }
}
