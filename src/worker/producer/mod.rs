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
mod delivered;
mod pulls;
mod rejected;
mod slots;

use claim::*;
use pulls::*;
use rejected::*;
use slots::*;

pub(crate) use delivered::Delivered;
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
    pulls: Outage,
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
        Producer {
            watched,
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
            pulls: Outage::new("pull"),
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
        (self.slots.available_permits() + self.ahead()).saturating_sub(
            self.claiming + self.ready.len() + self.freed.waiting.load(Ordering::Acquire),
        )
    }

    /// How many jobs may be claimed beyond the free slots (see SHORT_JOB).
    fn ahead(&self) -> usize {
        let group = self
            .shared
            .config
            .worker
            .claim_batch
            .min(self.policy.concurrency);
        if self.flow.is_none()
            && !self.holding
            && self.freed.short_run.load(Ordering::Relaxed) >= group
        {
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

    pub async fn run(mut self, cancel: CancellationToken) {
        self.stop = cancel.clone();
        let mut pulls: SelectAll<BoxStream<'static, PullEvent>> = SelectAll::new();
        let mut open: HashMap<u64, Pull> = HashMap::new();
        // Slots promised to open pulls (doorbells promise none), and the part of them that
        // watches hold loosely.
        let mut reserved = 0usize;
        let mut loose = 0usize;
        let mut work_pulls = 0usize;
        let mut next_pull = 0u64;
        // The running jobs (they free their slot and ring `freed` as they end).
        let jobs = TaskTracker::new();
        // Claim statements in flight (at most CLAIMS_IN_FLIGHT).
        let mut pending: Pending = FuturesUnordered::new();
        // Messages that arrived with no free slot (from doorbells): they take the next slots,
        // highest priority first, or go back to the stream after HOLD_MAX.
        let mut held: Vec<(Delivered, Instant)> = Vec::new();
        let w = &self.shared.config.worker;
        let batch_cap = w.claim_batch.min(self.policy.concurrency);
        // A pull's byte budget never goes below the largest message the server takes.
        let pull_bytes = w
            .pull_max_bytes
            .max(self.shared.broker.max_payload() + 4096);
        // Refill once a quarter of the slots (or one batch) is free, or at once when idle.
        let refill_at = (batch_cap / 4).max(1);
        let mut pull_backoff = Duration::ZERO;

        loop {
            // A worker fenced off from PostgreSQL takes no new work until it is back.
            let fenced = self.shared.fenced.load(Ordering::SeqCst);
            self.holding = !held.is_empty();
            let permits = self.free_slots();
            let free = permits.saturating_sub(reserved);
            // What a message of a lane with work may have: the free slots and those an idle
            // lane's watch holds.
            let free_for_work = permits.saturating_sub(reserved - loose);
            // Held messages first — those of the highest lane that has work; one of a lower
            // lane waits (and goes back after HOLD_MAX), so priorities stay strict.
            let best_hot = self.lanes.iter().position(|l| l.hot).unwrap_or(usize::MAX);
            if !fenced && free_for_work > 0 && !held.is_empty() {
                held.sort_by_key(|(d, _)| d.rank);
                let n = held
                    .iter()
                    .take_while(|(d, _)| d.rank <= best_hot)
                    .count()
                    .min(free_for_work);
                if n > 0 {
                    let taken = unreserve_watches(&mut open, n.saturating_sub(free));
                    reserved -= taken;
                    loose -= taken;
                    let take: Vec<Delivered> = held.drain(..n).map(|(d, _)| d).collect();
                    let before = held.len();
                    self.admit(take, &mut held, &jobs, &mut pending).await;
                    // Unless messages went back to wait for grants (then on to the timers).
                    if held.len() <= before {
                        continue;
                    }
                }
            }
            if !held.is_empty() {
                let now = Instant::now();
                let (back, keep): (Vec<_>, Vec<_>) = held
                    .drain(..)
                    .partition(|(_, at)| fenced || now.duration_since(*at) >= HOLD_MAX);
                held = keep;
                for (d, _) in back {
                    // Every slot is busy: back to the stream; the lane stays hot, so it is
                    // pulled from as soon as a slot frees.
                    if let Some(l) = self.lanes.get_mut(d.rank) {
                        l.hot = true;
                    }
                    self.shared.outbound.ack(&d.acker(), AckKind::Nak(None));
                }
            }
            if !fenced
                && free_for_work > 0
                && (free_for_work >= refill_at || work_pulls == 0)
                && pull_backoff.is_zero()
                && self.lanes.iter().any(|l| l.hot)
            {
                let mut n = free_for_work.min(batch_cap);
                // Under a cap or rate limit: only as many as there are grants for (the
                // open pulls' messages have theirs).
                if let Some(flow) = self.flow.as_mut() {
                    let held = flow.reserve(reserved + n).await;
                    n = n.min(held.saturating_sub(reserved));
                }
                if let Some(i) = (n > 0).then(|| self.next_lane()).flatten() {
                    match self.send_pull(i, n, pull_bytes, false).await {
                        Ok(stream) => {
                            self.pulls.ok();
                            let taken = unreserve_watches(&mut open, n.saturating_sub(free));
                            reserved -= taken;
                            loose -= taken;
                            let id = next_pull;
                            next_pull += 1;
                            reserved += n;
                            work_pulls += 1;
                            pulls.push(tag(
                                stream,
                                id,
                                BROKER_CALL_LIMIT,
                                self.lanes[i].lane.to_string().into(),
                            ));
                            open.insert(
                                id,
                                Pull {
                                    remaining: n,
                                    reserved: n,
                                    bytes: 0,
                                    lane: i,
                                    kind: PullKind::Work,
                                },
                            );
                            continue;
                        }
                        Err(e) => {
                            let cause =
                                format!("pull request on {} failed: {e}", self.lanes[i].lane);
                            pull_backoff =
                                self.pulls.failed(&cause).max(Duration::from_millis(500));
                            self.check_consumer(i, true).await;
                        }
                    }
                }
            }
            // Every lane that looked empty keeps a doorbell open, so a message on any lane
            // is seen at once, whatever the others hold; the watched lane a watch over the
            // free slots, when there are any.
            if !fenced && pull_backoff.is_zero() {
                for i in 0..self.lanes.len() {
                    if self.lanes[i].hot || self.lanes[i].doorbell {
                        continue;
                    }
                    let free = self.free_slots().saturating_sub(reserved);
                    let (kind, n) = if self.watched == Some(i) && free > 0 {
                        (PullKind::Watch, free.min(batch_cap))
                    } else {
                        (PullKind::Doorbell, 1)
                    };
                    match self.send_pull(i, n, pull_bytes, true).await {
                        Ok(stream) => {
                            self.pulls.ok();
                            let id = next_pull;
                            next_pull += 1;
                            self.lanes[i].doorbell = true;
                            pulls.push(tag(
                                stream,
                                id,
                                PULL_EXPIRES + BROKER_CALL_LIMIT,
                                self.lanes[i].lane.to_string().into(),
                            ));
                            let reserve = if kind == PullKind::Watch { n } else { 0 };
                            reserved += reserve;
                            loose += reserve;
                            open.insert(
                                id,
                                Pull {
                                    remaining: n,
                                    reserved: reserve,
                                    bytes: 0,
                                    lane: i,
                                    kind,
                                },
                            );
                        }
                        Err(e) => {
                            let cause =
                                format!("pull request on {} failed: {e}", self.lanes[i].lane);
                            pull_backoff =
                                self.pulls.failed(&cause).max(Duration::from_millis(500));
                            self.check_consumer(i, true).await;
                            break;
                        }
                    }
                }
            }

            let mut arrived: Vec<Delivered> = Vec::new();
            // Messages that came without a slot promised to them (a doorbell's).
            let mut slotless: Vec<Delivered> = Vec::new();
            let mut empty_ended: Vec<usize> = Vec::new();
            let hold_until = held
                .iter()
                .map(|(_, at)| *at + HOLD_MAX)
                .min()
                .unwrap_or_else(Instant::now);
            // Waiting for grants while there is work: ask again when the store said.
            let flow_wait = self
                .flow
                .as_ref()
                .and_then(|f| f.waiting_until())
                .filter(|_| self.lanes.iter().any(|l| l.hot) || !held.is_empty());
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = tokio::time::sleep(pull_backoff), if !pull_backoff.is_zero() => {
                    pull_backoff = Duration::ZERO;
                }
                _ = self.freed.rung.notified() => {}
                _ = tokio::time::sleep(Duration::from_millis(200)), if fenced => {}
                _ = tokio::time::sleep_until(hold_until.into()), if !held.is_empty() => {}
                _ = tokio::time::sleep_until(flow_wait.unwrap_or_else(Instant::now).into()), if flow_wait.is_some() => {}
                Some(done) = pending.next(), if !pending.is_empty() => {
                    self.finish_claim(done, &jobs).await;
                }
                Some(ev) = pulls.next(), if !pulls.is_empty() => {
                    // Take this event and every other one already waiting: they are claimed
                    // together in one statement.
                    let mut ev = Some(ev);
                    while let Some(e) = ev.take() {
                        match e {
                            PullEvent::Msg(id, m) => {
                                let Some(p) = open.get_mut(&id) else { continue };
                                let lane = &mut self.lanes[p.lane];
                                let with_slot = p.reserved > 0;
                                if with_slot {
                                    p.reserved -= 1;
                                    reserved -= 1;
                                    if p.kind == PullKind::Watch {
                                        loose -= 1;
                                    }
                                } else {
                                    // It came without a slot: the lane has work, and its
                                    // priority decides what runs next.
                                    lane.hot = true;
                                }
                                p.remaining = p.remaining.saturating_sub(1);
                                p.bytes += m.length as u64;
                                let d = Delivered::new(m, &lane.lane, p.lane);
                                if with_slot {
                                    arrived.push(d);
                                } else {
                                    slotless.push(d);
                                }
                            }
                            PullEvent::Failed(cause) => {
                                debug!(queue = %self.policy.name, %cause, "pull status");
                            }
                            PullEvent::End(id) => {
                                if let Some(p) = open.remove(&id) {
                                    let lane = &mut self.lanes[p.lane];
                                    reserved -= p.reserved;
                                    match p.kind {
                                        PullKind::Doorbell => lane.doorbell = false,
                                        PullKind::Watch => {
                                            loose -= p.reserved;
                                            lane.doorbell = false;
                                            // Filled: more may be waiting.
                                            if p.remaining == 0 {
                                                lane.hot = true;
                                            }
                                        }
                                        PullKind::Work => {
                                            work_pulls -= 1;
                                            // Ended short: the lane ran dry; a doorbell or a
                                            // watch looks after it.
                                            if p.remaining > 0 {
                                                lane.hot = false;
                                            }
                                        }
                                    }
                                    self.shared.stats.largest_pull_bytes.fetch_max(p.bytes, Ordering::Relaxed);
                                    if p.bytes == 0 {
                                        empty_ended.push(p.lane);
                                    }
                                }
                            }
                        }
                        if arrived.len() + slotless.len() >= batch_cap {
                            break;
                        }
                        ev = pulls.next().now_or_never().flatten();
                    }
                }
            }
            if let Some(f) = self.flow.as_mut() {
                f.jobs_ended(self.freed.take());
                f.report_ended().await;
                // Nothing to pull: the grants held go back for other workers.
                if work_pulls == 0 && held.is_empty() && self.lanes.iter().all(|l| !l.hot) {
                    f.give_back().await;
                }
            }
            if !slotless.is_empty() {
                // A message that came without a slot never takes a free one from a
                // higher-priority lane that has work: that lane's next pull gets the slot. It
                // waits with the held ones (and goes back to the stream after HOLD_MAX).
                let best_hot = self.lanes.iter().position(|l| l.hot).unwrap_or(usize::MAX);
                let now = Instant::now();
                for d in slotless {
                    if d.rank > best_hot {
                        held.push((d, now));
                    } else {
                        arrived.push(d);
                    }
                }
            }
            if !arrived.is_empty() {
                // A work pull's messages have their slots (a watch's, those it still held); a
                // doorbell's only if one is free.
                arrived.sort_by_key(|d| d.rank);
                let room = self.free_slots().saturating_sub(reserved);
                if arrived.len() > room {
                    let now = Instant::now();
                    held.extend(arrived.drain(room..).map(|d| (d, now)));
                }
                self.ready.append(&mut arrived);
            } else {
                for i in empty_ended {
                    self.check_consumer(i, false).await;
                }
            }
            // Claim what is ready while a statement may go out (a queue under a cap or rate
            // limit claims one group at a time, inside `admit`).
            // Highest priority first (a stable sort: arrival order within a lane); taking
            // from the front keeps the rest sorted.
            self.ready.sort_by_key(|d| d.rank);
            while !self.ready.is_empty()
                && (self.flow.is_some() || pending.len() < CLAIMS_IN_FLIGHT)
            {
                let take = self.ready.len().min(batch_cap);
                let group: Vec<Delivered> = self.ready.drain(..take).collect();
                self.admit(group, &mut held, &jobs, &mut pending).await;
            }
        }
        // Stop fetching. Claims still in flight: what they claimed goes back (released, the
        // attempt refunded). Messages already delivered to us go back at once (a job that
        // exists only as a message would otherwise wait for the adopter).
        while let Some(done) = pending.next().await {
            self.finish_claim(done, &jobs).await;
        }
        for d in std::mem::take(&mut self.ready)
            .into_iter()
            .chain(held.drain(..).map(|(d, _)| d))
        {
            self.shared.outbound.ack(&d.acker(), AckKind::Nak(None));
        }
        while let Some(Some(ev)) = pulls.next().now_or_never() {
            if let PullEvent::Msg(id, m) = ev {
                let rank = open.get(&id).map(|p| p.lane).unwrap_or(0);
                let lane = self.lanes[rank].lane.clone();
                let acker = Delivered::new(m, &lane, rank).acker();
                self.shared.outbound.ack(&acker, AckKind::Nak(None));
            }
        }
        drop(pulls);
        if let Some(f) = self.flow.as_mut() {
            f.give_back().await;
        }
        // Let running jobs finish (the worker bounds this by shutdown_grace).
        jobs.close();
        jobs.wait().await;
        if let Some(f) = self.flow.as_mut() {
            f.jobs_ended(self.freed.take());
            f.report_ended().await;
        }
    }

    /// Claims messages of a queue without limits at once; under a cap or rate limit only as
    /// many as it holds grants for (the rest wait in `held`, highest priority first).
    async fn admit(
        &mut self,
        mut msgs: Vec<Delivered>,
        held: &mut Vec<(Delivered, Instant)>,
        jobs: &TaskTracker,
        pending: &mut Pending,
    ) {
        let Some(flow) = self.flow.as_mut() else {
            self.start_claim(msgs, jobs, pending).await;
            return;
        };
        let granted = flow.reserve(msgs.len()).await;
        if msgs.len() > granted {
            msgs.sort_by_key(|d| d.rank);
            held.extend(msgs.drain(granted..).map(|d| {
                let at = d.arrived;
                (d, at)
            }));
        }
        if msgs.is_empty() {
            return;
        }
        let n = msgs.len();
        // Under a cap or rate limit, one claim at a time: the grants used are known at once.
        self.start_claim(msgs, jobs, pending).await;
        let mut started = 0;
        while let Some(done) = pending.next().await {
            started += self.finish_claim(done, jobs).await;
        }
        if let Some(flow) = self.flow.as_mut() {
            flow.used(n, started).await;
        }
    }

    /// Naks messages that were not claimed (they come back in a second), then pauses a
    /// little, longer while the database is failing.
    async fn hand_back(&self, msgs: impl IntoIterator<Item = Delivered>) {
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
