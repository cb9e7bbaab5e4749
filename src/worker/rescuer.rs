//! The Rescuer: finds jobs whose owner can no longer finish them and gives them back.
//! Any worker runs it; `FOR UPDATE SKIP LOCKED` and the fencing lease make concurrent
//! rescuers harmless. Reclaimed jobs become `scheduled` now, so the scheduler republishes
//! them with a new message id at once (or `dead` when that was their last attempt: a crash
//! costs an attempt).
//!
//! Every owner is judged by what it declared, never by this pod's settings (invariant 10):
//! a worker by the `dead_after` stored in its `workers` row, a job by the stale deadline its
//! owner stored in the job row (claim or last report + the queue's `stale_after`).
//!
//! | layer | catches | when |
//! |---|---|---|
//! | start-up reconciliation | this host restarted | at start, before taking work; only incarnations provably gone |
//! | heartbeat reaper | a process died, a host vanished, SIGSTOP | every `reap_every`, owner silent past its own `dead_after` |
//! | stale sweep | a hung handler in a live process | every `sweep_every`, past the deadline its owner declared |

use super::outage::Outage;
use super::{Shared, Stats};
use crate::liveness::{boot_id, incarnation_gone, pid_namespace, proc_state};
use crate::store::Reclaimed;
use std::sync::Arc;
use std::time::Instant;
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
        let mut outage = Outage::new("reaper and stale sweep");
        let mut last_sweep = Instant::now();
        let mut wait = w.reap_every;
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            let mut round = self.reap_once().await.map(|_| ());
            if round.is_ok() && last_sweep.elapsed() >= w.sweep_every {
                last_sweep = Instant::now();
                round = self.sweep_stale_once().await.map(|_| ());
            }
            wait = match round {
                Ok(()) => {
                    outage.ok();
                    w.reap_every
                }
                Err(e) => outage.failed(&e).max(w.reap_every),
            };
        }
    }

    /// Start-up reconciliation: earlier incarnations of this hostname that are provably not
    /// running any more (same boot and pid namespace, and no live process with their pid and
    /// start time — a zombie is not live) are marked stopped and their jobs taken back. Every
    /// other incarnation may be alive — several sidecars on one host, a process with the same
    /// host name on another node — and is left to the heartbeat reaper, which judges it by
    /// its own heartbeat.
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
        let ns = pid_namespace();
        let gone: Vec<String> = others
            .into_iter()
            .filter(|o| incarnation_gone(o, mine.as_deref(), ns.as_deref(), proc_state))
            .map(|o| o.id)
            .collect();
        if gone.is_empty() {
            return 0;
        }
        match shared.store.job_reclaim_owners(&gone, "restarted").await {
            Ok(jobs) => {
                Stats::add(&shared.stats.reclaimed_restarted, jobs.len() as u64);
                self.log("restarted", &jobs);
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
        let jobs = self
            .shared
            .store
            .job_reclaim_dead_owners(ROUND_LIMIT)
            .await?;
        Stats::add(&self.shared.stats.reclaimed_owner_dead, jobs.len() as u64);
        self.log("owner_dead", &jobs);
        Ok(jobs.len())
    }

    /// Stale sweep: one round. Returns the jobs taken back.
    pub async fn sweep_stale_once(&self) -> Result<usize, crate::store::StoreError> {
        let fallback = self.shared.config.worker.stale_after;
        let jobs = self
            .shared
            .store
            .job_reclaim_stale(ROUND_LIMIT, fallback)
            .await?;
        Stats::add(&self.shared.stats.reclaimed_stale, jobs.len() as u64);
        self.log("stale", &jobs);
        Ok(jobs.len())
    }

    fn log(&self, reason: &str, jobs: &[Reclaimed]) {
        for j in jobs {
            warn!(job.id = %j.id, reason, owner = ?j.owner, status = %j.status, "job reclaimed");
            if j.status == crate::job::JobStatus::Dead {
                self.shared.announce_dead(&j.queue, &j.id, Some(reason));
            }
        }
        let telemetry = &self.shared.telemetry;
        if telemetry.is_on() && !jobs.is_empty() {
            let prefix = self.shared.broker.subject_prefix();
            let subjects: Vec<String> = jobs
                .iter()
                .map(|j| format!("{prefix}.{}", j.queue))
                .collect();
            let refs: Vec<crate::telemetry::JobRef<'_>> = jobs
                .iter()
                .zip(&subjects)
                .map(|(j, subject)| crate::telemetry::JobRef {
                    id: &j.id,
                    queue: &j.queue,
                    subject,
                    traceparent: j.traceparent.as_deref(),
                })
                .collect();
            telemetry.recovered(&refs, reason);
        }
    }
}
