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

/// A pull's messages as events tagged with the pull's id, ending with `End`. A pull that
/// hears nothing from the server for `idle` ends too: a request the server never answers
/// (it hung, or restarted and forgot it) must not hold its slots forever.
fn tag(
    batch: async_nats::jetstream::consumer::pull::Batch,
    id: u64,
    idle: Duration,
    lane: Arc<str>,
) -> BoxStream<'static, PullEvent> {
    futures::stream::unfold(Some(batch), move |batch| {
        let lane = lane.clone();
        async move {
            let mut batch = batch?;
            match tokio::time::timeout(idle, batch.next()).await {
                Ok(Some(Ok(m))) => Some((PullEvent::Msg(id, Box::new(m)), Some(batch))),
                Ok(Some(Err(e))) => Some((PullEvent::Failed(e.to_string()), Some(batch))),
                Ok(None) => None,
                Err(_) => {
                    warn!(%lane, ?idle, "pull request unanswered; giving up on it and pulling again");
                    None
                }
            }
        }
    })
    .chain(futures::stream::once(async move { PullEvent::End(id) }))
    .boxed()
}

enum PullEvent {
    Msg(u64, Box<async_nats::jetstream::Message>),
    Failed(String),
    End(u64),
}

/// A delivered message, where it sits in the stream, and when the stream stored it.
pub(crate) struct Delivered {
    /// Boxed as it came from the pull: a message is moved several times between its
    /// arrival and its dispatch, and a box moves as one pointer.
    pub msg: Box<async_nats::jetstream::Message>,
    pub seq: u64,
    pub stored_ns: i128,
    /// How many times JetStream has delivered it (1: the first time).
    delivered: i64,
    /// The priority band it came from (`None`: the bare subject).
    pub band: Option<u8>,
    /// Its lane's place in the priority order (0 first).
    rank: usize,
    /// When it reached this worker.
    arrived: Instant,
}

impl Delivered {
    fn new(msg: Box<async_nats::jetstream::Message>, lane: &Lane, rank: usize) -> Delivered {
        let (seq, stored_ns, delivered) = msg
            .info()
            .map(|i| {
                let published = crate::broker::unix_nanos(&i.published);
                (i.stream_sequence, published, i.delivered)
            })
            .unwrap_or((0, 0, 1));
        Delivered {
            msg,
            seq,
            stored_ns,
            delivered,
            band: lane.band,
            rank,
            arrived: Instant::now(),
        }
    }

    fn acker(self) -> Arc<Acker> {
        Arc::new((*self.msg).split().1)
    }

    /// The message's own id (`<stream>-<seq>-<stored ns>`), under which it is recorded when
    /// it cannot run as the job it names.
    fn own_id(&self, queue: &str, stream: &str) -> String {
        job::message_id(&MessageOrigin {
            queue,
            stream,
            stream_seq: self.seq,
            stored_ns: self.stored_ns,
            msg_id: None,
        })
    }

    fn header(&self, name: &str) -> Option<String> {
        self.msg
            .headers
            .as_ref()
            .and_then(|h| h.get(name))
            .map(|v| v.as_str().to_string())
    }
}

/// What became of one message of a claim group.
enum Answer {
    Claim(Claim),
    /// PostgreSQL refused this message's data: recorded as invalid.
    Refused(String),
    /// Not claimed (the database went away mid-way, or this worker is not registered):
    /// handed back to the stream.
    NotTried,
}

/// Claim statements in flight at once per queue: the next group is claimed while the last
/// one's statement runs and commits, so the producer does not idle on a round trip.
pub(crate) const CLAIMS_IN_FLIGHT: usize = 2;

/// A claim group on its way to PostgreSQL: the messages it claims (with their inputs at the
/// same positions), and those it already knows the fate of.
struct Claiming {
    inputs: Vec<ClaimInput>,
    /// Per input: its row probably exists (a redelivery, a job republished from its row, or
    /// one with an idempotency key), so the claim's plain insert is not tried for it.
    known: Vec<bool>,
    messages: Vec<Delivered>,
    rejected: Vec<Rejected>,
    dropped: Vec<Delivered>,
    /// Held until the claim's answer is taken in (see `Ledger::claim_ticket`).
    ticket: super::ledger::ClaimTicket,
}

/// A claim's answers (none when nothing was claimed; the flag false when this worker is not
/// registered), and how the database fared (for the outage log).
type ClaimAnswer = (Option<(bool, Vec<Answer>)>, Option<Result<(), String>>);
type ClaimDone = (
    Claiming,
    Option<(bool, Vec<Answer>)>,
    Option<Result<(), String>>,
);
type Pending = FuturesUnordered<futures::future::BoxFuture<'static, ClaimDone>>;

/// A message that cannot run as it is: its id, and why.
pub(crate) struct Rejected {
    pub delivered: Delivered,
    pub id: String,
    pub reason: String,
}

