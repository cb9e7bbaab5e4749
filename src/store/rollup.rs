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
        })
    }
}
