//! The Producer of one queue: pulls messages, claims them, dispatches them.
//!
//! Flow control: a message pulled from JetStream is already on its ack_wait timer and holds a
//! `max_ack_pending` slot, so we never request more than we have free slots for:
//! `requested-but-undelivered + running <= concurrency`, and no pull brings more than
//! `worker.pull_max_bytes` (but never less than the server's max_payload, or a message that
//! large could never be delivered). Several pull requests may be outstanding at once, so the
//! pipeline stays full under load, and an idle queue always has a long-poll waiting.
//!
//! Every message that arrived together is claimed in one statement (`store.job_claim`), then
//! the claimed jobs are recorded in the [`Ledger`](super::ledger::Ledger) and spawned;
//! messages whose job is terminal, running elsewhere or a duplicate are acked and dropped;
//! messages that cannot become jobs are recorded as dead jobs (or poison messages) and acked;
//! a message whose id another job with another payload holds is kept as a dead job under its
//! own message id, visibly (never dropped in silence). Nothing is acked before its database
//! write commits. A worker that others declared dead claims nothing until it registered again.
//!
//! When the queue's consumer disappears (an operator deleted the stream or the consumer),
//! pulls come back empty: the producer notices and provisions it again.

use super::completer::Finished;
use super::executor::{execute, Owned};
use super::flow::Flow;
use super::outage::Outage;
use super::{QueuePolicy, Shared, Stats};
use crate::broker::{Lane, BROKER_CALL_LIMIT};
use crate::handler::{exec::KILL_GRACE, AttemptControl, Stop};
use crate::job::{self, MessageOrigin};
use crate::store::{Claim, ClaimInput};
use async_nats::jetstream::{consumer::PullConsumer, message::Acker, AckKind};
use futures::stream::{BoxStream, FuturesUnordered, SelectAll};
use futures::{FutureExt, StreamExt};
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, Notify, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, error, warn};

mod claim;
mod consumers;
mod decode;
mod delivered;
mod intake;
mod keyed;
mod members;
mod pulls;
mod rejected;
mod slots;
mod statement;

use claim::*;
use decode::*;
use keyed::*;
use members::*;
use pulls::*;
use rejected::*;
use slots::*;
use statement::*;

pub(crate) use decode::republished;
pub(crate) use delivered::Delivered;
pub(crate) use members::OpenBatches;
pub(crate) use rejected::{invalid_payload, record_invalid, Rejected};
pub(crate) use slots::Freed;

/// How long one pull request waits at the server for messages. Short on purpose: a worker
/// that is paused (SIGSTOP) but still connected keeps receiving messages for its open pull
/// requests until they expire; the adopter takes those back.
const PULL_EXPIRES: Duration = Duration::from_secs(5);
/// How often an idle producer makes sure a lane's consumer still exists.
const CONSUMER_CHECK_EVERY: Duration = Duration::from_secs(5);
/// How long a message a doorbell brought waits for a slot before it goes back to the stream
/// (and a job claimed ahead of its slot before it is given back).
const HOLD_MAX: Duration = Duration::from_secs(1);
/// A paused queue's message that arrived anyway comes back no sooner than this (only to a
/// pull sent before the pause: those expire within [`PULL_EXPIRES`]).
const PAUSED_REDELIVERY: Duration = Duration::from_secs(1);
/// A queue whose jobs end this fast claims ahead: up to a claim group per statement in
/// flight more than its free slots, so the next groups' statements run while the last
/// groups' jobs still hold their slots, instead of after they end and a pull's round trip
/// later (measured: a quarter fewer commits per job, and 5-10 % more jobs/s with 512 slots).
/// A job claimed ahead runs as soon as a slot frees (never more than `concurrency` at once)
/// and is given back, its attempt refunded, if none frees within HOLD_MAX. One job that runs
/// longer stops it until a group's worth of short ones has ended again. Nothing is claimed
/// ahead while a message waits in `held` for a slot (a higher-priority job that arrived: it
/// waits behind at most the short jobs claimed ahead before it came, two groups), nor under a
/// cap or rate limit (slots follow grants there).
const SHORT_JOB: Duration = Duration::from_millis(10);

