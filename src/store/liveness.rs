//! Statements of the recovery services: the heartbeat reaper, start-up reconciliation, the
//! stale sweep, graceful release and broker-loss reconciliation. Each reclaim records its
//! reason in `job_attempts`.

use super::{Result, Store};
use crate::job::JobStatus;
use std::time::Duration;

/// A job taken back from its owner.
#[derive(Debug, Clone, PartialEq)]
pub struct Reclaimed {
    pub id: String,
    /// `scheduled` (runs again at once) or `dead` (that was its last attempt).
    pub status: JobStatus,
    pub owner: Option<String>,
    pub queue: String,
}

/// Another registered incarnation of this hostname.
#[derive(Debug, Clone, PartialEq)]
pub struct Incarnation {
    pub id: String,
    pub pid: i32,
    pub boot_id: Option<String>,
    pub proc_start: Option<i64>,
    pub pid_ns: Option<String>,
}

fn ms(d: Duration) -> i64 {
    d.as_millis().min(i64::MAX as u128) as i64
}

fn reclaimed(rows: Vec<tokio_postgres::Row>) -> Vec<Reclaimed> {
    rows.into_iter()
        .map(|r| Reclaimed {
            id: r.get(0),
            status: JobStatus::parse(r.get(1)).unwrap_or(JobStatus::Scheduled),
            owner: r.get(2),
            queue: r.get(3),
        })
        .collect()
}

impl Store {
    /// Declares workers silent for `dead_after` dead and takes back their jobs.
    pub async fn job_reclaim_dead_owners(
        &self,
        dead_after: Duration,
        limit: i64,
    ) -> Result<Vec<Reclaimed>> {
        let c = self.raw().await?;
        let st = c
            .prepare_cached(include_str!("sql/job_reclaim_dead_owners.sql"))
            .await?;
        Ok(reclaimed(c.query(&st, &[&ms(dead_after), &limit]).await?))
    }

    /// Marks the given workers stopped and takes back their jobs (start-up reconciliation).
    pub async fn job_reclaim_owners(
        &self,
        owners: &[String],
        reason: &str,
    ) -> Result<Vec<Reclaimed>> {
        let c = self.raw().await?;
        let st = c
            .prepare_cached(include_str!("sql/job_reclaim_owners.sql"))
            .await?;
        Ok(reclaimed(c.query(&st, &[&owners, &reason]).await?))
    }

    /// Takes back jobs without activity for their queue's stale_after.
    pub async fn job_reclaim_stale(
        &self,
        default_stale: Duration,
        per_queue: &[(String, Duration)],
        limit: i64,
    ) -> Result<Vec<Reclaimed>> {
        let queues: Vec<&str> = per_queue.iter().map(|(q, _)| q.as_str()).collect();
        let stale: Vec<i64> = per_queue.iter().map(|(_, d)| ms(*d)).collect();
        let least = stale
            .iter()
            .copied()
            .chain([ms(default_stale)])
            .min()
            .unwrap_or(0);
        let c = self.raw().await?;
        let st = c
            .prepare_cached(include_str!("sql/job_reclaim_stale.sql"))
            .await?;
        Ok(reclaimed(
            c.query(&st, &[&ms(default_stale), &queues, &stale, &least, &limit])
                .await?,
        ))
    }

    /// Gives back jobs this worker owns (fenced by lease); returns the ids released.
    pub async fn job_release(
        &self,
        worker_id: &str,
        jobs: &[(String, i64)],
        reason: &str,
        refund: bool,
    ) -> Result<Vec<String>> {
        let ids: Vec<&str> = jobs.iter().map(|(id, _)| id.as_str()).collect();
        let leases: Vec<i64> = jobs.iter().map(|(_, l)| *l).collect();
        let c = self.raw().await?;
        let st = c
            .prepare_cached(include_str!("sql/job_release.sql"))
            .await?;
        let refund = i32::from(refund);
        let rows = c
            .query(&st, &[&worker_id, &ids, &leases, &reason, &refund])
            .await?;
        Ok(rows.into_iter().map(|r| r.get(0)).collect())
    }

    /// Re-schedules `queued` jobs of `queue` older than `deadline` (their message is gone).
    pub async fn job_requeue_lost(
        &self,
        queue: &str,
        deadline: Duration,
        limit: i64,
    ) -> Result<Vec<String>> {
        let c = self.raw().await?;
        let st = c
            .prepare_cached(include_str!("sql/job_requeue_lost.sql"))
            .await?;
        let rows = c.query(&st, &[&queue, &ms(deadline), &limit]).await?;
        Ok(rows.into_iter().map(|r| r.get(0)).collect())
    }

    /// The jobs the database says `worker_id` owns, with their leases.
    pub async fn jobs_owned(&self, worker_id: &str) -> Result<Vec<(String, i64)>> {
        let c = self.raw().await?;
        let st = c.prepare_cached(include_str!("sql/jobs_owned.sql")).await?;
        let rows = c.query(&st, &[&worker_id]).await?;
        Ok(rows.into_iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    /// Other registered, not stopped, incarnations of `hostname`.
    pub async fn workers_on_host(&self, hostname: &str, me: &str) -> Result<Vec<Incarnation>> {
        let c = self.raw().await?;
        let st = c
            .prepare_cached(include_str!("sql/workers_on_host.sql"))
            .await?;
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
