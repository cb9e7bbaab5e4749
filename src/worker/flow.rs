//! A producer's side of cluster-wide flow control (a queue's `global_concurrency` and
//! `rate_limit`): it takes grants from PostgreSQL before it pulls, so jobs waiting for their
//! turn stay in the stream (no ack timer, no `max_ack_pending` slot, no attempt burned).
//!
//! Each acquire that grants anything makes one row (`flow_grants`, schema version 25) whose
//! counts this side keeps: how many of its grants are held (not used yet), running (started
//! by a claim, not ended) and started in all. It reports every row it still has with its
//! next acquire, so a claim and a job's end cost no statement of their own; without an
//! acquire it reports on its own at most every [`REPORT_EVERY`] (the counts it has not
//! reported yet are on the safe side: held or running, never free).
//!
//! - `reserve(n)` makes sure up to `n` grants are held, asking the store at most when it
//!   said asking again makes sense;
//! - `claiming(n)` as a claim goes out with `n` grants, `used(n, claimed)` when it
//!   answered: grants that ran a job are running, the rest go back;
//! - `jobs_ended(n)` when jobs end (the cap frees); `report()` now and then;
//!   `idle(true)` when there is nothing to pull (held grants go back after a while),
//!   `give_back()` when stopping.

use super::outage::Outage;
use super::{QueuePolicy, Shared};
use crate::store::GrantCounts;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(crate) struct Flow {
    shared: Arc<Shared>,
    policy: Arc<QueuePolicy>,
    /// This worker's grant rows of the queue, oldest first, as they stand now.
    rows: VecDeque<GrantCounts>,
    /// Grants held that a claim in flight uses (still held for the store until it answers).
    in_claims: usize,
    /// Some row changed since the store last heard of it.
    dirty: bool,
    /// When the store last heard this side's rows.
    reported_at: Instant,
    /// Since when the producer has had nothing to pull (`None`: it has).
    idle_since: Option<Instant>,
    /// Not before then: the store said nothing more is free until about then.
    next_try: Instant,
    /// The last acquire got all it asked for: the limits are not near, so the next asks for
    /// the claim groups' worth it keeps in flight ([`Flow::chunk`]) and single messages need
    /// no acquire each. Where they are near, it asks for what it needs only, leaving the rest
    /// to others.
    roomy: bool,
    /// The claim groups' worth of grants a producer keeps in flight (at most its slots).
    chunk: usize,
    /// The store's failures: backed off (up to [`RETRY_MAX`]) and logged once per run.
    outage: Outage,
}

/// The longest a producer waits before asking again (a job ending elsewhere frees the cap
/// at any moment; the rate limit says exactly when).
const RETRY_MAX: Duration = Duration::from_secs(1);
/// The first wait after the store failed.
const RETRY_FIRST: Duration = Duration::from_millis(100);
/// How long a change of this side's counts (a job that ended) may wait for an acquire to
/// carry it before it is reported on its own: what other workers may wait at most for the
/// cap this worker freed, beyond their own retry.
pub(crate) const REPORT_EVERY: Duration = Duration::from_millis(50);

impl Flow {
    /// Flow control for a queue that has a cap or a rate limit; `None` otherwise.
    pub fn of(shared: &Arc<Shared>, policy: &Arc<QueuePolicy>) -> Option<Flow> {
        (policy.global_cap.is_some() || policy.rate.is_some()).then(|| Flow {
            shared: shared.clone(),
            policy: policy.clone(),
            rows: VecDeque::new(),
            in_claims: 0,
            dirty: false,
            reported_at: Instant::now(),
            idle_since: None,
            next_try: Instant::now(),
            roomy: true,
            chunk: (shared.config.worker.claim_batch * super::producer::CLAIMS_IN_FLIGHT)
                .min(policy.concurrency)
                .max(1),
            outage: Outage::between(
                format!("flow control of queue {}", policy.name),
                RETRY_FIRST,
                RETRY_MAX,
            ),
        })
    }

    /// Grants held and free for a claim.
    pub fn held(&self) -> usize {
        self.rows.iter().map(|r| r.held).sum::<usize>() - self.in_claims
    }

    /// A claim goes out with `n` of the grants held.
    pub fn claiming(&mut self, n: usize) {
        self.in_claims += n.min(self.held());
    }

    /// When nothing is held and the store said to wait: until when.
    pub fn waiting_until(&self) -> Option<Instant> {
        (self.held() == 0 && self.next_try > Instant::now()).then_some(self.next_try)
    }

