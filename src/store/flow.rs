//! Cluster-wide flow control per queue (`flow_take()` and `flow_grants`, migrations V5 and
//! V25): a worker takes grants before it pulls a limited queue's messages, one row per
//! acquire that counts them (held, running, started), and reports how those counts changed
//! with its next acquire.

use super::sql;
use super::{Result, Store};
use std::time::Duration;

/// What `flow_take` answered.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Grant {
    /// The row that holds the new grants (`None` when none were granted).
    pub row: Option<i64>,
    pub granted: usize,
    /// When nothing was granted: how long until asking again makes sense.
    pub retry_in: Duration,
}

/// One of the worker's grant rows as it stands now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrantCounts {
    pub id: i64,
    /// Granted, not used by a claim yet.
    pub held: usize,
    /// Started by a claim, not ended.
    pub running: usize,
    /// Started by a claim in all.
    pub started: usize,
}

impl Store {
    /// Reports `rows` (every grant row of the worker for `queue` that holds or runs
    /// anything), then takes up to `want` grants for `queue` within its cap and rate limit.
    pub async fn flow_take(
        &self,
        queue: &str,
        worker_id: &str,
        want: usize,
        cap: Option<u32>,
        rate: Option<crate::config::RateLimit>,
        rows: &[GrantCounts],
    ) -> Result<Grant> {
        let c = self.client().await?;
        let st = c.prepare_cached(sql::FLOW_TAKE).await?;
        let want = want.min(i32::MAX as usize) as i32;
        let cap = cap.map(|c| c as i32);
        let rate_n = rate.map(|r| r.starts as i32);
        let window_ms = rate.map(|r| r.window.as_millis() as i64);
        let count = |f: fn(&GrantCounts) -> usize| -> Vec<i32> {
            rows.iter()
                .map(|r| f(r).min(i32::MAX as usize) as i32)
                .collect()
        };
        let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
        let (held, running, started) = (
            count(|r| r.held),
            count(|r| r.running),
            count(|r| r.started),
        );
        let r = c
            .query_one(
                &st,
                &[
                    &queue, &worker_id, &want, &cap, &rate_n, &window_ms, &ids, &held, &running,
                    &started,
                ],
            )
            .await?;
        Ok(Grant {
            row: r.get(0),
            granted: r.get::<_, i32>(1).max(0) as usize,
            retry_in: Duration::from_millis(r.get::<_, i64>(2).max(0) as u64),
        })
    }
}
