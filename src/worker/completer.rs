//! Settles finished attempts: decides each job's next state (pure: `backoff::settle`), writes
//! a whole group of them in one fenced statement, and only then acks their messages
//! (commit, then ack — invariant 3). The acks go to [`Outbound`](super::outbound): settling
//! never waits on NATS, so jobs that finish during a NATS outage are settled during it.
//!
//! Grouping is natural: while one statement is in flight, the next finished jobs queue up in
//! the channel and go out together in the next one. A busy completer also spaces its
//! statements [`SETTLE_EVERY`] apart: each is a commit, and each commit waits for a WAL flush
//! that the claims (whose commits a job's start waits on) queue behind. An idle completer
//! writes a single job at once.

use super::outage::Outage;
use super::outbound::JobAck;
use super::{QueuePolicy, Shared, Stats};
use crate::backoff::{settle, Outcome, Settlement};
use crate::job::JobStatus;
use crate::store::SettleInput;
use async_nats::jetstream::AckKind;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{error, info, warn};

/// Refusals of one attempt's data before the completer stops trying to settle it (see
/// `Completer::settle_alone`).
pub(crate) const FALLBACKS: usize = 3;

/// Most attempts settled in one statement.
const MAX_GROUP: usize = 1024;
/// A settle statement starts at most this long after the last one started (a completer that
/// was idle that long writes at once). Without it, jobs that end a millisecond apart settle
/// one commit each, and the claims' commits queue behind their WAL flushes: at 5,000 jobs/s
/// publish→start p50 went from 1.74–2.18 ms to 1.23–1.54 ms with it (bench, alternating
/// runs), throughput unchanged. What it costs: a job's end is recorded, and its message
/// acked, up to this much later (graphile-worker offers the same trade as its
/// `completeJobBatchDelay`).
const SETTLE_EVERY: Duration = Duration::from_millis(5);

/// A finished attempt on its way to the database.
pub struct Finished {
    pub id: String,
    pub(crate) policy: Arc<QueuePolicy>,
    pub lease: i64,
    pub attempt: u32,
    pub max_attempts: u32,
    pub outcome: Outcome,
    pub acker: JobAck,
    /// The job's own backoff, overriding the queue's.
    pub backoff: Option<crate::backoff::Backoff>,
    pub elapsed: Duration,
    /// The attempt's open `process` span, when its job is traced.
    pub(crate) span: Option<crate::telemetry::AttemptSpan>,
}

impl Finished {
    /// An attempt given back before it ran (the worker stopped or fenced itself off as it
    /// was claimed, or it was claimed ahead and no slot freed): released, attempt refunded.
    pub(crate) fn released(
        id: String,
        policy: Arc<QueuePolicy>,
        lease: i64,
        (attempt, max_attempts): (u32, u32),
        acker: JobAck,
    ) -> Finished {
        Finished {
            id,
            policy,
            lease,
            attempt,
            max_attempts,
            outcome: Outcome::Released,
            acker,
            backoff: None,
            elapsed: Duration::ZERO,
            span: None,
        }
    }
}

/// What became of one attempt's settle.
enum Fate {
    /// Written as this (possibly a fallback of what was decided, see `settle_alone`).
    Settled(SettleInput),
    /// The row's lease moved on: another owner has the job.
    Lost,
    /// PostgreSQL refused every form of it: not settled, not acked.
    Unsettled,
}

pub(crate) struct Completer {
    shared: Arc<Shared>,
    outage: std::sync::Mutex<Outage>,
}

impl Completer {
    pub fn new(shared: Arc<Shared>) -> Completer {
        Completer {
            shared,
            outage: std::sync::Mutex::new(Outage::new("settle")),
        }
    }

    /// Runs until every sender is gone (all producers and running jobs have finished).
    pub async fn run(self, mut rx: mpsc::Receiver<Finished>) {
        let mut group = Vec::with_capacity(MAX_GROUP);
        let mut last: Option<Instant> = None;
        while rx.recv_many(&mut group, MAX_GROUP).await > 0 {
            let due = last.map(|at| at + SETTLE_EVERY);
            if let Some(due) = due.filter(|d| group.len() < MAX_GROUP && *d > Instant::now()) {
                tokio::time::sleep_until(due).await;
                while group.len() < MAX_GROUP {
                    match rx.try_recv() {
                        Ok(f) => group.push(f),
                        Err(_) => break,
                    }
                }
            }
            last = Some(Instant::now());
            Stats::add(&self.shared.stats.settle_groups, 1);
            self.run_once(std::mem::take(&mut group)).await;
        }
    }

