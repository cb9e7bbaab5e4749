//! A keyed queue (`key_concurrency`, `fair_by_key`): its messages are pulled ahead of the free
//! slots and their jobs parked in PostgreSQL (the claim group's statement is
//! `job_intake.sql`; the messages are acked once it commits), and the slots take parked jobs
//! (`job_take()`) within their keys' limits and in turn order. A job over its key's limit
//! waits there: no ack timer, no stream slot, no attempt spent, and no other key behind it.
//!
//! A take runs when the producer may have something to take: an intake committed, one of
//! its jobs ended (its key may have room again), or, with slots free, a poll (another
//! worker's job may have freed a key; [`TAKE_POLL_FIRST`], doubling up to
//! [`TAKE_POLL_MAX`] while takes find nothing).

use super::*;
use crate::config::KeyRules;
use crate::store::Taken;

/// The first wait before asking again after a take found less than it wanted.
const TAKE_POLL_FIRST: Duration = Duration::from_millis(25);
/// The longest: a key freed by another worker's job is seen at least this often.
const TAKE_POLL_MAX: Duration = Duration::from_millis(500);
/// An ordered queue's horizon is read again after this long (a horizon read earlier is never
/// later than the truth: consumers' ack floors only rise).
const HORIZON_FRESH: Duration = Duration::from_millis(100);

/// A keyed queue's take state.
pub(super) struct Keyed {
    pub(super) rules: KeyRules,
    /// Something may be waiting: take as soon as a slot is free.
    due: bool,
    /// Else not before then.
    next: Instant,
    /// The current wait between polls that find nothing.
    poll: Duration,
    /// The store's failures: backed off and logged once per outage.
    outage: Outage,
    /// An ordered queue's horizon as last read, and when.
    horizon: Option<(Option<i64>, Instant)>,
    /// Parked jobs may be left in the queue (as the last take said, or parked here since):
    /// a job that ends here may free their key, so take again. Else only poll, now and then
    /// ([`TAKE_POLL_MAX`]), for what other workers park.
    more: bool,
    /// The rules were recorded in `flow_queues` (for `jobs show`; tried again at each take
    /// until it succeeds).
    declared: bool,
}

impl Keyed {
    pub(super) fn new(rules: KeyRules, queue: &str) -> Keyed {
        Keyed {
            rules,
            due: true,
            next: Instant::now(),
            poll: TAKE_POLL_FIRST,
            outage: Outage::new(format!("take of queue {queue}")),
            horizon: None,
            more: true,
            declared: false,
        }
    }

    /// Jobs were parked here: take at once.
    pub(super) fn nudge(&mut self) {
        self.due = true;
        self.more = true;
    }

    /// A job ended here: its key may have room again for jobs parked.
    pub(super) fn freed(&mut self) {
        if self.more {
            self.due = true;
        }
    }

    /// When the next take is due (now, when nudged).
    pub(super) fn due_at(&self) -> Instant {
        if self.due {
            Instant::now()
        } else {
            self.next
        }
    }
}

impl Producer {
    /// The room a keyed queue's pulls have: its intake statements' groups (the jobs are
    /// parked, not run, so the slots do not bound them).
    pub(super) fn intake_room(&self) -> usize {
        (self.batch_cap * CLAIMS_IN_FLIGHT).saturating_sub(self.claiming + self.ready.len())
    }

