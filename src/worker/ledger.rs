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
//!
//! A claim commits in the database before its answer reaches this process, and the answer
//! may be taken in much later (its group waits on another row, or on a failing database):
//! meanwhile the database says this worker owns jobs the ledger has not heard of. So every
//! claim holds a [`ClaimTicket`] from before its statement is sent until its answer is taken
//! in, and the heartbeat judges a job missing from the ledger only once every claim that
//! could have committed it has been taken in ([`Ledger::claims_taken_in`]).

use super::outbound::JobAck;
use super::QueuePolicy;
use crate::handler::{AttemptControl, Stop};
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

/// Job id → its attempt. Hashed with foldhash, seeded per process: a job's id is hashed at
/// each transition, and SipHash cost several hundred instructions per lookup. The map holds
/// only this worker's attempts (its slots and the jobs claimed ahead), so even ids built to
/// collide could only slow the lookups of a few hundred entries.
type Jobs = HashMap<String, Entry, foldhash::fast::RandomState>;

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
    acker: JobAck,
    control: Arc<AttemptControl>,
}

/// The handle of one owned attempt, for its executor.
#[derive(Clone)]
pub(crate) struct Attempt {
    pub policy: Arc<QueuePolicy>,
    pub acker: JobAck,
    pub control: Arc<AttemptControl>,
}

#[derive(Default)]
pub(crate) struct Ledger {
    jobs: Mutex<Jobs>,
    /// Woken whenever an entry goes away.
    removed: Notify,
    /// Claims sent and not yet taken in.
    claims: Arc<Mutex<Claims>>,
}

/// Claims in flight, numbered in the order they began.
#[derive(Default)]
struct Claims {
    next: u64,
    open: BTreeSet<u64>,
}

/// Held by one claim from before its statement is sent until its answer is taken in (every
/// job it claimed recorded in the ledger, or handed back); dropping it says so.
pub(crate) struct ClaimTicket {
    claims: Arc<Mutex<Claims>>,
    seq: u64,
}

impl Drop for ClaimTicket {
    fn drop(&mut self) {
        self.claims
            .lock()
            .expect("claims lock")
            .open
            .remove(&self.seq);
    }
}

