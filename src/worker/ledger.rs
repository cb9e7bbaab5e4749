//! The job ledger: every job this worker owns, from the claim that gave it to us until its
//! attempt is settled or given up, in one place and under one lock.
//!
//! A job's life inside the process is a handful of named transitions:
//!
//! ```text
//!  claimed ──▶ started ──▶ (progressed)* ──▶ finished ──▶ settled   (completer committed)
//!     │           │                              └──────▶ settled   (fence rejected: lost)
//!     └───────────┴──▶ lost / released ──▶ (attempt stops) ──▶ ended
//! ```
//!
//! Entries are keyed by job id and carry the lease: a transition names `(id, lease)` and only
//! touches the entry of that attempt, so a stopped attempt's late report, result or exit can
//! never affect a newer attempt of the same job that this worker claimed again. Progress
//! reports are matched on the lease too (invariant 1, and the local API's `?lease=`).
//!
//! The heartbeat's lease check compares [`Ledger::owned`] with the database; shutdown waits on
//! [`Ledger::wait_empty`], woken by every removal instead of polling.

use super::QueuePolicy;
use crate::handler::{AttemptControl, Stop};
use async_nats::jetstream::message::Acker;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

/// Where an owned attempt stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// Claimed in the database, not running yet.
    Claimed,
    /// Its handler runs.
    Running,
    /// Its outcome is with the completer.
    Finished,
}

struct Entry {
    lease: i64,
    state: State,
    policy: Arc<QueuePolicy>,
    acker: Arc<Acker>,
    control: Arc<AttemptControl>,
}

/// The handle of one owned attempt, for its executor.
#[derive(Clone)]
pub(crate) struct Attempt {
    pub policy: Arc<QueuePolicy>,
    pub acker: Arc<Acker>,
    pub control: Arc<AttemptControl>,
}

#[derive(Default)]
pub(crate) struct Ledger {
    jobs: Mutex<HashMap<String, Entry>>,
    /// Woken whenever an entry goes away.
    removed: Notify,
}

impl Ledger {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.jobs.lock().expect("ledger lock")
    }

    /// **claimed**: this worker owns `id` under `lease` from now. An older attempt of the same
    /// job still here was taken from us and has just been claimed again: it is stopped.
    pub fn claimed(
        &self,
        id: &str,
        lease: i64,
        policy: Arc<QueuePolicy>,
        acker: Arc<Acker>,
        control: Arc<AttemptControl>,
    ) -> Attempt {
        let entry = Entry {
            lease,
            state: State::Claimed,
            policy: policy.clone(),
            acker: acker.clone(),
            control: control.clone(),
        };
        if let Some(old) = self.lock().insert(id.to_string(), entry) {
            if old.lease != lease {
                old.control.stop(Stop::Lost);
            }
        }
        Attempt {
            policy,
            acker,
            control,
        }
    }

    /// **started**: the attempt's handler runs.
    pub fn started(&self, id: &str, lease: i64) {
        self.transition(id, lease, State::Running);
    }

    /// **progressed**: a progress report for attempt `(id, lease)`; its acker (for the
    /// in-progress ack) and policy, or `None` when that attempt does not run here (any more).
    pub fn progressed(&self, id: &str, lease: i64) -> Option<(Arc<Acker>, Arc<QueuePolicy>)> {
        self.lock()
            .get(id)
            .filter(|e| e.lease == lease && e.state == State::Running)
            .map(|e| (e.acker.clone(), e.policy.clone()))
    }

    /// **finished**: the attempt's outcome went to the completer.
    pub fn finished(&self, id: &str, lease: i64) {
        self.transition(id, lease, State::Finished);
    }

    /// **settled**: the completer wrote the outcome (or the fence rejected it), or the
    /// attempt ended without one after it was stopped: forget it.
    pub fn settled(&self, id: &str, lease: i64) {
        let mut jobs = self.lock();
        if jobs.get(id).is_some_and(|e| e.lease == lease) {
            jobs.remove(id);
            drop(jobs);
            self.removed.notify_waiters();
        }
    }

    /// **lost**: the database no longer gives attempt `(id, lease)` to this worker. Stops it
    /// (it is forgotten when its executor ends). Returns whether it was still running.
    pub fn lost(&self, id: &str, lease: i64) -> bool {
        let jobs = self.lock();
        match jobs.get(id) {
            Some(e) if e.lease == lease && e.state != State::Finished => {
                e.control.stop(Stop::Lost);
                true
            }
            _ => false,
        }
    }

    /// **released** (shutdown, drain) or **lost** all at once (self-fence, declared dead):
    /// stops every attempt that still runs. Returns how many.
    pub fn stop_all(&self, why: Stop) -> usize {
        let jobs = self.lock();
        let mut n = 0;
        for e in jobs.values().filter(|e| e.state != State::Finished) {
            e.control.stop(why);
            n += 1;
        }
        n
    }

    /// Attempts held now (claimed, running or finished and not yet settled), by queue.
    pub fn in_flight_by_queue(&self) -> HashMap<String, usize> {
        let mut out: HashMap<String, usize> = HashMap::new();
        for e in self.lock().values() {
            *out.entry(e.policy.name.clone()).or_default() += 1;
        }
        out
    }

    /// The attempts this worker owns now: id → lease.
    pub fn owned(&self) -> HashMap<String, i64> {
        self.lock()
            .iter()
            .map(|(id, e)| (id.clone(), e.lease))
            .collect()
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Returns once no attempt is owned.
    pub async fn wait_empty(&self) {
        loop {
            let removed = self.removed.notified();
            tokio::pin!(removed);
            // Registered before the check, so a removal in between is not missed.
            removed.as_mut().enable();
            if self.is_empty() {
                return;
            }
            removed.await;
        }
    }

    fn transition(&self, id: &str, lease: i64, to: State) {
        if let Some(e) = self.lock().get_mut(id).filter(|e| e.lease == lease) {
            e.state = to;
        }
    }
}
