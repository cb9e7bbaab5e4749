//! The dashboard's queries: every list is a page (a size and the previous page's last key),
//! read through an index, and runs under [`DASHBOARD_QUERY_LIMIT`]: a statement that would
//! take longer (a text search in ids and errors that matches nothing walks the whole table;
//! a lock held by a migration) is stopped and said to be too slow, never waited for.

use super::sql;
use super::{AttemptRow, PipelineJob, Result, Store, StoreError, WorkerRow};
use chrono::{DateTime, Utc};
use serde::Serialize;
use std::time::Duration;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

/// Longest one dashboard statement may run (`SET LOCAL statement_timeout`).
pub const DASHBOARD_QUERY_LIMIT: Duration = Duration::from_secs(3);

/// What a time-limited dashboard query gave.
#[derive(Debug, Clone, PartialEq)]
pub enum Bounded<T> {
    Done(T),
    /// Stopped at [`DASHBOARD_QUERY_LIMIT`].
    TooSlow,
}

impl<T> Bounded<T> {
    fn map<U>(self, f: impl FnOnce(T) -> U) -> Bounded<U> {
        match self {
            Bounded::Done(t) => Bounded::Done(f(t)),
            Bounded::TooSlow => Bounded::TooSlow,
        }
    }
}

/// One queue on the overview.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct QueueOverview {
    pub queue: String,
    pub queued: i64,
    pub scheduled: i64,
    pub running: i64,
    pub dead: i64,
    pub oldest_queued_seconds: Option<f64>,
    /// Attempts completed in the last minute.
    pub completed_1m: i64,
    /// Attempts that failed (to retry or dead) in the last minute.
    pub failed_1m: i64,
    pub p50_run_seconds: Option<f64>,
    pub p95_run_seconds: Option<f64>,
}

impl QueueOverview {
    /// Completions per second over the last minute.
    pub fn throughput(&self) -> f64 {
        self.completed_1m as f64 / 60.0
    }

    /// Failed attempts over all attempts of the last minute (0 when none ran).
    pub fn failure_rate(&self) -> f64 {
        let all = self.completed_1m + self.failed_1m;
        if all == 0 {
            0.0
        } else {
            self.failed_1m as f64 / all as f64
        }
    }
}

/// A job in a dashboard list.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct JobSummary {
    pub id: String,
    pub queue: String,
    pub status: String,
    pub priority: i16,
    pub attempts: i32,
    pub max_attempts: i32,
    pub worker_id: Option<String>,
    pub last_error: Option<String>,
    pub updated_at: String,
}

/// A scheduled job: when it is due.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ScheduledJob {
    pub id: String,
    pub queue: String,
    pub attempts: i32,
    pub max_attempts: i32,
    pub last_error: Option<String>,
    pub due_at: String,
    pub due_in_seconds: f64,
    /// The due time in microseconds since the epoch (with the id, the next page's key).
    pub due_us: i64,
}

/// What a jobs page shows.
#[derive(Debug, Clone, Default)]
pub struct JobFilter {
    pub queue: Option<String>,
    pub status: Option<String>,
    /// Text in the id or the last error.
    pub text: Option<String>,
    /// The last id of the previous page.
    pub after: Option<String>,
}