/// Claim statements in flight at once per queue: the next group is claimed while the last
/// one's statement runs and commits, so the producer does not idle on a round trip.
pub(crate) const CLAIMS_IN_FLIGHT: usize = 2;

/// One lane of the queue as the producer sees it.
struct LaneState {
    lane: Lane,
    consumer: PullConsumer,
    /// Messages may wait here: work pulls go to the first such lane.
    hot: bool,
    /// A doorbell or a watch is open here (the lane looked empty).
    doorbell: bool,
    last_check: Instant,
}

/// The slots free for new messages at the top of a loop turn.
#[derive(Clone, Copy)]
struct Room {
    /// Free and promised to no open pull.
    free: usize,
    /// Also counting those a watch holds loosely (a message of a lane with work takes them).
    free_for_work: usize,
}

/// What one turn's pull events brought.
#[derive(Default)]
struct Arrivals {
    /// Messages with a slot held for them.
    arrived: Vec<Delivered>,
    /// Messages that came without one (a doorbell's).
    slotless: Vec<Delivered>,
    /// Lanes whose pull ended without a message (is the consumer still there?).
    empty_ended: Vec<usize>,
}

pub(crate) struct Producer {
    shared: Arc<Shared>,
    policy: Arc<QueuePolicy>,
    /// The queue's lanes, highest priority first.
    lanes: Vec<LaneState>,
    done: mpsc::Sender<Finished>,
    slots: Arc<Semaphore>,
    /// Rung by every job as it ends, with the count of those ended since last read.
    freed: Arc<Freed>,
    claims: Outage,
    /// Pull requests the server did not take: backed off, logged once per outage.
    pull_outage: Outage,
    /// While pulls fail: how long to wait before the next one.
    pull_backoff: Duration,
    /// The open pull requests' messages, as one stream of events.
    pulls: SelectAll<BoxStream<'static, PullEvent>>,
    /// The open pull requests and the slots they hold.
    book: PullBook,
    /// The running jobs (they free their slot and ring `freed` as they end).
    jobs: TaskTracker,
    /// Claim statements in flight (at most CLAIMS_IN_FLIGHT).
    pending: Pending,
    /// Messages that arrived with no free slot (from doorbells): they take the next slots,
    /// highest priority first, or go back to the stream after HOLD_MAX.
    held: Vec<(Delivered, Instant)>,
    /// Most messages claimed in one statement (and asked for in one pull).
    batch_cap: usize,
    /// A pull's byte budget: never below the largest message the server takes.
    pull_bytes: usize,
    /// A work pull goes out once this many slots are free (a quarter of a batch), or at once
    /// when none is open.
    refill_at: usize,
    /// Messages in claim statements still in flight: their slots are spoken for.
    claiming: usize,
    /// Messages wait in `held` for a slot (as of the loop's last turn): claim nothing ahead.
    holding: bool,
    /// Messages that arrived (with their slots) while every claim statement was in flight:
    /// the next statement takes them all together, up to `claim_batch`, as soon as one
    /// answers. Under load the groups grow this way (one commit and one WAL flush for many
    /// messages) instead of a statement for every dribble a pull's answer arrives in.
    ready: Vec<Delivered>,
    /// The worker's stop signal (its run loop ends on it and nothing else): a claim answered
    /// after it goes back (released), even one the producer waited for inside its loop,
    /// before the loop saw the signal.
    stop: CancellationToken,
    /// Work pulls sent so far (for `fair_every`).
    pulls_sent: u64,
    /// Grants of a queue with a cluster-wide cap or rate limit.
    flow: Option<Flow>,
    /// A keyed queue's take state (`None`: the queue runs its messages' jobs as they come).
    keyed: Option<Keyed>,
    /// Slots promised to a keyed queue's intakes in flight (each may start that many jobs).
    starting: usize,
    /// The lane watched by a [`PullKind::Watch`] while it is idle (the bare subject's; none
    /// under a cap or rate limit, where slots follow grants): the others have doorbells.
    watched: Option<usize>,
}