    /// Settles one group; returns how many were settled (the rest lost ownership, or could
    /// not be settled at all).
    pub async fn run_once(&self, group: Vec<Finished>) -> usize {
        let inputs: Vec<SettleInput> = group.iter().map(|f| self.decide(f)).collect();
        let mut retried = false;
        // Per attempt of the group: settled (false: it lost its ownership).
        let settled: Vec<bool> = loop {
            match self
                .shared
                .store
                .job_settle(&self.shared.worker_id, &inputs)
                .await
            {
                Ok(mut settled) if retried && settled.contains(&false) => {
                    // An earlier try may have committed without us hearing of it.
                    let rest: Vec<usize> = (0..inputs.len()).filter(|&i| !settled[i]).collect();
                    let check: Vec<SettleInput> = rest.iter().map(|&i| inputs[i].clone()).collect();
                    match self
                        .shared
                        .store
                        .job_settled_check(&self.shared.worker_id, &check)
                        .await
                    {
                        Ok(done) => {
                            for (i, d) in rest.into_iter().zip(done) {
                                settled[i] |= d;
                            }
                        }
                        Err(e) => warn!(cause = %e, "could not check earlier settle tries"),
                    }
                    break settled;
                }
                Ok(settled) => {
                    self.outage.lock().expect("outage lock").ok();
                    break settled;
                }
                Err(e) if e.rejected_data().is_some() => {
                    // One attempt's data was refused: settle them one by one, so the rest of
                    // the group (and every later group) is not held up by it.
                    if inputs.len() > 1 {
                        warn!(cause = %e, jobs = inputs.len(), "a settle group was refused; settling one by one");
                    }
                    let mut fates = Vec::with_capacity(inputs.len());
                    for one in &inputs {
                        fates.push(self.settle_alone(one.clone()).await);
                    }
                    return self.record(group, fates);
                }
                Err(e) => {
                    // Nothing is acked until the write commits; keep trying. The messages stay
                    // pending in JetStream meanwhile, so nothing is lost if we die here.
                    retried = true;
                    let wait = self.outage.lock().expect("outage lock").failed(&e);
                    tokio::time::sleep(wait).await;
                }
            }
        };
        let fates = inputs
            .into_iter()
            .zip(settled)
            .map(|(input, s)| if s { Fate::Settled(input) } else { Fate::Lost })
            .collect();
        self.record(group, fates)
    }

    /// Counts, logs and acks what became of each attempt of a group; returns how many were
    /// settled.
    fn record(&self, group: Vec<Finished>, fates: Vec<Fate>) -> usize {
        let shared = &self.shared;
        let stats = &shared.stats;
        let mut done = 0;
        for (mut f, fate) in group.into_iter().zip(fates) {
            shared.ledger.settled(&f.id, f.lease);
            if let Some(span) = f.span.take() {
                match &fate {
                    Fate::Settled(input) => span.settled(
                        input.outcome,
                        (input.status == JobStatus::Scheduled && !input.refund)
                            .then_some(input.delay),
                    ),
                    Fate::Lost => span.settled("lost", None),
                    Fate::Unsettled => span.settled("unsettled", None),
                }
            }
            let queue = &f.policy.name;
            let input = match fate {
                Fate::Settled(input) => input,
                Fate::Lost => {
                    Stats::add(&stats.lost_ownership, 1);
                    // It ran to its end while another owner had it.
                    Stats::add(&stats.overlapping, 1);
                    warn!(job.id = %f.id, job.lease = f.lease, worker.id = %shared.worker_id,
                          "completion rejected: job was taken from this worker (lost ownership); not acking");
                    continue;
                }
                // Said by settle_alone; the stale sweep takes it back.
                Fate::Unsettled => {
                    Stats::add(&stats.unsettled, 1);
                    continue;
                }
            };
            done += 1;
            let m = &f.policy.metrics;
            if input.refund {
                // Released at shutdown: nak so another worker starts it at once.
                Stats::add(&stats.released, 1);
                m.released.inc();
                // Not a run time (stopped by the shutdown): left out of the histogram.
                info!(job.id = %f.id, %queue, "job released (attempt not counted)");
                shared.outbound.ack_job(&f.acker, AckKind::Nak(None));
                continue;
            }
            m.duration.observe(f.elapsed.as_secs_f64());
            match input.status {
                JobStatus::Awaiting => {
                    Stats::add(&stats.deferred, 1);
                    m.deferred.inc();
                }
                JobStatus::Completed => {
                    Stats::add(&stats.completed, 1);
                    m.completed.inc();
                }
                JobStatus::Dead => {
                    Stats::add(&stats.dead, 1);
                    m.dead.inc();
                    info!(job.id = %f.id, %queue, error = ?input.error, "job dead-lettered");
                    shared.announce_dead(queue, &f.id, input.error.as_deref());
                }
                _ => {
                    Stats::add(&stats.retried, 1);
                    m.retried.inc();
                }
            }
            // The row is settled; an ack that never arrives means a redelivery that finds it
            // terminal or scheduled.
            shared.outbound.ack_job(&f.acker, AckKind::Ack);
        }
        done
    }

