//! The Rescuer: finds jobs whose owner can no longer finish them and gives them back.
//! Any worker runs it; `FOR UPDATE SKIP LOCKED` and the fencing lease make concurrent
//! rescuers harmless. Reclaimed jobs become `scheduled` now, so the scheduler republishes
//! them with a new message id at once (or `dead` when that was their last attempt: a crash
//! costs an attempt).
//!
//! | layer | catches | when |
//! |---|---|---|
//! | start-up reconciliation | this host restarted | at start, before taking work |
//! | heartbeat reaper | a process died, a host vanished, SIGSTOP | every `reap_every`, owner silent for `dead_after` |
//! | stale sweep | a hung handler in a live process | every `sweep_every`, no activity for `stale_after` |
//! | broker-loss reconciliation | a `queued` job whose message is gone | every `sweep_every`, queue's consumer empty, job older than `broker_lost_after` |

use super::{Shared, Stats};
use crate::liveness::{boot_id, incarnation_alive, proc_start};
use crate::store::Reclaimed;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Most jobs one round takes back.
const ROUND_LIMIT: i64 = 1000;

pub(crate) struct Rescuer {
    shared: Arc<Shared>,
}

impl Rescuer {
    pub fn new(shared: Arc<Shared>) -> Rescuer {
        Rescuer { shared }
    }

    pub async fn run(self, cancel: CancellationToken) {
        let w = &self.shared.config.worker;
        let mut reap = tokio::time::interval(w.reap_every);
        reap.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_sweep = Instant::now();
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = reap.tick() => {}
            }
            if let Err(e) = self.reap_once().await {
                warn!(cause = %e, "heartbeat reaper round failed");
            }
            if last_sweep.elapsed() >= w.sweep_every {
                last_sweep = Instant::now();
                if let Err(e) = self.sweep_stale_once().await {
                    warn!(cause = %e, "stale sweep failed");
                }
                if let Err(e) = self.broker_lost_once().await {
                    warn!(cause = %e, "broker-loss reconciliation failed");
                }
            }
        }
    }

    /// Start-up reconciliation: earlier incarnations of this hostname that are not running
    /// any more (checked by boot id, pid and process start time — never by heartbeat age)
    /// are marked stopped and their jobs taken back. Live workers on this host — several
    /// sidecars, a laptop running the demo — are never touched, nor is any other host.
    pub async fn reconcile_startup(&self) -> usize {
        let shared = &self.shared;
        let others = match shared
            .store
            .workers_on_host(&shared.hostname, &shared.worker_id)
            .await
        {
            Ok(o) => o,
            Err(e) => {
                warn!(cause = %e, "start-up reconciliation skipped");
                return 0;
            }
        };
        let mine = boot_id();
        let ns = crate::liveness::pid_namespace();
        let gone: Vec<String> = others
            .into_iter()
            .filter(|o| !incarnation_alive(o, mine.as_deref(), ns.as_deref(), proc_start))
            .map(|o| o.id)
            .collect();
        if gone.is_empty() {
            return 0;
        }
        match shared.store.job_reclaim_owners(&gone, "restarted").await {
            Ok(jobs) => {
                Stats::add(&shared.stats.reclaimed_restarted, jobs.len() as u64);
                self.log("restarted", &jobs).await;
                info!(previous = ?gone, jobs = jobs.len(), "start-up reconciliation: earlier incarnations of this host are gone");
                jobs.len()
            }
            Err(e) => {
                warn!(cause = %e, "start-up reconciliation failed");
                0
            }
        }
    }

    /// Heartbeat reaper: one round. Returns the jobs taken back.
    pub async fn reap_once(&self) -> Result<usize, crate::store::StoreError> {
        let dead_after = self.shared.config.worker.dead_after;
        let jobs = self
            .shared
            .store
            .job_reclaim_dead_owners(dead_after, ROUND_LIMIT)
            .await?;
        Stats::add(&self.shared.stats.reclaimed_owner_dead, jobs.len() as u64);
        self.log("owner_dead", &jobs).await;
        Ok(jobs.len())
    }

    /// Stale sweep: one round. Returns the jobs taken back.
    pub async fn sweep_stale_once(&self) -> Result<usize, crate::store::StoreError> {
        let c = &self.shared.config;
        let per_queue: Vec<(String, Duration)> = c
            .queues
            .iter()
            .filter_map(|(q, qc)| qc.stale_after.map(|s| (q.clone(), s)))
            .collect();
        let jobs = self
            .shared
            .store
            .job_reclaim_stale(c.worker.stale_after, &per_queue, ROUND_LIMIT)
            .await?;
        Stats::add(&self.shared.stats.reclaimed_stale, jobs.len() as u64);
        self.log("stale", &jobs).await;
        Ok(jobs.len())
    }

    /// Broker-loss reconciliation: for each queue whose consumer has nothing left to
    /// deliver, `queued` jobs older than `broker_lost_after` have lost their message.
    pub async fn broker_lost_once(&self) -> Result<usize, String> {
        let shared = &self.shared;
        let mut total = 0;
        for queue in shared.config.queues.keys() {
            let mut consumer = shared
                .broker
                .consumer(queue)
                .await
                .map_err(|e| e.to_string())?;
            let info = consumer.info().await.map_err(|e| e.to_string())?;
            if info.num_pending > 0 {
                continue; // messages still on their way: queued jobs may be among them
            }
            let ids = shared
                .store
                .job_requeue_lost(queue, shared.config.worker.broker_lost_after, ROUND_LIMIT)
                .await
                .map_err(|e| e.to_string())?;
            if !ids.is_empty() {
                warn!(%queue, jobs = ids.len(), "queued jobs without a message in the stream: republishing (broker_lost)");
            }
            total += ids.len();
        }
        Stats::add(&shared.stats.republished_broker_lost, total as u64);
        Ok(total)
    }

    async fn log(&self, reason: &str, jobs: &[Reclaimed]) {
        for j in jobs {
            warn!(job.id = %j.id, reason, owner = ?j.owner, status = %j.status, "job reclaimed");
            if j.status == crate::job::JobStatus::Dead {
                self.shared
                    .announce_dead(&j.queue, &j.id, Some(reason))
                    .await;
            }
        }
    }
}
