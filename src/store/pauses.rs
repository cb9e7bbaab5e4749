//! Paused queues (`queue_pauses`, migrations/V15): a paused queue starts nothing new on any
//! worker. The claim statements read the table themselves; workers poll it to stop pulling.

use super::sql;
use super::{Result, Store};
use serde::Serialize;

/// A paused queue.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Pause {
    pub queue: String,
    /// Since when (seconds since the Unix epoch).
    pub since: f64,
    /// For how long, as of the read.
    pub for_seconds: f64,
    pub by: String,
    pub reason: Option<String>,
}

impl Store {
    /// Pauses `queue` (see `pause_queue()`); returns since when it is paused. Refused when
    /// no running worker serves it, unless `force`.
    pub async fn pause_queue(
        &self,
        queue: &str,
        by: &str,
        reason: Option<&str>,
        force: bool,
    ) -> Result<f64> {
        let c = self.ops().await?;
        let st = c.prepare_cached(sql::QUEUE_PAUSE).await?;
        Ok(c.query_one(&st, &[&queue, &by, &reason, &force])
            .await?
            .get(0))
    }

    /// Resumes `queue`; since when it had been paused, `None` when it was not.
    pub async fn resume_queue(&self, queue: &str) -> Result<Option<f64>> {
        let c = self.ops().await?;
        let st = c.prepare_cached(sql::QUEUE_RESUME).await?;
        Ok(c.query_one(&st, &[&queue]).await?.get(0))
    }

    /// Every paused queue, by name.
    pub async fn paused_queues(&self) -> Result<Vec<Pause>> {
        let c = self.client().await?;
        let st = c.prepare_cached(sql::QUEUE_PAUSES).await?;
        Ok(c.query(&st, &[])
            .await?
            .into_iter()
            .map(|r| Pause {
                queue: r.get(0),
                since: r.get(1),
                for_seconds: r.get(2),
                by: r.get(3),
                reason: r.get(4),
            })
            .collect())
    }
}