    /// Holds up to `want` grants if the queue's limits allow; returns how many are held.
    pub async fn reserve(&mut self, want: usize) -> usize {
        self.shared.supervisor.failpoint(super::Service::Flow);
        let held = self.held();
        if held >= want || Instant::now() < self.next_try {
            return held;
        }
        let ask = if self.roomy {
            want.max(self.chunk)
        } else {
            want
        } - held;
        if let Some(g) = self.take(ask).await {
            self.roomy = g.granted >= ask;
            if let Some(id) = g.row.filter(|_| g.granted > 0) {
                self.rows.push_back(GrantCounts {
                    id,
                    held: g.granted,
                    running: 0,
                    started: 0,
                });
            } else {
                self.policy.metrics.flow_waits.inc();
                self.next_try =
                    Instant::now() + g.retry_in.clamp(Duration::from_millis(20), RETRY_MAX);
            }
        }
        self.held()
    }

    /// One call to the store: this side's rows, then up to `want` new grants. On success
    /// the rows the store now knows are done are forgotten here.
    async fn take(&mut self, want: usize) -> Option<crate::store::Grant> {
        let p = &self.policy;
        let rows: Vec<GrantCounts> = self.rows.iter().copied().collect();
        match self
            .shared
            .store
            .flow_take(
                &p.name,
                &self.shared.worker_id,
                want,
                p.global_cap,
                p.rate,
                &rows,
            )
            .await
        {
            Ok(g) => {
                self.outage.ok();
                self.dirty = false;
                self.reported_at = Instant::now();
                self.rows.retain(|r| r.held > 0 || r.running > 0);
                Some(g)
            }
            Err(e) => {
                let cause = format!("cannot take grants: {e}");
                self.next_try = Instant::now() + self.outage.failed(&cause);
                None
            }
        }
    }

    /// A claim used `messages` grants (the oldest held) and ran `claimed` jobs with them;
    /// the others go back. Only counted here: the store hears it with the next report.
    pub fn used(&mut self, messages: usize, claimed: usize) {
        let mut messages = messages.min(self.in_claims);
        self.in_claims -= messages;
        let mut claimed = claimed.min(messages);
        for r in self.rows.iter_mut() {
            if messages == 0 {
                break;
            }
            let m = messages.min(r.held);
            let c = claimed.min(m);
            r.held -= m;
            r.running += c;
            r.started += c;
            messages -= m;
            claimed -= c;
            self.dirty |= m > 0;
        }
    }

    /// `n` jobs of this queue ended (counted against the oldest rows' running jobs).
    pub fn jobs_ended(&mut self, n: usize) {
        let mut n = n;
        for r in self.rows.iter_mut() {
            if n == 0 {
                break;
            }
            let e = n.min(r.running);
            r.running -= e;
            n -= e;
            self.dirty |= e > 0;
        }
    }

    /// Reports what changed when no acquire carried it for [`REPORT_EVERY`] (`now`: at
    /// once, as at the end of a drain). While the store fails, not before its backoff ends.
    pub async fn report(&mut self, now: bool) {
        let at = if now {
            self.retry_at()
        } else {
            self.report_due()
        };
        if self.dirty && Instant::now() >= at {
            self.take(0).await;
        }
    }

    /// When a report of what changed is due: [`REPORT_EVERY`] after the last one, and not
    /// before the store's backoff ends.
    fn report_due(&self) -> Instant {
        (self.reported_at + REPORT_EVERY).max(self.retry_at())
    }

    /// Not before then while the store fails (its backoff); now otherwise.
    fn retry_at(&self) -> Instant {
        if self.outage.failing() {
            self.next_try
        } else {
            Instant::now()
        }
    }

    /// When this side must call the store even if nothing else happens: a report is due
    /// (something changed and no acquire carried it), or grants held while idle go back.
    pub fn due(&self) -> Option<Instant> {
        let report = self.dirty.then(|| self.report_due());
        let give_back = self
            .idle_since
            .filter(|_| self.held() > 0)
            .map(|t| t + REPORT_EVERY);
        report.into_iter().chain(give_back).min()
    }

    /// Whether the producer has anything to pull: grants held through [`REPORT_EVERY`]
    /// without any go back for other workers (a stream of single messages keeps its grants
    /// instead of asking for each).
    pub async fn idle(&mut self, idle: bool) {
        if !idle {
            self.idle_since = None;
            return;
        }
        let since = *self.idle_since.get_or_insert_with(Instant::now);
        if since.elapsed() >= REPORT_EVERY {
            self.give_back().await;
        }
    }

    /// Grants held go back for other workers, at once.
    pub async fn give_back(&mut self) {
        let n = self.held();
        if n > 0 {
            self.claiming(n);
            self.used(n, 0);
            self.report(true).await;
        }
    }
}