impl Producer {
    pub fn new(
        shared: Arc<Shared>,
        policy: Arc<QueuePolicy>,
        lanes: Vec<(Lane, PullConsumer)>,
        done: mpsc::Sender<Finished>,
    ) -> Producer {
        let lanes = lanes
            .into_iter()
            .map(|(lane, consumer)| LaneState {
                lane,
                consumer,
                // Unknown at start: each lane is asked once (a no-wait pull), and watched
                // by a doorbell from when it turns out empty.
                hot: true,
                doorbell: false,
                last_check: Instant::now(),
            })
            .collect::<Vec<LaneState>>();
        let flow = Flow::of(&shared, &policy);
        let watched = lanes
            .iter()
            .position(|l| l.lane.band.is_none())
            .filter(|_| flow.is_none());
        let name = policy.name.clone();
        let w = &shared.config.worker;
        // A keyed queue's groups are parked, not run: they are not bounded by its slots.
        let batch_cap = if policy.keys.is_some() {
            w.claim_batch
        } else {
            w.claim_batch.min(policy.concurrency)
        };
        let keyed = policy.keys.map(|rules| Keyed::new(rules, &name));
        let pull_bytes = w.pull_max_bytes.max(shared.broker.max_payload() + 4096);
        Producer {
            pull_backoff: Duration::ZERO,
            pulls: SelectAll::new(),
            book: PullBook::default(),
            jobs: TaskTracker::new(),
            pending: FuturesUnordered::new(),
            held: Vec::new(),
            batch_cap,
            pull_bytes,
            refill_at: (batch_cap / 4).max(1),
            watched,
            keyed,
            starting: 0,
            slots: Arc::new(Semaphore::new(policy.concurrency)),
            flow,
            shared,
            policy,
            lanes,
            done,
            freed: Arc::new(Freed {
                rung: Notify::new(),
                ended: Default::default(),
                short_run: Default::default(),
                waiting: Default::default(),
                queue: name,
            }),
            claims: Outage::new("claim"),
            pull_outage: Outage::new("pull"),
            claiming: 0,
            holding: false,
            ready: Vec::new(),
            stop: CancellationToken::new(),
            pulls_sent: 0,
        }
    }

    /// Slots neither running a job nor promised to a claim in flight (or to a job claimed
    /// ahead), and while the queue's jobs are short one claim group more (see SHORT_JOB).
    fn free_slots(&self) -> usize {
        // A keyed queue with fair turns or ordered keys pulls ahead of its slots and parks
        // what cannot start (a key's backlog must not hide another key's jobs behind it in
        // the stream); one with only key limits pulls for its free slots, as a plain queue
        // does (its parked jobs hold no slot, so a key at its limit does not stop the pulls).
        if self
            .keyed
            .as_ref()
            .is_some_and(|k| k.rules.fair || k.rules.ordered)
        {
            return self.intake_room();
        }
        (self.slots.available_permits() + self.ahead()).saturating_sub(
            self.claiming + self.ready.len() + self.freed.waiting.load(Ordering::Acquire),
        )
    }

    /// How many jobs may be claimed beyond the free slots (see SHORT_JOB).
    pub(super) fn ahead(&self) -> usize {
        let group = self
            .shared
            .config
            .worker
            .claim_batch
            .min(self.policy.concurrency);
        // A keyed queue's jobs start ahead too where they start at their intake (key limits
        // only): one claimed ahead counts against its key's limit from its claim on. So
        // does one of a capped or rate-limited queue against the queue's limits: its grant
        // runs from its claim on.
        let pulls_ahead = self
            .keyed
            .as_ref()
            .is_some_and(|k| k.rules.fair || k.rules.ordered);
        if !pulls_ahead && !self.holding && self.freed.short_run.load(Ordering::Relaxed) >= group {
            group * CLAIMS_IN_FLIGHT
        } else {
            0
        }
    }

