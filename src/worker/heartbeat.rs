//! The Heartbeat: refreshes this worker's `workers` row every `heartbeat_every`, and with
//! each beat
//!
//! - checks its leases: attempts the database no longer gives to this worker are stopped at
//!   once (another worker took them), and jobs the database says it owns but that no longer
//!   run here (stopped by a self-fence) are given back, their attempt counted;
//! - fences itself off when it has not renewed the heartbeat for `fence_after` (derived in
//!   [`Pacing`](crate::liveness::Pacing), two thirds of `dead_after`): it stops its handlers
//!   and takes no new work, because the other workers are about to declare it dead and run
//!   its jobs again. It resumes when a beat succeeds.
//! - registers again when its row says it was declared dead (or when a claim found it so).
//!
//! A beat in flight is never abandoned: when a lock or a slow server holds it, the fence
//! deadline is still watched, and the beat, once it lands, counts from when it was sent (the
//! database stamps `heartbeat_at` when the statement starts). A failed beat is retried after
//! `retry_every`, not a whole interval later, so one slow or failed beat fences no one.

use super::outage::Outage;
use super::{Shared, Stats};
use crate::handler::Stop;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

pub(crate) struct Heartbeat {
    shared: Arc<Shared>,
    /// Orphans seen on the previous beat, and the claim mark taken with them: given back
    /// when seen again once every claim begun before that mark has been taken in, so a job
    /// whose claim committed but whose answer has not reached the ledger yet (however late)
    /// is never mistaken for one.
    suspects: HashSet<(String, i64)>,
    suspects_mark: u64,
    /// When the last successful beat was sent.
    last_ok: Instant,
    outage: Outage,
    /// Lease checks and registering again: logged once per run of failures, not per beat.
    leases: Outage,
}

enum Beat {
    /// Renewed; the database stamped it this long before its answer arrived.
    Renewed(std::time::Duration),
    DeclaredDead,
    Failed,
}

impl Heartbeat {
    pub fn new(shared: Arc<Shared>) -> Heartbeat {
        Heartbeat {
            shared,
            suspects: HashSet::new(),
            suspects_mark: 0,
            // Registration, just before the services start, was a beat.
            last_ok: Instant::now(),
            outage: Outage::new("heartbeat"),
            leases: Outage::new("lease check"),
        }
    }