    /// Takes parked jobs for the free slots, if a take is due; runs them.
    pub(super) async fn take_parked(&mut self) {
        let free = self.slots.available_permits();
        let Some(k) = self.keyed.as_mut() else {
            return;
        };
        if free == 0 || (!k.due && Instant::now() < k.next) || self.stop.is_cancelled() {
            return;
        }
        k.due = false;
        let rules = k.rules;
        if !k.declared {
            // What `jobs show` explains a parked job's wait by; a failure only delays that.
            let declared = self
                .shared
                .store
                .key_rules_declare(&self.policy.name, rules)
                .await;
            match declared {
                Ok(()) => self.keyed.as_mut().expect("keyed").declared = true,
                Err(e) => {
                    debug!(queue = %self.policy.name, cause = %e, "cannot record the queue's key rules yet")
                }
            }
        }
        let horizon = if rules.ordered {
            match self.ordered_horizon().await {
                Ok(h) => h,
                Err(e) => {
                    let k = self.keyed.as_mut().expect("keyed");
                    k.next = Instant::now()
                        + k.outage.failed(&format!(
                            "cannot read the queue's consumers for the order of its keys: {e}"
                        ));
                    return;
                }
            }
        } else {
            None
        };
        let shared = self.shared.clone();
        let policy = self.policy.clone();
        let ticket = shared.ledger.claim_ticket();
        let answer = shared
            .store
            .job_take(
                &policy.name,
                &shared.worker_id,
                free,
                (policy.stale_after, policy.expire_after),
                rules,
                horizon,
            )
            .await;
        let k = self.keyed.as_mut().expect("keyed");
        let taken = match answer {
            Ok(takes) => {
                k.outage.ok();
                k.more = takes.more;
                if takes.jobs.len() >= free {
                    k.due = true;
                    k.poll = TAKE_POLL_FIRST;
                } else if !takes.jobs.is_empty() {
                    k.next = Instant::now() + TAKE_POLL_FIRST;
                    k.poll = TAKE_POLL_FIRST;
                } else if k.more {
                    k.next = Instant::now() + k.poll;
                    k.poll = (k.poll * 2).min(TAKE_POLL_MAX);
                } else {
                    // Nothing parked: only what other workers park may come.
                    k.next = Instant::now() + TAKE_POLL_MAX;
                }
                takes.jobs
            }
            Err(e) => {
                k.next = Instant::now() + k.outage.failed(&format!("cannot take jobs: {e}"));
                return;
            }
        };
        for t in taken {
            self.run_taken(t).await;
        }
        drop(ticket);
    }

    /// An ordered queue's horizon: the lowest stream sequence whose message may not be parked
    /// yet (the first after the ack floor of each of the queue's consumers that still holds
    /// messages); `None` when every message of the queue is parked or done with. A job of a
    /// later message waits, so a key's earlier job still in some worker's hands (or in the
    /// hands of one that died, until the adopter or a redelivery brings it) is not overtaken.
    async fn ordered_horizon(&mut self) -> Result<Option<i64>, crate::broker::BrokerError> {
        if let Some((h, at)) = self.keyed.as_ref().and_then(|k| k.horizon) {
            if at.elapsed() < HORIZON_FRESH {
                return Ok(h);
            }
        }
        let read = Instant::now();
        let mut horizon: Option<u64> = None;
        for lane in &mut self.lanes {
            let info = crate::broker::bounded("consumer info", lane.consumer.info()).await?;
            if info.num_ack_pending == 0 && info.num_pending == 0 {
                continue;
            }
            let h = info.ack_floor.stream_sequence.saturating_add(1);
            horizon = Some(horizon.map_or(h, |x| x.min(h)));
        }
        let h = horizon.map(|h| h.min(i64::MAX as u64) as i64);
        if let Some(k) = self.keyed.as_mut() {
            k.horizon = Some((h, read));
        }
        Ok(h)
    }

    /// Runs a job a take gave this worker (or gives it back, attempt refunded, when the worker
    /// stops or fenced itself off meanwhile).
    async fn run_taken(&mut self, t: Taken) {
        let shared = self.shared.clone();
        let control = Arc::new(AttemptControl::new(shared.pacing.stop_grace(KILL_GRACE)));
        let attempt = shared
            .ledger
            .claimed(&t.id, t.lease, self.policy.clone(), None, control);
        let attempts = (t.attempt.max(1) as u32, t.max_attempts.max(1) as u32);
        if self.stop.is_cancelled() || shared.fenced.load(Ordering::SeqCst) {
            debug!(job.id = %t.id, job.lease = t.lease, "taken as this worker stopped or fenced itself off: giving it back");
            release_unstarted(&shared, &self.done, &attempt, t.id, t.lease, attempts).await;
            return;
        }
        let job = Owned {
            timeout: t
                .timeout_ms
                .map(|ms| Duration::from_millis(ms.max(1) as u64))
                .unwrap_or(self.policy.timeout),
            id: t.id,
            lease: t.lease,
            attempt: attempts.0,
            max_attempts: attempts.1,
            payload: t.payload,
            backoff: t.backoff,
            traceparent: t.traceparent,
            parents: t.parents,
        };
        self.spawn_job(attempt, job, t.created_ns);
    }
}
