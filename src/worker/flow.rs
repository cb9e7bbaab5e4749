//! A producer's side of cluster-wide flow control (a queue's `global_concurrency` and
//! `rate_limit`): it takes grants from PostgreSQL before it pulls, so jobs waiting for their
//! turn stay in the stream (no ack timer, no `max_ack_pending` slot, no attempt burned).
//!
//! - `reserve(n)` makes sure up to `n` grants are held, asking the store at most when it
//!   said asking again makes sense;
//! - `used(messages, claimed)` after a claim: grants that ran a job are started, the rest
//!   go back;
//! - `ended(n)` when jobs end (the cap frees); `give_back()` when there is nothing to pull.

use super::outage::Outage;
use super::{QueuePolicy, Shared};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(crate) struct Flow {
    shared: Arc<Shared>,
    policy: Arc<QueuePolicy>,
    /// Grants held and not used yet.
    pub held: usize,
    /// Not before then: the store said nothing more is free until about then.
    next_try: Instant,
    /// Jobs ended and not reported yet.
    ended: usize,
    /// The store's failures: backed off (up to [`RETRY_MAX`]) and logged once per run.
    outage: Outage,
}

/// The longest a producer waits before asking again (a job ending elsewhere frees the cap
/// at any moment; the rate limit says exactly when).
const RETRY_MAX: Duration = Duration::from_secs(1);
/// The first wait after the store failed.
const RETRY_FIRST: Duration = Duration::from_millis(100);

impl Flow {
    /// Flow control for a queue that has a cap or a rate limit; `None` otherwise.
    pub fn of(shared: &Arc<Shared>, policy: &Arc<QueuePolicy>) -> Option<Flow> {
        (policy.global_cap.is_some() || policy.rate.is_some()).then(|| Flow {
            shared: shared.clone(),
            policy: policy.clone(),
            held: 0,
            next_try: Instant::now(),
            ended: 0,
            outage: Outage::between(
                format!("flow control of queue {}", policy.name),
                RETRY_FIRST,
                RETRY_MAX,
            ),
        })
    }

    /// When nothing is held and the store said to wait: until when.
    pub fn waiting_until(&self) -> Option<Instant> {
        (self.held == 0 && self.next_try > Instant::now()).then_some(self.next_try)
    }

    /// Holds up to `want` grants if the queue's limits allow; returns how many are held.
    pub async fn reserve(&mut self, want: usize) -> usize {
        self.shared.supervisor.failpoint(super::Service::Flow);
        if self.held >= want || Instant::now() < self.next_try {
            return self.held;
        }
        let p = &self.policy;
        match self
            .shared
            .store
            .flow_acquire(
                &p.name,
                &self.shared.worker_id,
                want - self.held,
                p.global_cap,
                p.rate,
            )
            .await
        {
            Ok(g) => {
                self.outage.ok();
                self.held += g.granted;
                if g.granted == 0 {
                    p.metrics.flow_waits.inc();
                    self.next_try =
                        Instant::now() + g.retry_in.clamp(Duration::from_millis(20), RETRY_MAX);
                }
            }
            Err(e) => {
                let cause = format!("cannot take grants: {e}");
                self.next_try = Instant::now() + self.outage.failed(&cause);
            }
        }
        self.held
    }

    /// A claim used `messages` grants and ran `claimed` jobs.
    pub async fn used(&mut self, messages: usize, claimed: usize) {
        let messages = messages.min(self.held);
        let claimed = claimed.min(messages);
        self.held -= messages;
        if messages == 0 {
            return;
        }
        let p = &self.policy;
        match self
            .shared
            .store
            .flow_started(&p.name, &self.shared.worker_id, claimed, messages - claimed)
            .await
        {
            Ok(()) => self.outage.ok(),
            Err(e) => {
                self.outage
                    .failed(&format!("cannot record started grants: {e}"));
            }
        }
    }

    /// `n` jobs of this queue ended.
    pub fn jobs_ended(&mut self, n: usize) {
        self.ended += n;
    }

    /// Reports ended jobs (their grants no longer count for the cap).
    pub async fn report_ended(&mut self) {
        if self.ended == 0 {
            return;
        }
        let p = &self.policy;
        match self
            .shared
            .store
            .flow_done(
                &p.name,
                &self.shared.worker_id,
                self.ended,
                p.rate.is_some(),
            )
            .await
        {
            Ok(()) => {
                self.outage.ok();
                self.ended = 0;
            }
            Err(e) => {
                self.outage
                    .failed(&format!("cannot record ended jobs' grants: {e}"));
            }
        }
    }

    /// Nothing to pull: grants held go back for other workers.
    pub async fn give_back(&mut self) {
        if self.held > 0 {
            let n = self.held;
            self.used(n, 0).await;
        }
    }
}
