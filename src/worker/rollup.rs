//! The Rollup service: keeps `job_rollup` (migrations/V16) up to date, so that the
//! statistics, the dashboard and its charts read a few rows per queue instead of the history.
//!
//! Any worker may run a step; one runs at a time cluster-wide (a step holds the mark's row
//! and the others skip it). A step reads what finished since the mark through the partial
//! indexes of finished rows, adds it to its minutes and moves the mark, never past a time
//! before which a running transaction could still commit a row. When behind (a new
//! installation rolling up its last day, a worker back after an outage), steps follow each
//! other without a pause, [`STEPS_PER_ROUND`] at most, so that a round stays short and the
//! worker's shutdown prompt.

use super::outage::Outage;
use super::Shared;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::debug;

/// How often a round starts (readers add the live tail after the mark: answers are exact
/// whatever this is; it bounds how many rows the tail holds).
pub(crate) const ROLLUP_EVERY: Duration = Duration::from_secs(5);
/// Most steps in one round.
const STEPS_PER_ROUND: usize = 20;

pub(crate) struct Rollup {
    shared: Arc<Shared>,
}

impl Rollup {
    pub fn new(shared: Arc<Shared>) -> Rollup {
        Rollup { shared }
    }

    pub async fn run(self, cancel: CancellationToken) {
        let mut outage = Outage::new("rollup");
        let mut next = Duration::from_millis(500);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(next) => {}
            }
            next = match self.round(&cancel).await {
                Ok(()) => {
                    outage.ok();
                    ROLLUP_EVERY
                }
                Err(e) => outage.failed(&e).max(ROLLUP_EVERY),
            };
        }
    }

    /// Steps until the mark has caught up with what is safe to read, another worker is
    /// stepping, or the round's steps are spent.
    async fn round(&self, cancel: &CancellationToken) -> Result<(), crate::store::StoreError> {
        for _ in 0..STEPS_PER_ROUND {
            let step = self.shared.store.rollup_step().await?;
            debug!(?step, "rollup step");
            if step.caught_up || cancel.is_cancelled() {
                break;
            }
        }
        Ok(())
    }
}