    /// The lane the next work pull goes to: the highest-priority hot lane, except that every
    /// `fair_every`-th pull goes to the hot lanes below it, in turn (so they never starve).
    fn next_lane(&mut self) -> Option<usize> {
        let hot: Vec<usize> = (0..self.lanes.len())
            .filter(|&i| self.lanes[i].hot)
            .collect();
        let first = *hot.first()?;
        self.pulls_sent += 1;
        let every = self.policy.fair_every as u64;
        if every > 0 && hot.len() > 1 && self.pulls_sent.is_multiple_of(every) {
            let turn = (self.pulls_sent / every) as usize;
            return Some(hot[1 + turn % (hot.len() - 1)]);
        }
        Some(first)
    }

    /// The producer's loop: each turn runs what waits for a slot, sends the pulls there is
    /// room for, waits for the next event (a message, an answered claim, a job that ended,
    /// a timer) and takes it in. Every counter it keeps changes inside a named method.
    pub async fn run(mut self, cancel: CancellationToken) {
        self.stop = cancel.clone();
        loop {
            // A worker fenced off from PostgreSQL takes no new work until it is back; nor
            // does a paused queue until it is resumed.
            let paused = self.policy.paused.load(Ordering::SeqCst);
            let fenced = self.shared.fenced.load(Ordering::SeqCst) || paused;
            self.holding = !self.held.is_empty();
            let room = self.room();
            if !fenced && self.admit_held(room).await {
                continue;
            }
            self.send_back_held(fenced);
            if !fenced && self.pull_work(room).await {
                continue;
            }
            if !fenced {
                self.open_long_polls().await;
            }
            let hold_until = self
                .held
                .iter()
                .map(|(_, at)| *at + HOLD_MAX)
                .min()
                .unwrap_or_else(Instant::now);
            // Waiting for grants while there is work: ask again when the store said.
            let flow_wait = self
                .flow
                .as_ref()
                .and_then(|f| f.waiting_until())
                .filter(|_| self.lanes.iter().any(|l| l.hot) || !self.held.is_empty());
            if !fenced {
                self.take_parked().await;
            }
            // A keyed queue with free slots takes again when due.
            let take_at = self
                .keyed
                .as_ref()
                .filter(|_| !fenced && self.slots.available_permits() > 0)
                .map(Keyed::due_at);
            // A flow's counts that changed and that no acquire carried, or its grants held
            // while idle: due to the store.
            let report_at = self.flow.as_ref().and_then(Flow::due);
            let mut got = Arrivals::default();
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = tokio::time::sleep(self.pull_backoff), if !self.pull_backoff.is_zero() => {
                    self.pull_backoff = Duration::ZERO;
                }
                _ = self.freed.rung.notified() => {
                    // A job ended: its key may have room again.
                    if let Some(k) = self.keyed.as_mut() {
                        k.freed();
                    }
                }
                _ = tokio::time::sleep_until(take_at.unwrap_or_else(Instant::now).into()), if take_at.is_some() => {}
                _ = tokio::time::sleep(Duration::from_millis(200)), if fenced => {}
                _ = tokio::time::sleep_until(hold_until.into()), if !self.held.is_empty() => {}
                _ = tokio::time::sleep_until(flow_wait.unwrap_or_else(Instant::now).into()), if flow_wait.is_some() => {}
                _ = tokio::time::sleep_until(report_at.unwrap_or_else(Instant::now).into()), if report_at.is_some() => {}
                Some(done) = self.pending.next(), if !self.pending.is_empty() => {
                    self.finish_claim(done).await;
                }
                Some(ev) = self.pulls.next(), if !self.pulls.is_empty() => {
                    got = self.take_events(ev);
                }
            }
            self.settle_flow().await;
            self.take_in(got).await;
            if paused {
                self.send_back_paused();
            } else {
                self.claim_ready().await;
            }
        }
        self.shut_down().await;
    }

    /// The slots free for new messages, as of now.
    fn room(&self) -> Room {
        let permits = self.free_slots();
        let reserved = self.book.reserved();
        Room {
            free: permits.saturating_sub(reserved),
            // What a message of a lane with work may have: the free slots and those an idle
            // lane's watch holds.
            free_for_work: permits.saturating_sub(reserved - self.book.loose()),
        }
    }

    /// The highest-priority lane with work (`usize::MAX`: none).
    fn best_hot(&self) -> usize {
        self.lanes.iter().position(|l| l.hot).unwrap_or(usize::MAX)
    }

    /// Counts the jobs that ended against the queue's grants (reported when due); with
    /// nothing to pull for a while, the grants held go back for other workers.
    async fn settle_flow(&mut self) {
        let Some(f) = self.flow.as_mut() else {
            return;
        };
        f.jobs_ended(self.freed.take());
        f.report(false).await;
        let idle = self.book.work_pulls() == 0
            && self.held.is_empty()
            && self.lanes.iter().all(|l| !l.hot);
        f.idle(idle).await;
    }

    /// Stops fetching. Claims still in flight: what they claimed goes back (released, the
    /// attempt refunded). Messages already delivered to us go back at once (a job that
    /// exists only as a message would otherwise wait for the adopter). Then waits for the
    /// running jobs (the worker bounds this by shutdown_grace).
    async fn shut_down(&mut self) {
        while let Some(done) = self.pending.next().await {
            self.finish_claim(done).await;
        }
        let held = std::mem::take(&mut self.held);
        for d in std::mem::take(&mut self.ready)
            .into_iter()
            .chain(held.into_iter().map(|(d, _)| d))
        {
            self.shared.outbound.ack(&d.acker(), AckKind::Nak(None));
        }
        while let Some(Some(ev)) = self.pulls.next().now_or_never() {
            if let PullEvent::Msg(id, m) = ev {
                let rank = self.book.lane_of(id).unwrap_or(0);
                let lane = self.lanes[rank].lane.clone();
                let acker = Delivered::new(m, &lane, rank).acker();
                self.shared.outbound.ack(&acker, AckKind::Nak(None));
            }
        }
        self.pulls = SelectAll::new();
        if let Some(f) = self.flow.as_mut() {
            f.give_back().await;
        }
        self.jobs.close();
        self.jobs.wait().await;
        if let Some(f) = self.flow.as_mut() {
            f.jobs_ended(self.freed.take());
            f.report(true).await;
        }
    }

    /// A paused queue's messages that still arrive (from pulls sent before the pause): back
    /// to the stream unclaimed, to come back no sooner than [`PAUSED_REDELIVERY`] (to
    /// nobody, once the pulls still open expire: they wait there until the resume).
    fn send_back_paused(&mut self) {
        let held = std::mem::take(&mut self.held);
        for d in std::mem::take(&mut self.ready)
            .into_iter()
            .chain(held.into_iter().map(|(d, _)| d))
        {
            self.shared
                .outbound
                .ack(&d.acker(), AckKind::Nak(Some(PAUSED_REDELIVERY)));
        }
    }

    /// Naks messages that were not claimed (they come back in a second), then pauses a
    /// little, longer while the database is failing.
    async fn hand_back(&mut self, msgs: impl IntoIterator<Item = Delivered>) {
        for d in msgs {
            self.shared
                .outbound
                .ack(&d.acker(), AckKind::Nak(Some(Duration::from_secs(1))));
        }
        let wait = if self.claims.failing() {
            super::outage::backoff(2)
        } else {
            Duration::from_millis(500)
        };
        tokio::time::sleep(wait).await;
    }

    /// Acks messages whose jobs need nothing from us (Postgres already holds their state).
    fn drop_messages(&self, msgs: Vec<Delivered>) {
        Stats::add(&self.shared.stats.dropped, msgs.len() as u64);
        for d in msgs {
            self.shared.outbound.ack(&d.acker(), AckKind::Ack);
        }
    }
}
