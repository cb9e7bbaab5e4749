//! Operator actions and statistics: retry and purge dead jobs, cancel, the `job_stats` view.

use super::sql;
use super::{Result, Store};
use crate::job::JobStatus;
use serde::Serialize;
use std::time::Duration;

/// One row of the `job_stats` view.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct QueueStats {
    pub queue: String,
    pub queued: i64,
    pub scheduled: i64,
    pub processing: i64,
    /// Deferred by their handler, awaiting a completion from outside (version 31).
    pub awaiting: i64,
    pub completed_24h: i64,
    pub dead_24h: i64,
    pub oldest_queued_seconds: Option<f64>,
    pub p50_run_seconds: Option<f64>,
    pub p95_run_seconds: Option<f64>,
    pub retry_rate: f64,
}

/// One worker process as `jobwarden workers` shows it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct WorkerRow {
    pub id: String,
    pub hostname: String,
    pub pid: i32,
    pub version: String,
    pub up_seconds: f64,
    pub heartbeat_age_seconds: f64,
    /// Others declare it dead when its heartbeat is older than this.
    pub dead_after_ms: i64,
    pub stopped_seconds_ago: Option<f64>,
    pub stop_reason: Option<String>,
    /// Jobs it holds (`processing`) now.
    pub in_flight: i64,
}

/// A row of `workers_list.sql` or `dashboard_workers.sql` (the same columns, in order).
impl From<tokio_postgres::Row> for WorkerRow {
    fn from(r: tokio_postgres::Row) -> WorkerRow {
        WorkerRow {
            id: r.get(0),
            hostname: r.get(1),
            pid: r.get(2),
            version: r.get(3),
            up_seconds: r.get(4),
            heartbeat_age_seconds: r.get(5),
            dead_after_ms: r.get(6),
            stopped_seconds_ago: r.get(7),
            stop_reason: r.get(8),
            in_flight: r.get(9),
        }
    }
}

impl WorkerRow {
    /// `alive`, `silent` (heartbeat older than its dead_after, not yet reaped) or
    /// `stopped (<reason>)`.
    pub fn state(&self) -> String {
        match (&self.stopped_seconds_ago, &self.stop_reason) {
            (Some(_), Some(r)) => format!("stopped ({r})"),
            (Some(_), None) => "stopped".into(),
            _ if self.heartbeat_age_seconds * 1000.0 > self.dead_after_ms as f64 => "silent".into(),
            _ => "alive".into(),
        }
    }
}

impl Store {
    /// The running workers (with `all`, every one that ever ran), newest first.
    pub async fn workers(&self, all: bool, limit: i64) -> Result<Vec<WorkerRow>> {
        self.workers_where(all, limit, None).await
    }

    /// One worker, stopped or not.
    pub async fn worker(&self, id: &str) -> Result<Option<WorkerRow>> {
        Ok(self.workers_where(true, 1, Some(id)).await?.pop())
    }

    async fn workers_where(
        &self,
        all: bool,
        limit: i64,
        id: Option<&str>,
    ) -> Result<Vec<WorkerRow>> {
        let c = self.ops().await?;
        let st = c.prepare_cached(sql::WORKERS_LIST).await?;
        Ok(c.query(&st, &[&all, &limit, &id])
            .await?
            .into_iter()
            .map(WorkerRow::from)
            .collect())
    }

    /// Retries dead jobs (by id, or every dead job of a queue); returns the ids retried.
    pub async fn job_retry_dead(
        &self,
        ids: Option<&[String]>,
        queue: Option<&str>,
    ) -> Result<Vec<String>> {
        self.dead_jobs_do(sql::JOB_RETRY_DEAD, ids, queue).await
    }

    /// Discards dead jobs (by id, or every dead job of a queue); returns the ids discarded.
    pub async fn job_discard_dead(
        &self,
        ids: Option<&[String]>,
        queue: Option<&str>,
    ) -> Result<Vec<String>> {
        self.dead_jobs_do(sql::JOB_DISCARD_DEAD, ids, queue).await
    }

