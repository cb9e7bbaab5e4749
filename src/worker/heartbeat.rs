//! The Heartbeat: refreshes this worker's `workers` row every `heartbeat_every`, and with
//! each beat
//!
//! - checks its leases: attempts the database no longer gives to this worker are stopped at
//!   once (another worker took them), and jobs the database says it owns but that no longer
//!   run here (after a self-fence) are given back;
//! - fences itself off when it could not renew the heartbeat for `dead_after` minus one
//!   beat: it stops its handlers and takes no new work, because the other workers are about
//!   to declare it dead and run its jobs again. It resumes when a beat succeeds.
//! - re-registers when its row says it was declared dead (e.g. after a SIGSTOP).

use super::{Shared, Stats, STOP_LOST};
use crate::liveness::must_self_fence;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

pub(crate) struct Heartbeat {
    shared: Arc<Shared>,
    /// Orphans seen on the previous beat: given back when seen twice, so a job claimed
    /// between the database read and the local snapshot is never mistaken for one.
    suspects: HashSet<(String, i64)>,
}

impl Heartbeat {
    pub fn new(shared: Arc<Shared>) -> Heartbeat {
        Heartbeat {
            shared,
            suspects: HashSet::new(),
        }
    }

    pub async fn run(mut self, cancel: CancellationToken) {
        let w = self.shared.config.worker.clone();
        let mut tick = tokio::time::interval(w.heartbeat_every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // When the last beat that succeeded was *sent*: the database stamps heartbeat_at at
        // the start of the statement, so that is what the reaper measures from.
        let mut last_ok = Instant::now();
        // Each database call may take at most half a beat, so a hanging database cannot
        // delay the self-fence past the moment others declare this worker dead.
        let call_limit = w.heartbeat_every / 2;
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tick.tick() => {}
            }
            self.fence_if_silent(last_ok.elapsed());
            let sent = Instant::now();
            let beat = tokio::time::timeout(
                call_limit,
                self.shared.store.worker_beat(&self.shared.worker_id),
            )
            .await;
            match beat {
                Ok(Ok(true)) => {
                    last_ok = sent;
                    if self.shared.fenced.swap(false, Ordering::SeqCst) {
                        info!(worker.id = %self.shared.worker_id, "heartbeat renewed: taking work again");
                    }
                    match tokio::time::timeout(call_limit, self.check_leases()).await {
                        Ok(Err(e)) => warn!(cause = %e, "lease check failed"),
                        Err(_) => warn!("lease check timed out"),
                        Ok(Ok(())) => {}
                    }
                }
                Ok(Ok(false)) => {
                    // Declared dead (a long pause, a partition): its jobs were taken. Take no
                    // work until registered again.
                    self.shared.fenced.store(true, Ordering::SeqCst);
                    let n = self.shared.stop_all(STOP_LOST);
                    warn!(worker.id = %self.shared.worker_id, stopped = n,
                          "this worker was declared dead by others; stopping its attempts and registering again");
                    let pid = std::process::id() as i32;
                    let registered = self
                        .shared
                        .store
                        .worker_register(
                            &self.shared.worker_id,
                            &self.shared.hostname,
                            pid,
                            crate::liveness::boot_id().as_deref(),
                            crate::liveness::proc_start(pid),
                        )
                        .await;
                    match registered {
                        Ok(()) => {
                            last_ok = sent;
                            self.shared.fenced.store(false, Ordering::SeqCst);
                        }
                        Err(e) => warn!(cause = %e, "could not register again; still fenced"),
                    }
                }
                Ok(Err(_)) | Err(_) => {
                    warn!(worker.id = %self.shared.worker_id, silent_for = ?last_ok.elapsed(), "heartbeat not renewed");
                    self.fence_if_silent(last_ok.elapsed());
                }
            }
        }
    }

    /// Fences this worker off when its heartbeat has been silent too long.
    fn fence_if_silent(&self, silent: std::time::Duration) {
        let w = &self.shared.config.worker;
        if must_self_fence(silent, w.dead_after, w.heartbeat_every)
            && !self.shared.fenced.swap(true, Ordering::SeqCst)
        {
            let n = self.shared.stop_all(STOP_LOST);
            Stats::add(&self.shared.stats.self_fenced, 1);
            error!(worker.id = %self.shared.worker_id, stopped = n, silent_for = ?silent,
                   "cannot renew the heartbeat: stopping all handlers before this worker is declared dead");
        }
    }

    /// Compares the leases the database gives this worker with what runs here.
    async fn check_leases(&mut self) -> Result<(), crate::store::StoreError> {
        let shared = &self.shared;
        // Local view first: anything claimed after this snapshot cannot be judged lost.
        let local: HashMap<String, i64> = shared.owned.lock().expect("owned lock").clone();
        let in_db = shared.store.jobs_owned(&shared.worker_id).await?;
        let db: HashMap<&str, i64> = in_db.iter().map(|(id, l)| (id.as_str(), *l)).collect();
        // Running here but no longer ours: stop at once.
        {
            let map = shared.inflight.lock().expect("inflight lock");
            for (id, lease) in &local {
                if db.get(id.as_str()) != Some(lease) {
                    if let Some(f) = map.get(id) {
                        if f.lease == *lease {
                            f.stop.store(STOP_LOST, Ordering::SeqCst);
                            f.cancel.cancel();
                            Stats::add(&shared.stats.lost_ownership, 1);
                            warn!(job.id = %id, job.lease = lease, "job was taken from this worker; stopping its attempt");
                        }
                    }
                }
            }
        }
        // Ours in the database but not running here (stopped by a self-fence): give back
        // after two beats in a row, so a claim racing this check is never taken for one.
        let now_local = shared.owned.lock().expect("owned lock").clone();
        let orphans: HashSet<(String, i64)> = in_db
            .into_iter()
            .filter(|(id, lease)| now_local.get(id) != Some(lease))
            .collect();
        let confirmed: Vec<(String, i64)> = orphans.intersection(&self.suspects).cloned().collect();
        self.suspects = orphans;
        if !confirmed.is_empty() {
            let released = shared
                .store
                .job_release(&shared.worker_id, &confirmed, "self_fenced", false)
                .await?;
            warn!(
                jobs = released.len(),
                "gave back jobs this worker no longer runs (after a self-fence)"
            );
            for id in &released {
                self.suspects.retain(|(s, _)| s != id);
            }
        }
        Ok(())
    }
}