    pub async fn run(mut self, cancel: CancellationToken) {
        let pacing = self.shared.pacing;
        let mut next = self.last_ok + pacing.heartbeat_every;
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep_until(next) => {}
                _ = self.shared.reregister.notified() => {}
                _ = tokio::time::sleep_until(self.fence_at()), if !self.fenced() => {
                    self.fence();
                    continue;
                }
            }
            let sent = Instant::now();
            let beat = match self.beat(&cancel).await {
                Some(b) => b,
                None => return, // cancelled
            };
            next = match beat {
                Beat::Renewed(age) => {
                    // When the database stamped the beat, on our clock: no earlier than we
                    // sent it, and `age` (its own clock) before it answered. Taking the answer
                    // to be now errs late by one network delay, which the stop margin covers;
                    // a beat a stalled server stamped only when it resumed is not mistaken for
                    // one stamped when it was sent.
                    self.last_ok = Instant::now().checked_sub(age).unwrap_or(sent).max(sent);
                    self.outage.ok();
                    if self.shared.fenced.swap(false, Ordering::SeqCst) {
                        info!(worker.id = %self.shared.worker_id, "heartbeat renewed: taking work again");
                    }
                    // Bounded, so a slow check never delays the next beat much.
                    match tokio::time::timeout(pacing.heartbeat_every / 2, self.check_leases())
                        .await
                    {
                        Ok(Err(e)) => {
                            self.leases.failed(&e);
                        }
                        Err(_) => {
                            self.leases.failed(&"timed out");
                        }
                        Ok(Ok(())) => self.leases.ok(),
                    }
                    self.last_ok + pacing.heartbeat_every
                }
                Beat::DeclaredDead => {
                    // Declared dead (a long pause, a partition): its jobs were taken. Take no
                    // work until registered again.
                    self.shared.fenced.store(true, Ordering::SeqCst);
                    let n = self.shared.ledger.stop_all(Stop::Lost);
                    warn!(worker.id = %self.shared.worker_id, stopped = n,
                          "this worker was declared dead by others; stopping its attempts and registering again");
                    match self.shared.register().await {
                        Ok(()) => {
                            self.last_ok = sent;
                            self.shared.fenced.store(false, Ordering::SeqCst);
                            info!(worker.id = %self.shared.worker_id, "registered again: taking work");
                            sent + pacing.heartbeat_every
                        }
                        Err(e) => {
                            // Logged once per run of failures. The pace stays the
                            // heartbeat's own (not the outage's backoff): registering is
                            // what lets the worker take work again.
                            let cause = format!("could not register again; still fenced: {e}");
                            self.outage.failed(&cause);
                            Instant::now() + pacing.retry_every()
                        }
                    }
                }
                Beat::Failed => Instant::now() + pacing.retry_every(),
            };
        }
    }

    /// Sends one beat and waits for it as long as it takes, fencing meanwhile if the fence
    /// deadline passes. `None` when cancelled.
    async fn beat(&mut self, cancel: &CancellationToken) -> Option<Beat> {
        let shared = self.shared.clone();
        let call = shared.beat_store.worker_beat(&shared.worker_id);
        tokio::pin!(call);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return None,
                r = &mut call => {
                    return Some(match r {
                        Ok(Some(age)) => Beat::Renewed(age),
                        Ok(None) => Beat::DeclaredDead,
                        Err(e) => {
                            self.outage.failed(&e);
                            Beat::Failed
                        }
                    });
                }
                _ = tokio::time::sleep_until(self.fence_at()), if !self.fenced() => self.fence(),
            }
        }
    }

    fn fence_at(&self) -> Instant {
        self.last_ok + self.shared.pacing.fence_after()
    }

    fn fenced(&self) -> bool {
        self.shared.fenced.load(Ordering::SeqCst)
    }

    /// Fences this worker off: its heartbeat has been silent too long.
    fn fence(&self) {
        if !self.shared.fenced.swap(true, Ordering::SeqCst) {
            let n = self.shared.ledger.stop_all(Stop::Lost);
            Stats::add(&self.shared.stats.self_fenced, 1);
            error!(worker.id = %self.shared.worker_id, stopped = n, silent_for = ?self.last_ok.elapsed(),
                   fence_after = ?self.shared.pacing.fence_after(),
                   "cannot renew the heartbeat: stopping all handlers before this worker is declared dead");
        }
    }

    /// Compares the leases the database gives this worker with what runs here.
    async fn check_leases(&mut self) -> Result<(), crate::store::StoreError> {
        let shared = &self.shared;
        // Local view first: anything claimed after this snapshot cannot be judged lost.
        let local: HashMap<String, i64> = shared.ledger.owned();
        let in_db = shared.beat_store.jobs_owned(&shared.worker_id).await?;
        let db: HashMap<&str, i64> = in_db.iter().map(|(id, l)| (id.as_str(), *l)).collect();
        // Running here but no longer ours: stop at once.
        for (id, lease) in &local {
            if db.get(id.as_str()) != Some(lease) && shared.ledger.lost(id, *lease) {
                Stats::add(&shared.stats.lost_ownership, 1);
                Stats::add(&shared.stats.overlapping, 1);
                warn!(job.id = %id, job.lease = lease, "job was taken from this worker; stopping its attempt");
            }
        }
        // Ours in the database but not running here (stopped by a self-fence): give back
        // when seen on two reads in a row, and only once every claim that could have
        // committed it (begun before the first read answered) has been taken in: a claim's
        // answer can reach the ledger long after its commit.
        let mark = shared.ledger.claim_mark();
        let judged = shared.ledger.claims_taken_in(self.suspects_mark);
        let now_local = shared.ledger.owned();
        let orphans: HashSet<(String, i64)> = in_db
            .into_iter()
            .filter(|(id, lease)| now_local.get(id) != Some(lease))
            .collect();
        let confirmed: Vec<(String, i64)> = if judged {
            orphans.intersection(&self.suspects).cloned().collect()
        } else {
            Vec::new()
        };
        self.suspects = orphans;
        self.suspects_mark = mark;
        if !confirmed.is_empty() {
            let back = shared
                .beat_store
                .job_reclaim_mine(&shared.worker_id, &confirmed)
                .await?;
            Stats::add(&shared.stats.reclaimed_self_fenced, back.len() as u64);
            warn!(
                jobs = back.len(),
                "gave back jobs this worker no longer runs (after a self-fence); their attempt counts"
            );
            for j in &back {
                self.suspects.retain(|(s, _)| s != &j.id);
                if j.status == crate::job::JobStatus::Dead {
                    shared.announce_dead(&j.queue, &j.id, Some("self_fenced"));
                }
            }
        }
        Ok(())
    }
}