impl Store {
    /// Runs one operator statement under [`DASHBOARD_QUERY_LIMIT`], planned for these values
    /// (an unnamed statement: a cached one turns generic after a few runs, and a generic plan
    /// cannot use the partial index of the status asked for).
    async fn bounded_query(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Bounded<Vec<Row>>> {
        let mut c = self.ops().await?;
        let tx = c.transaction().await?;
        let limit = DASHBOARD_QUERY_LIMIT.as_millis().to_string();
        tx.execute(sql::STATEMENT_TIMEOUT_LOCAL, &[&limit]).await?;
        match tx.query(sql, params).await {
            Ok(rows) => {
                tx.commit().await?;
                Ok(Bounded::Done(rows))
            }
            // Dropping the transaction rolls it back.
            Err(e) if e.code() == Some(&SqlState::QUERY_CANCELED) => Ok(Bounded::TooSlow),
            Err(e) => Err(StoreError::Db(e)),
        }
    }

    /// One page of queues (in name order after `after`) for the overview.
    pub async fn dashboard_overview(
        &self,
        after: &str,
        limit: i64,
    ) -> Result<Bounded<Vec<QueueOverview>>> {
        let rows = self
            .bounded_query(sql::DASHBOARD_OVERVIEW, &[&after, &limit])
            .await?;
        Ok(rows.map(|rows| {
            rows.into_iter()
                .map(|r| QueueOverview {
                    queue: r.get(0),
                    queued: r.get(1),
                    scheduled: r.get(2),
                    running: r.get(3),
                    dead: r.get(4),
                    oldest_queued_seconds: r.get(5),
                    completed_1m: r.get(6),
                    failed_1m: r.get(7),
                    p50_run_seconds: r.get(8),
                    p95_run_seconds: r.get(9),
                })
                .collect()
        }))
    }

    /// One page of jobs matching `f`, in id order.
    pub async fn dashboard_jobs(
        &self,
        f: &JobFilter,
        limit: i64,
    ) -> Result<Bounded<Vec<JobSummary>>> {
        let after = f.after.clone().unwrap_or_default();
        let rows = self
            .bounded_query(
                sql::DASHBOARD_JOBS,
                &[&f.queue, &f.status, &f.text, &after, &limit],
            )
            .await?;
        Ok(rows.map(|rows| {
            rows.into_iter()
                .map(|r| JobSummary {
                    id: r.get(0),
                    queue: r.get(1),
                    status: r.get(2),
                    priority: r.get(3),
                    attempts: r.get(4),
                    max_attempts: r.get(5),
                    worker_id: r.get(6),
                    last_error: r.get(7),
                    updated_at: r.get(8),
                })
                .collect()
        }))
    }

    /// Scheduled jobs, soonest first, after the key `(due_us, id)` of the previous page.
    pub async fn dashboard_scheduled(
        &self,
        after: Option<(i64, &str)>,
        limit: i64,
    ) -> Result<Bounded<Vec<ScheduledJob>>> {
        let (us, id) = (after.map(|a| a.0), after.map_or("", |a| a.1));
        let rows = self
            .bounded_query(sql::DASHBOARD_SCHEDULED, &[&us, &id, &limit])
            .await?;
        Ok(rows.map(|rows| {
            rows.into_iter()
                .map(|r| ScheduledJob {
                    id: r.get(0),
                    queue: r.get(1),
                    attempts: r.get(2),
                    max_attempts: r.get(3),
                    last_error: r.get(4),
                    due_at: r.get(5),
                    due_in_seconds: r.get(6),
                    due_us: r.get(7),
                })
                .collect()
        }))
    }

    /// One page of the running workers, in id order after `after`.
    pub async fn dashboard_workers(
        &self,
        after: &str,
        limit: i64,
    ) -> Result<Bounded<Vec<WorkerRow>>> {
        let rows = self
            .bounded_query(sql::DASHBOARD_WORKERS, &[&after, &limit])
            .await?;
        Ok(rows.map(|rows| rows.into_iter().map(WorkerRow::from).collect()))
    }

    /// One page of a job's attempts in the order they were recorded, after the attempt row
    /// `after` (0: the first page); each with its row's id (the next page's key).
    pub async fn dashboard_attempts(
        &self,
        job_id: &str,
        after: i64,
        limit: i64,
    ) -> Result<Bounded<Vec<(i64, AttemptRow)>>> {
        let rows = self
            .bounded_query(sql::DASHBOARD_ATTEMPTS, &[&job_id, &after, &limit])
            .await?;
        Ok(rows.map(|rows| {
            rows.into_iter()
                .map(|r| {
                    (
                        r.get(0),
                        AttemptRow {
                            attempt: r.get(1),
                            lease: r.get(2),
                            worker_id: r.get(3),
                            started_at: r.get(4),
                            duration_ms: r.get(5),
                            outcome: r.get(6),
                            error: r.get(7),
                        },
                    )
                })
                .collect()
        }))
    }

    /// One page of the pipeline of job `id`, oldest first, after the key `(created_us, id)`
    /// of the previous page; each with its creation time in microseconds (the next key).
    pub async fn dashboard_pipeline(
        &self,
        id: &str,
        after: Option<(i64, &str)>,
        limit: i64,
    ) -> Result<Bounded<Vec<(i64, PipelineJob)>>> {
        let (us, after_id) = (after.map(|a| a.0), after.map_or("", |a| a.1));
        let rows = self
            .bounded_query(sql::PIPELINE_JOBS, &[&id, &us, &after_id, &limit])
            .await?;
        Ok(rows.map(|rows| {
            rows.iter()
                .map(|r| (r.get(10), PipelineJob::from(r)))
                .collect()
        }))
    }

    /// How many jobs of the pipeline of job `id` are in each status.
    pub async fn dashboard_pipeline_counts(&self, id: &str) -> Result<Bounded<Vec<(String, i64)>>> {
        let rows = self
            .bounded_query(sql::DASHBOARD_PIPELINE_COUNTS, &[&id])
            .await?;
        Ok(rows.map(|rows| rows.into_iter().map(|r| (r.get(0), r.get(1))).collect()))
    }

    /// When the named cron schedules last fired.
    pub async fn dashboard_cron_fires(
        &self,
        names: &[&str],
    ) -> Result<Bounded<Vec<(String, DateTime<Utc>)>>> {
        let rows = self
            .bounded_query(sql::DASHBOARD_CRON_FIRES, &[&names])
            .await?;
        Ok(rows.map(|rows| {
            rows.into_iter()
                .filter_map(|r| {
                    let ms: i64 = r.get(1);
                    DateTime::from_timestamp_millis(ms).map(|t| (r.get(0), t))
                })
                .collect()
        }))
    }
}