    /// Settles one attempt whose group PostgreSQL refused. Each refusal of its data takes
    /// one step down, so it ends within [`FALLBACKS`] refusals: as decided; then without its
    /// result and error (the reason instead); then dead, with the reason and nothing else of
    /// its own. If even that is refused, it is left unsettled and unacked (the stale sweep
    /// takes it back, and its attempts run out), said once. An outage meanwhile is waited
    /// out with backoff, logged once. Returns whether it was settled.
    async fn settle_alone(&self, one: SettleInput) -> Fate {
        let store = &self.shared.store;
        let me = &self.shared.worker_id;
        let mut input = one;
        let mut step = 0;
        let mut outage = Outage::new("settle (one attempt)");
        loop {
            let reason = match store.job_settle(me, std::slice::from_ref(&input)).await {
                Ok(settled) if settled.first().copied().unwrap_or(false) => {
                    return Fate::Settled(input)
                }
                Ok(_) => return Fate::Lost,
                Err(e) => match e.rejected_data() {
                    Some(reason) => reason,
                    None => {
                        tokio::time::sleep(outage.failed(&e)).await;
                        continue;
                    }
                },
            };
            step += 1;
            match step {
                n if n >= FALLBACKS => {
                    error!(job.id = %input.id, %reason, "attempt cannot be settled at all; left for the stale sweep (not acked)");
                    return Fate::Unsettled;
                }
                1 => {
                    warn!(job.id = %input.id, %reason, "attempt's result or error not storable; settling without them");
                    input.result = None;
                    input.error = Some(format!(
                        "PostgreSQL could not store this attempt's result or error: {reason}"
                    ));
                }
                _ => {
                    warn!(job.id = %input.id, %reason, "attempt cannot be settled as decided; dead-lettering the job with the reason");
                    input = SettleInput {
                        status: JobStatus::Dead,
                        delay: Duration::ZERO,
                        retry: Duration::ZERO,
                        result: None,
                        error: Some(format!(
                            "PostgreSQL refused to settle this attempt ({reason}); dead-lettered \
                             so it holds up nothing: `jobwarden dlq retry` runs it again"
                        )),
                        outcome: "dead",
                        refund: false,
                        ..input
                    };
                }
            }
        }
    }

    fn decide(&self, f: &Finished) -> SettleInput {
        let backoff = f.backoff.unwrap_or(f.policy.backoff);
        let settlement = settle(
            crate::backoff::storable(f.outcome.clone()),
            f.attempt,
            f.max_attempts,
            &backoff,
            rand::random::<f64>(),
        );
        let base = SettleInput {
            id: f.id.clone(),
            lease: f.lease,
            status: JobStatus::Completed,
            delay: Duration::ZERO,
            retry: Duration::ZERO,
            error: None,
            result: None,
            outcome: "completed",
            refund: false,
            trace: None,
        };
        match settlement {
            // A traced run's context stays with the completed job: its `then` jobs inherit it.
            Settlement::Complete(result) => SettleInput {
                result,
                trace: f
                    .span
                    .as_ref()
                    .map(crate::telemetry::AttemptSpan::traceparent),
                ..base
            },
            Settlement::RetryAfter { delay, error } => SettleInput {
                status: JobStatus::Scheduled,
                delay,
                error: Some(error),
                outcome: "retry",
                ..base
            },
            Settlement::Dead { error } => SettleInput {
                status: JobStatus::Dead,
                error: Some(error),
                outcome: "dead",
                ..base
            },
            Settlement::Release => SettleInput {
                status: JobStatus::Scheduled,
                outcome: "released",
                refund: true,
                ..base
            },
            Settlement::Await { deadline, retry } => SettleInput {
                status: JobStatus::Awaiting,
                delay: deadline,
                retry,
                outcome: "deferred",
                ..base
            },
        }
    }
}
