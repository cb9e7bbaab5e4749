//! The rollup of finished work (`job_rollup`, migrations/V16): per queue and minute (hour,
//! after two hours), how many jobs completed, failed and died, and how long they ran and
//! waited. `job_stats`, `jobwarden stats` and the dashboard read it instead of the finished
//! rows, so their answers stay the same size however long the history is.

use super::sql;
use super::{Result, Store};

/// What one step of the rollup did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RollupStep {
    /// The new mark (seconds since the Unix epoch); `None` when another worker's step was
    /// running.
    pub upto: Option<f64>,
    /// Finished rows read.
    pub rows: i64,
    /// How far the mark is behind the database's clock (seconds).
    pub behind: Option<f64>,
    /// It read all that is safe to read now (the mark stops short of the clock while a
    /// transaction that could still commit finished rows is open); `false` when it stopped
    /// after the longest step and more is waiting.
    pub caught_up: bool,
}

impl Store {
    /// One step of the rollup: adds what finished since the mark (at most 15 minutes of it,
    /// and only what is surely committed) to its minutes and moves the mark on.
    pub async fn rollup_step(&self) -> Result<RollupStep> {
        let c = self.client().await?;
        let st = c.prepare_cached(sql::ROLLUP_STEP).await?;
        let r = c.query_one(&st, &[]).await?;
        Ok(RollupStep {
            upto: r.get(0),
            rows: r.get(1),
            behind: r.get(2),
            caught_up: r.get(3),
        })
    }
}

/// One point of a queue's charts (`rollup_series.sql`).
#[derive(Debug, Clone, PartialEq)]
pub struct SeriesPoint {
    pub queue: String,
    /// The start of its minute or hour (seconds since the Unix epoch).
    pub at: f64,
    pub completed: i64,
    /// Attempts that failed (retried or dead).
    pub failed: i64,
    /// Wait before a job's last attempt: median and 95th percentile (seconds).
    pub wait_p50: Option<f64>,
    pub wait_p95: Option<f64>,
}

impl Store {
    /// The charts' points since `since` (seconds since the epoch), per minute or per hour,
    /// for one page of queues (name order after `after`, `limit` of them).
    pub async fn rollup_series(
        &self,
        hourly: bool,
        since: f64,
        after: &str,
        limit: i64,
    ) -> Result<Vec<SeriesPoint>> {
        let c = self.ops().await?;
        let st = c.prepare_cached(sql::ROLLUP_SERIES).await?;
        let unit = if hourly { "hour" } else { "minute" };
        Ok(c.query(&st, &[&unit, &since, &after, &limit])
            .await?
            .into_iter()
            .map(|r| SeriesPoint {
                queue: r.get(0),
                at: r.get(1),
                completed: r.get(2),
                failed: r.get(3),
                wait_p50: r.get(4),
                wait_p95: r.get(5),
            })
            .collect())
    }
}
