//! The dashboard's queries: every one bounded by a page size and read through an index.

use super::{Result, Store};
use serde::Serialize;

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
    pub async fn dashboard_overview(&self) -> Result<Vec<QueueOverview>> {
        let c = self.ops().await?;
        let st = c
            .prepare_cached(include_str!("sql/dashboard_overview.sql"))
            .await?;
        Ok(c.query(&st, &[])
            .await?
            .into_iter()
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
            .collect())
    }

    /// One page of jobs matching `f`, in id order.
    pub async fn dashboard_jobs(&self, f: &JobFilter, limit: i64) -> Result<Vec<JobSummary>> {
        let c = self.ops().await?;
        // An unnamed statement, planned for these values each time: a cached one turns
        // generic after a few runs, and a generic plan cannot use the partial index of the
        // status asked for (`/dead` would walk the whole primary key).
        let after = f.after.clone().unwrap_or_default();
        let rows = c
            .query(
                include_str!("sql/dashboard_jobs.sql"),
                &[&f.queue, &f.status, &f.text, &after, &limit],
            )
            .await?;
        Ok(rows
            .into_iter()
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
            .collect())
    }

    /// Scheduled jobs, soonest first.
    pub async fn dashboard_scheduled(&self, limit: i64) -> Result<Vec<ScheduledJob>> {
        let c = self.ops().await?;
        let st = c
            .prepare_cached(include_str!("sql/dashboard_scheduled.sql"))
            .await?;
        Ok(c.query(&st, &[&limit])
            .await?
            .into_iter()
            .map(|r| ScheduledJob {
                id: r.get(0),
                queue: r.get(1),
                attempts: r.get(2),
                max_attempts: r.get(3),
                last_error: r.get(4),
                due_at: r.get(5),
                due_in_seconds: r.get(6),
            })
            .collect())
    }
}