impl Ledger {
    fn lock(&self) -> std::sync::MutexGuard<'_, Jobs> {
        self.jobs.lock().expect("ledger lock")
    }

    /// A claim is about to be sent: its ticket, held until its answer is taken in.
    pub fn claim_ticket(&self) -> ClaimTicket {
        let mut c = self.claims.lock().expect("claims lock");
        let seq = c.next;
        c.next += 1;
        c.open.insert(seq);
        ClaimTicket {
            claims: self.claims.clone(),
            seq,
        }
    }

    /// A mark in the order of claims: those begun before now are the ones below it. Taken
    /// after a read of the jobs the database gives this worker, it covers every claim that
    /// could have committed one of them.
    pub fn claim_mark(&self) -> u64 {
        self.claims.lock().expect("claims lock").next
    }

    /// Whether every claim begun before `mark` has been taken in: the jobs they claimed are
    /// in the ledger now (or were handed back, or have ended).
    pub fn claims_taken_in(&self, mark: u64) -> bool {
        let c = self.claims.lock().expect("claims lock");
        c.open.first().is_none_or(|&oldest| oldest >= mark)
    }

    /// **claimed**: this worker owns `id` under `lease` from now. An older attempt of the same
    /// job still here was taken from us and has just been claimed again: it is stopped.
    pub fn claimed(
        &self,
        id: &str,
        lease: i64,
        policy: Arc<QueuePolicy>,
        acker: JobAck,
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
    pub fn progressed(&self, id: &str, lease: i64) -> Option<(JobAck, Arc<QueuePolicy>)> {
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
        // One lookup in the common case; an entry of another attempt (a newer claim of the
        // same job) goes back untouched.
        let Some(entry) = jobs.remove(id) else {
            return;
        };
        if entry.lease != lease {
            jobs.insert(id.to_string(), entry);
            return;
        }
        drop(jobs);
        drop(entry);
        self.removed.notify_waiters();
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

    /// Attempts claimed or running (not finished): whose handlers may still run.
    pub fn unfinished(&self) -> usize {
        self.lock()
            .values()
            .filter(|e| e.state != State::Finished)
            .count()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handler::from_fn;
    use std::time::Duration;

    /// A policy and an acker for ledger entries (none: nothing here acks).
    async fn parts() -> (Arc<QueuePolicy>, JobAck) {
        (policy("q"), None)
    }

    fn policy(name: &str) -> Arc<QueuePolicy> {
        Arc::new(QueuePolicy {
            name: name.into(),
            concurrency: 1,
            timeout: Duration::from_secs(1),
            max_attempts: 1,
            backoff: Default::default(),
            stale_after: Duration::from_secs(1),
            expire_after: None,
            key_from: None,
            gate: Default::default(),
            fair_every: 0,
            global_cap: None,
            rate: None,
            keys: None,
            handler: from_fn(|_| async { Ok(None) }),
            metrics: crate::worker::metrics::Metrics::new().queue(name),
            paused: Default::default(),
        })
    }

    #[tokio::test]
    async fn an_older_attempts_transitions_leave_the_newer_attempt_of_the_same_job_alone() {
        let (policy, acker) = parts().await;
        let ledger = Ledger::default();
        let first = Arc::new(AttemptControl::new(Duration::from_secs(1)));
        ledger.claimed("j", 1, policy.clone(), acker.clone(), first.clone());
        ledger.started("j", 1);
        // The job was taken from us and claimed again: the first attempt is stopped.
        let second = Arc::new(AttemptControl::new(Duration::from_secs(1)));
        ledger.claimed("j", 2, policy.clone(), acker.clone(), second.clone());
        assert_eq!(first.stopped(), Some(Stop::Lost));
        assert_eq!(second.stopped(), None);

        // The first attempt's late reports touch nothing.
        ledger.finished("j", 1);
        ledger.settled("j", 1);
        assert_eq!(ledger.len(), 1, "the second attempt is still owned");
        assert_eq!(ledger.owned().get("j"), Some(&2));
        assert!(
            ledger.progressed("j", 2).is_none(),
            "claimed, not running yet"
        );
        ledger.started("j", 2);
        assert!(ledger.progressed("j", 2).is_some());
        assert!(ledger.progressed("j", 1).is_none());

        ledger.finished("j", 2);
        ledger.settled("j", 2);
        assert!(ledger.is_empty());

        // A settle wakes whoever waits for the ledger to empty; another lease's does not.
        // (The test runtime has one thread: each yield lets the waiter run to its await.)
        let ledger = Arc::new(Ledger::default());
        ledger.claimed("k", 7, policy, acker, second);
        let waiter = {
            let ledger = ledger.clone();
            tokio::spawn(async move { ledger.wait_empty().await })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        ledger.settled("k", 6);
        assert_eq!(ledger.len(), 1, "another lease's settle removes nothing");
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "the waiter still waits");
        ledger.settled("k", 7);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("wait_empty returns once the last attempt is settled")
            .unwrap();
        assert!(ledger.is_empty());
    }

    fn control() -> Arc<AttemptControl> {
        Arc::new(AttemptControl::new(Duration::from_secs(1)))
    }

    /// A ledger holding one attempt of each kind: `claimed` (queue q), `running` (queue r),
    /// `finished` (queue q), each under lease 1.
    async fn three_attempts() -> (Ledger, [Arc<AttemptControl>; 3]) {
        let (q, acker) = parts().await;
        let r = policy("r");
        let ledger = Ledger::default();
        let controls = [control(), control(), control()];
        let [claimed, running, finished] = &controls;
        ledger.claimed("claimed", 1, q.clone(), acker.clone(), claimed.clone());
        ledger.claimed("running", 1, r, acker.clone(), running.clone());
        ledger.started("running", 1);
        ledger.claimed("finished", 1, q, acker, finished.clone());
        ledger.started("finished", 1);
        ledger.finished("finished", 1);
        (ledger, controls)
    }

    #[tokio::test]
    async fn a_lost_attempt_is_stopped_only_while_its_handler_may_still_run() {
        let (ledger, [claimed, running, finished]) = three_attempts().await;
        assert_eq!(ledger.len(), 3);
        assert_eq!(
            ledger.unfinished(),
            2,
            "the finished one's handler has ended"
        );
        // Another lease, an unknown job, an attempt whose outcome is with the completer:
        // nothing runs to be stopped.
        assert!(!ledger.lost("running", 2));
        assert!(!ledger.lost("nobody", 1));
        assert!(!ledger.lost("finished", 1));
        assert_eq!(running.stopped(), None);
        assert_eq!(finished.stopped(), None);
        assert!(ledger.lost("running", 1));
        assert_eq!(running.stopped(), Some(Stop::Lost));
        // Claimed and not started yet: stopped before it starts.
        assert!(ledger.lost("claimed", 1));
        assert_eq!(claimed.stopped(), Some(Stop::Lost));
        assert_eq!(
            ledger.len(),
            3,
            "lost attempts stay owned until their executors end"
        );
    }

    #[tokio::test]
    async fn stop_all_stops_every_attempt_whose_handler_may_still_run_and_counts_them() {
        let (ledger, [claimed, running, finished]) = three_attempts().await;
        let by_queue = |pairs: &[(&str, usize)]| {
            pairs
                .iter()
                .map(|(q, n)| (q.to_string(), *n))
                .collect::<HashMap<_, _>>()
        };
        // Held per queue, finished attempts included (not settled yet).
        assert_eq!(ledger.in_flight_by_queue(), by_queue(&[("q", 2), ("r", 1)]));
        assert_eq!(ledger.stop_all(Stop::Shutdown), 2);
        assert_eq!(claimed.stopped(), Some(Stop::Shutdown));
        assert_eq!(running.stopped(), Some(Stop::Shutdown));
        assert_eq!(finished.stopped(), None);
        for id in ["claimed", "running", "finished"] {
            ledger.settled(id, 1);
        }
        assert_eq!(ledger.len(), 0);
        assert_eq!(ledger.in_flight_by_queue(), by_queue(&[]));
        assert_eq!(ledger.stop_all(Stop::Lost), 0);
    }

    #[test]
    fn claims_are_taken_in_only_when_every_claim_begun_before_the_mark_has_ended() {
        let ledger = Ledger::default();
        assert!(
            ledger.claims_taken_in(ledger.claim_mark()),
            "no claim at all"
        );
        let first = ledger.claim_ticket();
        let second = ledger.claim_ticket();
        let mark = ledger.claim_mark();
        let later = ledger.claim_ticket();
        assert!(!ledger.claims_taken_in(mark));
        // Out of order: the older one still out holds the mark.
        drop(second);
        assert!(!ledger.claims_taken_in(mark));
        drop(first);
        // A claim begun after the mark does not count.
        assert!(ledger.claims_taken_in(mark));
        assert!(!ledger.claims_taken_in(ledger.claim_mark()));
        drop(later);
        assert!(ledger.claims_taken_in(ledger.claim_mark()));
    }
}