    /// Runs an operator statement over dead jobs (`$1` ids, `$2` queue) returning their ids.
    async fn dead_jobs_do(
        &self,
        sql: &str,
        ids: Option<&[String]>,
        queue: Option<&str>,
    ) -> Result<Vec<String>> {
        let c = self.raw().await?;
        let st = c.prepare_cached(sql).await?;
        let rows = c.query(&st, &[&ids, &queue]).await?;
        Ok(rows.into_iter().map(|r| r.get(0)).collect())
    }

    /// Cancels a job; returns the status it had, or None when it was already finished (or
    /// does not exist).
    pub async fn job_cancel(&self, id: &str) -> Result<Option<JobStatus>> {
        let c = self.raw().await?;
        let st = c.prepare_cached(sql::JOB_CANCEL).await?;
        let ids = [id];
        let row = c
            .query_opt(&st, &[&&ids[..], &"cancelled by an operator"])
            .await?;
        Ok(row.and_then(|r| JobStatus::parse(r.get(1))))
    }

    /// Ends at most `limit` queued or scheduled jobs whose expiry has passed (`cancelled`,
    /// `expired: not started by …`); returns the (id, queue) of each.
    pub async fn job_expire_due(&self, limit: i64) -> Result<Vec<(String, String)>> {
        let c = self.raw().await?;
        let st = c.prepare_cached(sql::JOB_EXPIRE_DUE).await?;
        let rows = c.query(&st, &[&limit]).await?;
        Ok(rows.into_iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    /// Deletes dead jobs older than `age`; returns how many.
    pub async fn job_purge_dead(&self, age: Duration) -> Result<u64> {
        let c = self.raw().await?;
        let st = c.prepare_cached(sql::JOB_PURGE_DEAD).await?;
        let ms = age.as_millis().min(i64::MAX as u128) as i64;
        Ok(c.execute(&st, &[&ms]).await?)
    }

    /// Jobs by queue and status (queued, scheduled, processing, dead): `(queue, status, n)`.
    pub async fn depth(&self) -> Result<Vec<(String, String, i64)>> {
        let c = self.client().await?;
        let st = c.prepare_cached(sql::JOB_DEPTH).await?;
        Ok(c.query(&st, &[])
            .await?
            .into_iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect())
    }

    /// Per-queue statistics from the `job_stats` view.
    pub async fn job_stats(&self) -> Result<Vec<QueueStats>> {
        let c = self.ops().await?;
        let st = c.prepare_cached(sql::JOB_STATS).await?;
        Ok(c.query(&st, &[])
            .await?
            .into_iter()
            .map(|r| QueueStats {
                queue: r.get(0),
                queued: r.get(1),
                scheduled: r.get(2),
                processing: r.get(3),
                completed_24h: r.get(4),
                dead_24h: r.get(5),
                oldest_queued_seconds: r.get(6),
                p50_run_seconds: r.get(7),
                p95_run_seconds: r.get(8),
                retry_rate: r.get(9),
                awaiting: r.get(10),
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(beat: f64, stopped: Option<(&str, f64)>) -> WorkerRow {
        WorkerRow {
            id: "pod-a-7521-2968c8ff".into(),
            hostname: "pod-a".into(),
            pid: 7521,
            version: "0.1.0".into(),
            up_seconds: 1020.0,
            heartbeat_age_seconds: beat,
            dead_after_ms: 15_000,
            stopped_seconds_ago: stopped.map(|s| s.1),
            stop_reason: stopped.map(|s| s.0.to_string()),
            in_flight: 3,
        }
    }

    #[test]
    fn a_worker_is_alive_silent_past_its_own_dead_after_or_stopped() {
        assert_eq!(row(1.0, None).state(), "alive");
        assert_eq!(row(15.5, None).state(), "silent");
        assert_eq!(
            row(400.0, Some(("owner_dead", 300.0))).state(),
            "stopped (owner_dead)"
        );
    }
}
