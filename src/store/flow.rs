//! Cluster-wide flow control per queue (`flow_acquire()` and `flow_grants`, migration V5):
//! a worker takes grants before it pulls a limited queue's messages, marks them started when
//! its claim runs the jobs (or gives back the ones it did not use), and done when the jobs
//! end.

use super::sql;
use super::{Result, Store};
use std::time::Duration;

/// What `flow_acquire` answered.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Grant {
    pub granted: usize,
    /// When nothing was granted: how long until asking again makes sense.
    pub retry_in: Duration,
}

impl Store {
    /// Takes up to `want` grants for `queue` within its cap and rate limit.
    pub async fn flow_acquire(
        &self,
        queue: &str,
        worker_id: &str,
        want: usize,
        cap: Option<u32>,
        rate: Option<crate::config::RateLimit>,
    ) -> Result<Grant> {
        let c = self.client().await?;
        let st = c.prepare_cached(sql::FLOW_ACQUIRE).await?;
        let want = want.min(i32::MAX as usize) as i32;
        let cap = cap.map(|c| c as i32);
        let rate_n = rate.map(|r| r.starts as i32);
        let window_ms = rate.map(|r| r.window.as_millis() as i64);
        let r = c
            .query_one(&st, &[&queue, &worker_id, &want, &cap, &rate_n, &window_ms])
            .await?;
        Ok(Grant {
            granted: r.get::<_, i32>(0).max(0) as usize,
            retry_in: Duration::from_millis(r.get::<_, i64>(1).max(0) as u64),
        })
    }

    /// `started` of the worker's grants ran jobs now; `unused` more go back.
    pub async fn flow_started(
        &self,
        queue: &str,
        worker_id: &str,
        started: usize,
        unused: usize,
    ) -> Result<()> {
        let c = self.client().await?;
        let st = c.prepare_cached(sql::FLOW_STARTED).await?;
        c.execute(
            &st,
            &[&queue, &worker_id, &(started as i64), &(unused as i64)],
        )
        .await?;
        Ok(())
    }

    /// `n` jobs the worker started have ended (`rate_limited`: keep their rows for the
    /// window).
    pub async fn flow_done(
        &self,
        queue: &str,
        worker_id: &str,
        n: usize,
        rate_limited: bool,
    ) -> Result<()> {
        let c = self.client().await?;
        let st = c.prepare_cached(sql::FLOW_DONE).await?;
        c.execute(&st, &[&queue, &worker_id, &(n as i64), &rate_limited])
            .await?;
        Ok(())
    }
}