/// What an outstanding pull request is for.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum PullKind {
    /// A no-wait pull to a lane with work waiting: it holds a slot per message asked for.
    Work,
    /// A long poll sized to the free slots, watching the default lane while it is idle (as
    /// one request for many messages, the fastest path from publish to start). Its slots are
    /// held loosely: a message of another lane may take them, and what the watch brings
    /// beyond what it still holds then waits in `held` like a doorbell's.
    Watch,
    /// A one-message long poll on a lane that looked empty: it holds no slot.
    Doorbell,
}

/// One outstanding pull request.
struct Pull {
    /// Messages still to come.
    remaining: usize,
    /// Slots still held for it.
    reserved: usize,
    bytes: u64,
    /// The lane it was sent to (an index into `Producer::lanes`).
    lane: usize,
    kind: PullKind,
}

/// Takes up to `want` loosely held slots back from the open watches; returns how many.
fn unreserve_watches(open: &mut HashMap<u64, Pull>, want: usize) -> usize {
    let mut taken = 0;
    for p in open.values_mut().filter(|p| p.kind == PullKind::Watch) {
        let k = p.reserved.min(want - taken);
        p.reserved -= k;
        taken += k;
        if taken == want {
            break;
        }
    }
    taken
}

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

    /// Sends a pull request for up to `n` messages to lane `i` (bounded in time): a work
    /// pull takes what the lane holds now and ends (`no_wait`); a long poll (doorbell or
    /// watch) waits up to [`PULL_EXPIRES`] for its messages.
    async fn send_pull(
        &self,
        i: usize,
        n: usize,
        max_bytes: usize,
        long_poll: bool,
    ) -> Result<async_nats::jetstream::consumer::pull::Batch, String> {
        let consumer = &self.lanes[i].consumer;
        Stats::add(&self.shared.stats.pulls, 1);
        // No idle heartbeat: async-nats 0.51's batch stream stops waking up after the first
        // one, leaving later messages unread until ack_wait.
        let request = async {
            if long_poll {
                consumer
                    .batch()
                    .max_messages(n)
                    .max_bytes(max_bytes)
                    .expires(PULL_EXPIRES)
                    .messages()
                    .await
            } else {
                consumer
                    .fetch()
                    .max_messages(n)
                    .max_bytes(max_bytes)
                    .messages()
                    .await
            }
        };
        match tokio::time::timeout(BROKER_CALL_LIMIT, request).await {
            Ok(Ok(batch)) => Ok(batch),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!(
                "not sent within {BROKER_CALL_LIMIT:?} (NATS unreachable?)"
            )),
        }
    }

    /// Makes sure lane `i`'s consumer still exists (at most every [`CONSUMER_CHECK_EVERY`]
    /// unless `now`), and provisions it again when an operator deleted it or the stream.
    async fn check_consumer(&mut self, i: usize, now: bool) {
        let lane = &mut self.lanes[i];
        if !now && lane.last_check.elapsed() < CONSUMER_CHECK_EVERY {
            return;
        }
        lane.last_check = Instant::now();
        let info = tokio::time::timeout(BROKER_CALL_LIMIT, lane.consumer.info()).await;
        use async_nats::jetstream::context::ConsumerInfoErrorKind as Kind;
        let gone = matches!(
            &info,
            Ok(Err(e)) if matches!(e.kind(), Kind::NotFound | Kind::StreamNotFound)
        );
        if !gone {
            return;
        }
        let broker = &self.shared.broker;
        match broker.consumer_or_provision(&lane.lane).await {
            Ok(c) => lane.consumer = c,
            Err(e) => {
                warn!(lane = %lane.lane, cause = %e, "consumer is gone and cannot be created again");
                return;
            }
        }
        // The stream was likely deleted with all the queue's consumers: the other lanes are
        // provisioned now too, without a wait each.
        if !self.shared.config.nats.provision {
            return;
        }
        for (j, other) in self.lanes.iter_mut().enumerate() {
            if j == i || broker.consumer(&other.lane).await.is_ok() {
                continue;
            }
            match broker.provision_consumer(&other.lane).await {
                Ok(c) => other.consumer = c,
                Err(e) => {
                    warn!(lane = %other.lane, cause = %e, "consumer is gone and cannot be created again")
                }
            }
        }
    }

    /// Claims one group of delivered messages and dispatches the claimed jobs; returns how
    /// many jobs it started.
    /// Decodes a group of messages and starts its claim statement; returns without waiting
    /// for it unless `CLAIMS_IN_FLIGHT` are already out (then it finishes the first to answer).
    async fn start_claim(
        &mut self,
        arrived: Vec<Delivered>,
        jobs: &TaskTracker,
        pending: &mut Pending,
    ) {
        let shared = self.shared.clone();
        let max_bytes = shared.config.worker.max_payload_bytes;
        let stream = shared.broker.stream_name().to_string();
        let queue = self.policy.name.clone();
        // The claimable messages, and their claim inputs at the same positions.
        let mut inputs: Vec<ClaimInput> = Vec::with_capacity(arrived.len());
        let mut known: Vec<bool> = Vec::with_capacity(arrived.len());
        let mut messages: Vec<Delivered> = Vec::with_capacity(arrived.len());
        let mut rejected: Vec<Rejected> = Vec::new();
        let mut dropped: Vec<Delivered> = Vec::new();
        let mut mismatched = Vec::new();
        let mut seen = HashSet::with_capacity(arrived.len());
        for d in arrived {
            let msg_id = d.header(async_nats::header::NATS_MESSAGE_ID.as_ref());
            let origin = MessageOrigin {
                queue: &queue,
                stream: &stream,
                stream_seq: d.seq,
                stored_ns: d.stored_ns,
                msg_id: msg_id.as_deref(),
            };
            match job::decode(&d.msg.payload, &origin, max_bytes) {
                Ok(mut job) if seen.insert(job.id.clone()) => {
                    // The subject a message came by is its priority: the lane it is delivered
                    // in. An envelope naming another one could not be honoured (JetStream has
                    // the message in that lane's order already), so it is refused, saying
                    // which subject to publish it to; stored, it would run at one priority and
                    // say another.
                    let lane_priority = d.band.map_or(job::DEFAULT_PRIORITY, i16::from);
                    if job.priority_named && job.priority != lane_priority {
                        let reason =
                            priority_mismatch(&shared, &queue, job.priority, lane_priority);
                        let max_attempts =
                            job.max_attempts.unwrap_or(self.policy.max_attempts as i32);
                        let own = d.own_id(&queue, &stream);
                        let input = ClaimInput {
                            job,
                            max_attempts,
                            traceparent: None,
                        };
                        mismatched.push((relabel(input, &own), reason, Some(d)));
                        continue;
                    }
                    job.priority = lane_priority;
                    let max_attempts = job.max_attempts.unwrap_or(self.policy.max_attempts as i32);
                    // A job with an idempotency key may be a duplicate by design.
                    known.push(
                        d.delivered > 1
                            || job.idempotency_key.is_some()
                            || msg_id.as_deref().is_some_and(|m| republished(m, &job.id)),
                    );
                    inputs.push(ClaimInput {
                        job,
                        max_attempts,
                        traceparent: d
                            .header("traceparent")
                            .filter(|t| crate::contract::traceparent(t).is_some()),
                    });
                    messages.push(d);
                }
                Ok(_) => dropped.push(d),
                Err(e) => rejected.push(Rejected {
                    id: d.own_id(&queue, &stream),
                    reason: e.to_string(),
                    delivered: d,
                }),
            }
        }
        if !mismatched.is_empty() {
            keep_dead(&shared, mismatched, Kept::PriorityMismatch).await;
        }
        if inputs.is_empty() {
            record_invalid(&shared, &queue, rejected).await;
            self.drop_messages(dropped);
            return;
        }
        // A worker fenced off (or declared dead) claims nothing: hand the messages back.
        if shared.fenced.load(Ordering::SeqCst) {
            let back = messages
                .into_iter()
                .chain(dropped)
                .chain(rejected.into_iter().map(|r| r.delivered));
            self.hand_back(back).await;
            return;
        }
        while pending.len() >= CLAIMS_IN_FLIGHT {
            let Some(done) = pending.next().await else {
                break;
            };
            self.finish_claim(done, jobs).await;
        }
        self.claiming += messages.len();
        // How many of these have no slot of their own yet (claimed ahead, see SHORT_JOB).
        let taken =
            self.policy.concurrency - self.slots.available_permits().min(self.policy.concurrency);
        let promised =
            taken + self.claiming + self.ready.len() + self.freed.waiting.load(Ordering::Acquire);
        let beyond = promised.saturating_sub(self.policy.concurrency);
        Stats::add(
            &shared.stats.claimed_ahead,
            beyond.min(messages.len()) as u64,
        );
        let group = Claiming {
            inputs,
            known,
            messages,
            rejected,
            dropped,
            ticket: shared.ledger.claim_ticket(),
        };
        let stale = self.policy.stale_after;
        pending.push(
            async move {
                let (answered, health) = claim(&shared, stale, &group.inputs, &group.known).await;
                (group, answered, health)
            }
            .boxed(),
        );
    }

    /// Takes a claim's answer: runs what it claimed, acks and drops what needs nothing,
    /// keeps conflicts and invalid messages, hands the rest back. Returns how many it ran.
    async fn finish_claim(&mut self, done: ClaimDone, jobs: &TaskTracker) -> usize {
        let (group, answered, health) = done;
        let Claiming {
            inputs,
            known: _,
            messages,
            mut rejected,
            mut dropped,
            ticket,
        } = group;
        self.claiming -= messages.len();
        match health {
            Some(Ok(())) => self.claims.ok(),
            Some(Err(cause)) => {
                self.claims.failed(&cause);
            }
            None => {}
        }
        let shared = self.shared.clone();
        let stream = shared.broker.stream_name().to_string();
        let queue = self.policy.name.clone();
        let Some((alive, claims)) = answered else {
            drop(ticket);
            let back = messages
                .into_iter()
                .chain(dropped)
                .chain(rejected.into_iter().map(|r| r.delivered));
            self.hand_back(back).await;
            return 0;
        };
        if !alive {
            // Others declared this worker dead: take no work until registered again.
            shared.fenced.store(true, Ordering::SeqCst);
            shared.reregister.notify_one();
            warn!(worker.id = %shared.worker_id, "claim refused: this worker is not registered (declared dead); registering again");
        }
        // A claim that committed as the worker fenced itself off (its answer came late) must
        // not run: others may take these jobs soon. They are given back, attempt refunded.
        let stopping = self.stop.is_cancelled();
        let give_back = shared.fenced.load(Ordering::SeqCst) || stopping;
        let mut dispatched = 0;
        let mut back = Vec::new();
        // Messages of other jobs that reused a taken id: kept as dead jobs under their own
        // message id, with their own payload, so a retry runs them.
        let mut conflicts: Vec<(ClaimInput, String, Option<Delivered>)> = Vec::new();
        for ((input, d), answer) in inputs.into_iter().zip(messages).zip(claims) {
            let id = input.job.id.clone();
            let claim = match answer {
                Answer::Claim(c) => c,
                Answer::NotTried => {
                    back.push(d);
                    continue;
                }
                Answer::Refused(reason) => {
                    rejected.push(Rejected {
                        id: d.own_id(&queue, &stream),
                        reason,
                        delivered: d,
                    });
                    continue;
                }
            };
            match claim {
                Claim::Claimed {
                    lease,
                    attempt,
                    max_attempts,
                    ..
                } if give_back => {
                    if stopping {
                        debug!(job.id = %id, job.lease = lease, "claimed as this worker stopped: giving it back");
                    } else {
                        warn!(job.id = %id, job.lease = lease, "claimed as this worker fenced itself off: giving it back");
                    }
                    // Owned until the release settles: in the ledger meanwhile, so a drain
                    // waits for it (and counts it).
                    let control = AttemptControl::new(shared.pacing.stop_grace(KILL_GRACE));
                    let owned = shared.ledger.claimed(
                        &id,
                        lease,
                        self.policy.clone(),
                        d.acker(),
                        Arc::new(control),
                    );
                    let attempts = (attempt.max(1) as u32, max_attempts.max(1) as u32);
                    release_unstarted(&shared, &self.done, &owned, id, lease, attempts).await;
                }
                Claim::Claimed {
                    lease,
                    attempt,
                    max_attempts,
                    timeout_ms,
                    payload,
                    backoff,
                    traceparent,
                    conflict,
                } => {
                    let message_trace = input.traceparent.clone();
                    let (job_payload, job_backoff) = match payload {
                        // The row existed: PostgreSQL holds the job. A message with another
                        // payload is another job that reused the id: kept, not lost.
                        Some(p) => {
                            if conflict {
                                let own_id = d.own_id(&queue, &stream);
                                let reason = conflict_reason(&id, "queued");
                                conflicts.push((relabel(input, &own_id), reason, None));
                            }
                            (p, backoff)
                        }
                        // Created from the message: its payload moves into the job.
                        None => (input.job.payload, input.job.backoff),
                    };
                    self.dispatch(
                        jobs,
                        d,
                        Owned {
                            id,
                            lease,
                            attempt: attempt.max(1) as u32,
                            max_attempts: max_attempts.max(1) as u32,
                            timeout: timeout_ms
                                .map(|ms| Duration::from_millis(ms.max(1) as u64))
                                .unwrap_or(self.policy.timeout),
                            payload: job_payload,
                            backoff: job_backoff,
                            traceparent: traceparent.or(message_trace),
                        },
                    )
                    .await;
                    dispatched += 1;
                }
                Claim::NotClaimable {
                    status,
                    conflict: true,
                } => {
                    let own_id = d.own_id(&queue, &stream);
                    let reason = conflict_reason(&id, status.as_str());
                    conflicts.push((relabel(input, &own_id), reason, Some(d)));
                }
                Claim::NotClaimable { status, .. } => {
                    debug!(job.id = %id, %status, "message for a job that is not claimable; acked and dropped");
                    dropped.push(d);
                }
                Claim::Duplicate => dropped.push(d),
                Claim::WrongQueue(other) => rejected.push(Rejected {
                    id: d.own_id(&queue, &stream),
                    reason: format!(
                        "id {id:?} belongs to a job of queue {other}; give this job another id"
                    ),
                    delivered: d,
                }),
            }
        }
        // Every job this claim took is in the ledger now: the heartbeat may judge them.
        drop(ticket);
        self.drop_messages(dropped);
        if !back.is_empty() {
            self.hand_back(back).await;
        }
        // Only now, with every claimed job recorded as owned and running.
        if !conflicts.is_empty() {
            keep_conflicts(&shared, conflicts).await;
        }
        if !rejected.is_empty() {
            record_invalid(&shared, &queue, rejected).await;
        }
        dispatched
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

    /// Records a claimed job in the ledger and runs it in its slot: at once when one is
    /// free; a job claimed ahead (see SHORT_JOB) takes the next one to free.
    async fn dispatch(&self, jobs: &TaskTracker, d: Delivered, job: Owned) {
        let shared = &self.shared;
        let stored_ns = d.stored_ns;
        let control = Arc::new(AttemptControl::new(shared.pacing.stop_grace(KILL_GRACE)));
        let attempt =
            shared
                .ledger
                .claimed(&job.id, job.lease, self.policy.clone(), d.acker(), control);
        let permit = self.slots.clone().try_acquire_owned().ok();
        if permit.is_none() {
            self.freed.waiting.fetch_add(1, Ordering::AcqRel);
        }
        jobs.spawn(shared.supervisor.job(run_in_slot(
            shared.clone(),
            attempt,
            job,
            self.done.clone(),
            (permit, self.slots.clone()),
            self.freed.clone(),
            stored_ns,
        )));
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

/// Claims a group. When one message's data makes PostgreSQL reject the whole statement
/// (a value it cannot store), claims them one by one so only that message is refused,
/// with PostgreSQL's reason; claims already committed then are kept whatever happens to
/// the rest. `None` when nothing was claimed (the database is unavailable); the flag is
/// false when this worker is not registered. Also says how the database fared (for the
/// outage log), when there is something to say.
async fn claim(
    shared: &Shared,
    stale: Duration,
    inputs: &[ClaimInput],
    known: &[bool],
) -> ClaimAnswer {
    // The common case first: the messages are new jobs, and one plain insert claims them.
    // Messages whose rows probably exist go straight to the full claim: one of them would make
    // the insert fail as a whole (it then claims nothing, and the full claim takes them all).
    let new: Vec<usize> = (0..inputs.len()).filter(|&i| !known[i]).collect();
    if new.is_empty() {
        return claim_existing(shared, stale, inputs).await;
    }
    let subset: Vec<ClaimInput>;
    let to_insert = if new.len() == inputs.len() {
        inputs
    } else {
        subset = new.iter().map(|&i| inputs[i].clone()).collect();
        &subset[..]
    };
    let fresh = match shared
        .store
        .job_claim_new(&shared.worker_id, stale, to_insert)
        .await
    {
        Ok(fresh) => fresh,
        Err(e) if e.rejected_data().is_none() => return (None, Some(Err(e.to_string()))),
        // One message's data was refused: the full claim finds which.
        Err(_) => return claim_existing(shared, stale, inputs).await,
    };
    let fresh = if new.len() == inputs.len() {
        fresh
    } else {
        let mut all = vec![None; inputs.len()];
        for (i, f) in new.into_iter().zip(fresh) {
            all[i] = f;
        }
        all
    };
    if fresh.iter().all(Option::is_some) {
        let answers = fresh.into_iter().flatten().map(Answer::Claim).collect();
        return (Some((true, answers)), Some(Ok(())));
    }
    // The rest exist already (or this worker may not claim): the full statement decides.
    let rest: Vec<ClaimInput> = inputs
        .iter()
        .zip(&fresh)
        .filter(|(_, f)| f.is_none())
        .map(|(i, _)| i.clone())
        .collect();
    let (answered, health) = claim_existing(shared, stale, &rest).await;
    let inserted = fresh.iter().any(Option::is_some);
    let (alive, mut others) = match answered {
        Some((alive, answers)) => (alive, answers.into_iter()),
        // The inserts are committed claims: they run; the rest goes back.
        None if inserted => (true, Vec::new().into_iter()),
        None => return (None, health),
    };
    let answers = fresh
        .into_iter()
        .map(|f| match f {
            Some(c) => Answer::Claim(c),
            None => others.next().unwrap_or(Answer::NotTried),
        })
        .collect();
    (Some((alive, answers)), health)
}

/// The full claim (`job_claim.sql`): new jobs and existing rows alike.
async fn claim_existing(shared: &Shared, stale: Duration, inputs: &[ClaimInput]) -> ClaimAnswer {
    let store = &shared.store;
    let me = &shared.worker_id;
    match store.job_claim(me, stale, inputs).await {
        // Not registered: the statement wrote nothing, every message goes back.
        Ok(a) if !a.alive => {
            return (
                Some((false, inputs.iter().map(|_| Answer::NotTried).collect())),
                Some(Ok(())),
            );
        }
        Ok(a) => {
            return (
                Some((true, a.claims.into_iter().map(Answer::Claim).collect())),
                Some(Ok(())),
            );
        }
        Err(e) if e.rejected_data().is_none() => return (None, Some(Err(e.to_string()))),
        Err(_) => {}
    }
    let mut out = Vec::with_capacity(inputs.len());
    let mut health = None;
    // `alive`: still claiming; `registered`: the worker's row said it may.
    let (mut alive, mut registered) = (true, true);
    for input in inputs {
        if !alive {
            out.push(Answer::NotTried);
            continue;
        }
        match store
            .job_claim(me, stale, std::slice::from_ref(input))
            .await
        {
            Ok(a) if !a.alive => {
                registered = false;
                alive = false;
                out.push(Answer::NotTried);
            }
            Ok(mut a) => out.push(Answer::Claim(a.claims.remove(0))),
            Err(e) => match e.rejected_data() {
                Some(reason) => out.push(Answer::Refused(format!(
                    "PostgreSQL cannot store this job: {reason}"
                ))),
                // Gone mid-way: what was claimed stays claimed, the rest goes back.
                None => {
                    health = Some(Err(e.to_string()));
                    alive = false;
                    out.push(Answer::NotTried);
                }
            },
        }
    }
    (Some((registered, out)), health)
}

/// Why a message whose envelope names another priority than its subject's is refused.
fn priority_mismatch(shared: &Shared, queue: &str, named: i16, lane: i16) -> String {
    let prefix = &shared.config.nats.subject_prefix;
    let came = Lane::of(queue, lane).subject(prefix);
    let right = Lane::of(queue, named).subject(prefix);
    format!(
        "field `priority` is invalid: the envelope names priority {named}, but the message was \
         published to {came} (priority {lane}); publish it to {right} (or leave the field out). \
         `jobwarden dlq retry` runs this one at priority {named}"
    )
}

/// A message jobwarden republished from the job's row (the scheduler, for a retry, a due or
/// an SQL-enqueued job): `Nats-Msg-Id: <id>:<generation>`.
fn republished(msg_id: &str, id: &str) -> bool {
    msg_id
        .strip_prefix(id)
        .and_then(|rest| rest.strip_prefix(':'))
        .is_some_and(|g| !g.is_empty() && g.bytes().all(|b| b.is_ascii_digit()))
}

/// The input of a message's own job, under its own message id (for keeping it dead).
fn relabel(mut input: ClaimInput, own_id: &str) -> ClaimInput {
    input.job.id = own_id.to_string();
    input.job.idempotency_key = None;
    input
}

fn conflict_reason(id: &str, status: &str) -> String {
    format!(
        "id {id:?} is already used by a {status} job with another payload (a producer reused \
         the id, or its Nats-Msg-Id, for another job); this message was kept as a dead job \
         under its own id: `jobwarden dlq retry` runs it"
    )
}

/// Keeps messages that reused a taken id as dead jobs with their own payload, then acks the
/// ones that were only waiting for that (a message whose job runs under the row's payload is
/// acked when that job settles).
async fn keep_conflicts(shared: &Shared, items: Vec<(ClaimInput, String, Option<Delivered>)>) {
    keep_dead(shared, items, Kept::IdConflict).await
}

/// Why a message is kept as a dead job with its own payload.
#[derive(Clone, Copy, PartialEq)]
enum Kept {
    /// It reused a taken id.
    IdConflict,
    /// Its envelope named another priority than its subject's.
    PriorityMismatch,
}

/// Keeps messages as dead jobs with their own payload and fields (a retry runs them), then
/// acks them; naks them (they come back) when that cannot be written.
async fn keep_dead(
    shared: &Shared,
    items: Vec<(ClaimInput, String, Option<Delivered>)>,
    why: Kept,
) {
    let (batch, rest): (Vec<ClaimInput>, Vec<(String, Option<Delivered>)>) =
        items.into_iter().map(|(i, r, d)| (i, (r, d))).unzip();
    let reasons: Vec<String> = rest.iter().map(|(r, _)| r.clone()).collect();
    let kept = shared
        .store
        .job_dead_kept(&shared.worker_id, &batch, &reasons)
        .await;
    let inserted: HashSet<String> = match &kept {
        Ok(ids) => ids.iter().cloned().collect(),
        Err(e) => {
            warn!(cause = %e, "could not keep messages that reused a taken id; they come back");
            HashSet::new()
        }
    };
    for (input, (reason, d)) in batch.into_iter().zip(rest) {
        // Not inserted but no error: this very message was kept before (its id is unique).
        let recorded = kept.is_ok();
        if recorded {
            if inserted.contains(&input.job.id) {
                if why == Kept::IdConflict {
                    Stats::add(&shared.stats.id_conflicts, 1);
                    warn!(job.id = %input.job.id, %reason, "message reused a taken id: kept as a dead job");
                } else {
                    Stats::add(&shared.stats.invalid, 1);
                    warn!(job.id = %input.job.id, %reason, "message named another priority than its subject's: kept as a dead job");
                }
                shared.announce_dead(&input.job.queue, &input.job.id, Some(&reason));
            }
            if let Some(d) = d {
                shared.outbound.ack(&d.acker(), AckKind::Ack);
            }
        } else if let Some(d) = d {
            shared
                .outbound
                .ack(&d.acker(), AckKind::Nak(Some(Duration::from_secs(5))));
        }
    }
}

/// Records messages that cannot become jobs, then acks them: as dead jobs with the reason
/// when possible, in `poison_messages` otherwise. If even that fails they are nak'd and
/// come back later; nothing is dropped without a record (invariant 9).
pub(crate) async fn record_invalid(shared: &Shared, queue: &str, items: Vec<Rejected>) {
    if items.is_empty() {
        return;
    }
    let store = &shared.store;
    let me = &shared.worker_id;
    let rows: Vec<(String, String, Value, String)> = items
        .iter()
        .map(|r| {
            (
                r.id.clone(),
                queue.to_string(),
                invalid_payload(&r.delivered.msg.payload),
                r.reason.clone(),
            )
        })
        .collect();
    let inserted: HashSet<String> = match store.job_dead_invalid(me, &rows).await {
        Ok(ids) => ids.into_iter().collect(),
        Err(e) => {
            warn!(queue = %queue, cause = %e, "could not record invalid messages as dead jobs");
            HashSet::new()
        }
    };
    // An id that was not inserted but exists is this very message, recorded before (ids of
    // invalid messages are their own stream sequence and time).
    let missing: Vec<&str> = items
        .iter()
        .filter(|r| !inserted.contains(&r.id))
        .map(|r| r.id.as_str())
        .collect();
    let existing: HashSet<String> = if missing.is_empty() {
        HashSet::new()
    } else {
        store
            .jobs_existing(&missing)
            .await
            .unwrap_or_default()
            .into_iter()
            .collect()
    };
    for r in items {
        // Recorded now: as a dead job, or, when even that cannot be written, as a poison
        // message. (One whose dead job exists already is a redelivery, counted before.)
        let new = inserted.contains(&r.id)
            || !existing.contains(&r.id)
                && store
                    .poison_insert(
                        me,
                        r.delivered.msg.subject.as_str(),
                        Some(r.delivered.seq as i64),
                        &r.reason,
                        &r.delivered.msg.payload,
                    )
                    .await
                    .is_ok();
        if new || existing.contains(&r.id) {
            if new {
                Stats::add(&shared.stats.invalid, 1);
                warn!(queue = %queue, nats.seq = r.delivered.seq, job.id = %r.id, reason = %r.reason, "invalid message recorded and acked");
            }
            shared.outbound.ack(&r.delivered.acker(), AckKind::Ack);
        } else {
            shared.outbound.ack(
                &r.delivered.acker(),
                AckKind::Nak(Some(Duration::from_secs(5))),
            );
        }
    }
}

/// Runs a job holding its slot; the slot frees (and the producer hears of it) at the end.
/// A job claimed ahead has no slot yet: it waits for one, and if none frees within HOLD_MAX
/// (or the attempt was stopped meanwhile) it is given back, its attempt refunded, and never
/// runs here.
async fn run_in_slot(
    shared: Arc<Shared>,
    attempt: super::ledger::Attempt,
    job: Owned,
    done: mpsc::Sender<Finished>,
    (permit, slots): (Option<OwnedSemaphorePermit>, Arc<Semaphore>),
    freed: Arc<Freed>,
    stored_ns: i128,
) {
    let permit = match permit {
        Some(p) => p,
        None => {
            // The wait ends early when the attempt is stopped (taken from this worker, or
            // released at the end of a drain's grace) and when the worker starts to drain: a
            // job that has not started yet goes back at once for another worker to run.
            let got = tokio::select! {
                biased;
                _ = attempt.control.token().cancelled() => Waited::Stopped,
                _ = shared.fetch_cancel.cancelled() => Waited::Stopped,
                p = tokio::time::timeout(HOLD_MAX, slots.acquire_owned()) => match p {
                    Ok(Ok(p)) => Waited::Slot(p),
                    Ok(Err(_closed)) => Waited::Stopped,
                    Err(_elapsed) => Waited::TimedOut,
                },
            };
            freed.waiting.fetch_sub(1, Ordering::AcqRel);
            match (got, attempt.control.stopped()) {
                (Waited::Slot(p), None) => p,
                (_, Some(Stop::Lost)) => {
                    // Taken from this worker meanwhile: nothing to settle or ack (as for an
                    // attempt that was running).
                    shared.ledger.settled(&job.id, job.lease);
                    freed.rung.notify_one();
                    return;
                }
                (got, _) => {
                    if matches!(got, Waited::TimedOut) {
                        // No slot freed in a second: the jobs are not short any more. Claim
                        // nothing ahead until a group of short ones has ended again (else
                        // jobs would go back and forth every second behind long ones).
                        freed.short_run.store(0, Ordering::Relaxed);
                        debug!(job.id = %job.id, job.lease = job.lease, "claimed ahead and no slot freed in time: giving it back");
                    }
                    let attempts = (job.attempt, job.max_attempts);
                    release_unstarted(&shared, &done, &attempt, job.id, job.lease, attempts).await;
                    freed.rung.notify_one();
                    return;
                }
            }
        }
    };
    Stats::add(&shared.stats.claimed, 1);
    let m = &attempt.policy.metrics;
    m.started.inc();
    if stored_ns > 0 {
        let now_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as i128)
            .unwrap_or(0);
        m.wait.observe((now_ns - stored_ns).max(0) as f64 / 1e9);
    }
    let _end = JobEnd {
        permit: Some(permit),
        freed,
        started: Instant::now(),
    };
    execute(shared, attempt, job, done).await;
}

/// Gives back a claimed attempt that never started (the worker stopped or fenced itself off
/// as it was claimed, or it was claimed ahead and no slot freed): it leaves the running set of
/// the ledger, and the completer releases it (attempt refunded) before acking its message.
async fn release_unstarted(
    shared: &Shared,
    done: &mpsc::Sender<Finished>,
    attempt: &super::ledger::Attempt,
    id: String,
    lease: i64,
    attempts: (u32, u32),
) {
    shared.ledger.finished(&id, lease);
    let released = Finished::released(
        id,
        attempt.policy.clone(),
        lease,
        attempts,
        attempt.acker.clone(),
    );
    let _ = done.send(released).await;
}

/// How a job claimed ahead of its slot stopped waiting for one.
enum Waited {
    Slot(OwnedSemaphorePermit),
    /// No slot freed within HOLD_MAX.
    TimedOut,
    /// The attempt was stopped, or the worker drains.
    Stopped,
}

/// Jobs that ended since the producer last looked, and the bell that wakes it for them.
pub(crate) struct Freed {
    rung: Notify,
    ended: std::sync::atomic::AtomicUsize,
    /// Jobs that ended within SHORT_JOB since the last one that did not.
    short_run: std::sync::atomic::AtomicUsize,
    /// Jobs claimed ahead that wait for a slot.
    waiting: std::sync::atomic::AtomicUsize,
    /// The producer's queue (for the log).
    queue: String,
}

impl Freed {
    /// How many jobs ended since the last call.
    fn take(&self) -> usize {
        self.ended.swap(0, Ordering::AcqRel)
    }
}

/// Frees a job's slot and tells its producer when the job's task ends, however it ends (a
/// panic outside the handler's own guard included).
struct JobEnd {
    permit: Option<OwnedSemaphorePermit>,
    freed: Arc<Freed>,
    started: Instant,
}

impl Drop for JobEnd {
    fn drop(&mut self) {
        if std::thread::panicking() {
            error!(queue = %self.freed.queue, "a job task panicked");
        }
        drop(self.permit.take());
        if self.started.elapsed() <= SHORT_JOB {
            self.freed.short_run.fetch_add(1, Ordering::Relaxed);
        } else {
            self.freed.short_run.store(0, Ordering::Relaxed);
        }
        self.freed.ended.fetch_add(1, Ordering::AcqRel);
        self.freed.rung.notify_one();
    }
}

/// What a dead job keeps of a body that could not be decoded: the body itself when it is a
/// storable JSON value, else its first 4 KiB as text.
pub(crate) fn invalid_payload(body: &[u8]) -> Value {
    if let Ok(v) = serde_json::from_slice::<Value>(body) {
        if job::check_storable(&v).is_ok() && body.len() <= 64 * 1024 {
            return json!({ "invalid_body": v, "body_bytes": body.len() });
        }
    }
    let head = &body[..body.len().min(4096)];
    let text: String = String::from_utf8_lossy(head).replace('\0', "\u{FFFD}");
    json!({ "invalid_body_text": text, "body_bytes": body.len() })
}

#[cfg(test)]
mod tests {
    use super::republished;

    #[test]
    fn a_message_id_with_the_jobs_generation_marks_a_republish() {
        assert!(republished("order-1:1", "order-1"));
        assert!(republished("order-1:42", "order-1"));
        // What producers send: the id alone, another id, or a suffix that is not a generation.
        assert!(!republished("order-1", "order-1"));
        assert!(!republished("order-1:", "order-1"));
        assert!(!republished("order-1:x2", "order-1"));
        assert!(!republished("order-12:1", "order-1"));
        assert!(!republished("other:1", "order-1"));
    }
}
