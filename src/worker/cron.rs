//! The Cron service: every worker ticks every schedule twice a second; the worker that
//! locks a schedule's row first enqueues its due fires (see `store::cron_tick`), so each fire
//! becomes one job however many workers run, whichever of them dies mid-tick (its
//! transaction rolls back and the next tick of any worker does it).

use super::outage::Outage;
use super::{Shared, Stats};
use crate::cron::Schedule;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::info;

const TICK: Duration = Duration::from_millis(500);

pub(crate) struct CronService {
    shared: Arc<Shared>,
    schedules: Vec<Schedule>,
}

impl CronService {
    pub fn new(shared: Arc<Shared>) -> CronService {
        let schedules = shared
            .config
            .cron
            .iter()
            .filter_map(|(name, c)| Schedule::new(name, c).ok())
            .collect();
        CronService { shared, schedules }
    }

    pub async fn run(self, cancel: CancellationToken) {
        if self.schedules.is_empty() {
            // Nothing to do, but a service runs until shutdown: an early end is a failure.
            cancel.cancelled().await;
            return;
        }
        let names: Vec<&str> = self.schedules.iter().map(|s| s.name.as_str()).collect();
        info!(schedules = ?names, "cron schedules: each fire is enqueued once across all workers");
        let mut outage = Outage::new("cron");
        let mut wait = TICK;
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            wait = match self.tick().await {
                Ok(()) => {
                    outage.ok();
                    TICK
                }
                Err(e) => outage.failed(&e).max(TICK),
            };
        }
    }

    async fn tick(&self) -> Result<(), String> {
        for s in &self.schedules {
            let ids = self
                .shared
                .store
                .cron_tick(s)
                .await
                .map_err(|e| format!("schedule {}: {e}", s.name))?;
            if !ids.is_empty() {
                Stats::add(&self.shared.stats.cron_fired, ids.len() as u64);
                info!(schedule = %s.name, queue = %s.config.queue, jobs = ?ids, "cron fired");
            }
        }
        Ok(())
    }
}
