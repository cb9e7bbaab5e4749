//! Pull requests: what each outstanding one is for, how many slots it holds, and its
//! messages as a stream of events.

use super::*;

/// A pull's messages as events tagged with the pull's id, ending with `End`. A pull that
/// hears nothing from the server for `idle` ends too: a request the server never answers
/// (it hung, or restarted and forgot it) must not hold its slots forever.
pub(super) fn tag(
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

pub(super) enum PullEvent {
    Msg(u64, Box<async_nats::jetstream::Message>),
    Failed(String),
    End(u64),
}

/// What an outstanding pull request is for.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum PullKind {
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
pub(super) struct Pull {
    /// Messages still to come.
    pub(super) remaining: usize,
    /// Slots still held for it.
    pub(super) reserved: usize,
    pub(super) bytes: u64,
    /// The lane it was sent to (an index into `Producer::lanes`).
    pub(super) lane: usize,
    pub(super) kind: PullKind,
}

/// The outstanding pull requests and the slots they hold, kept consistent in one place:
/// `reserved` is the sum of the pulls' held slots, `loose` the part of it watches hold, and
/// `work` the number of open work pulls. Every change goes through a method here.
#[derive(Default)]
pub(super) struct PullBook {
    open: HashMap<u64, Pull>,
    reserved: usize,
    loose: usize,
    work: usize,
    next_id: u64,
}

/// What became of a pull's message in the book.
pub(super) struct Arrival {
    /// The lane it came by.
    pub(super) lane: usize,
    /// A slot was held for it (else it came by a doorbell, or a watch that had given its
    /// slots up).
    pub(super) with_slot: bool,
}

impl PullBook {
    /// Slots held by open pulls (doorbells hold none).
    pub(super) fn reserved(&self) -> usize {
        self.reserved
    }

    /// The part of [`PullBook::reserved`] that watches hold loosely (a message of another
    /// lane may take it).
    pub(super) fn loose(&self) -> usize {
        self.loose
    }

    /// Open work pulls.
    pub(super) fn work_pulls(&self) -> usize {
        self.work
    }

    /// The lane pull `id` was sent to, while it is open.
    pub(super) fn lane_of(&self, id: u64) -> Option<usize> {
        self.open.get(&id).map(|p| p.lane)
    }

    /// Records a pull just sent to `lane` for `n` messages; returns its id. A work pull holds
    /// a slot per message, a watch holds them loosely, a doorbell holds none.
    pub(super) fn opened(&mut self, lane: usize, kind: PullKind, n: usize) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let reserve = match kind {
            PullKind::Work => {
                self.work += 1;
                n
            }
            PullKind::Watch => {
                self.loose += n;
                n
            }
            PullKind::Doorbell => 0,
        };
        self.reserved += reserve;
        self.open.insert(
            id,
            Pull {
                remaining: n,
                reserved: reserve,
                bytes: 0,
                lane,
                kind,
            },
        );
        id
    }

    /// Takes up to `want` loosely held slots back from the open watches (for messages of a
    /// lane with work); returns how many.
    pub(super) fn take_from_watches(&mut self, want: usize) -> usize {
        let mut taken = 0;
        for p in self.open.values_mut().filter(|p| p.kind == PullKind::Watch) {
            if taken == want {
                break;
            }
            let k = p.reserved.min(want - taken);
            p.reserved -= k;
            taken += k;
        }
        self.reserved -= taken;
        self.loose -= taken;
        taken
    }

    /// A message of pull `id`, `bytes` long, arrived: it takes one of the pull's slots if
    /// it holds one. `None` when the pull is not open (any more).
    pub(super) fn message(&mut self, id: u64, bytes: u64) -> Option<Arrival> {
        let p = self.open.get_mut(&id)?;
        let with_slot = p.reserved > 0;
        if with_slot {
            p.reserved -= 1;
            self.reserved -= 1;
            if p.kind == PullKind::Watch {
                self.loose -= 1;
            }
        }
        p.remaining = p.remaining.saturating_sub(1);
        p.bytes += bytes;
        Some(Arrival {
            lane: p.lane,
            with_slot,
        })
    }

    /// Pull `id` ended: the slots it still held are free again. Returns it, for what its
    /// end says about its lane.
    pub(super) fn ended(&mut self, id: u64) -> Option<Pull> {
        let p = self.open.remove(&id)?;
        self.reserved -= p.reserved;
        match p.kind {
            PullKind::Watch => self.loose -= p.reserved,
            PullKind::Work => self.work -= 1,
            PullKind::Doorbell => {}
        }
        Some(p)
    }
}

impl Producer {
    /// Sends a work pull to the lane whose turn it is, when there is room enough (or none is
    /// open). Returns whether it sent one and the loop should look again at once.
    pub(super) async fn pull_work(&mut self, room: Room) -> bool {
        let wanted = room.free_for_work >= self.refill_at || self.book.work_pulls() == 0;
        if room.free_for_work == 0
            || !wanted
            || !self.pull_backoff.is_zero()
            || !self.lanes.iter().any(|l| l.hot)
        {
            return false;
        }
        let mut n = room.free_for_work.min(self.batch_cap);
        // Under a cap or rate limit: only as many as there are grants for (the open pulls'
        // messages have theirs).
        if let Some(flow) = self.flow.as_mut() {
            let reserved = self.book.reserved();
            let held = flow.reserve(reserved + n).await;
            n = n.min(held.saturating_sub(reserved));
        }
        let Some(i) = (n > 0).then(|| self.next_lane()).flatten() else {
            return false;
        };
        match self.send_pull(i, n, self.pull_bytes, false).await {
            Ok(stream) => {
                self.pull_outage.ok();
                self.book.take_from_watches(n.saturating_sub(room.free));
                let id = self.book.opened(i, PullKind::Work, n);
                self.watch_pull(stream, id, i, BROKER_CALL_LIMIT);
                true
            }
            Err(e) => {
                self.pull_failed(i, e).await;
                false
            }
        }
    }

    /// Every lane that looked empty keeps a doorbell open, so a message on any lane is seen
    /// at once, whatever the others hold; the watched lane a watch over the free slots, when
    /// there are any.
    pub(super) async fn open_long_polls(&mut self) {
        if !self.pull_backoff.is_zero() {
            return;
        }
        for i in 0..self.lanes.len() {
            if self.lanes[i].hot || self.lanes[i].doorbell {
                continue;
            }
            let free = self.free_slots().saturating_sub(self.book.reserved());
            let (kind, n) = if self.watched == Some(i) && free > 0 {
                (PullKind::Watch, free.min(self.batch_cap))
            } else {
                (PullKind::Doorbell, 1)
            };
            match self.send_pull(i, n, self.pull_bytes, true).await {
                Ok(stream) => {
                    self.pull_outage.ok();
                    let id = self.book.opened(i, kind, n);
                    self.lanes[i].doorbell = true;
                    self.watch_pull(stream, id, i, PULL_EXPIRES + BROKER_CALL_LIMIT);
                }
                Err(e) => {
                    self.pull_failed(i, e).await;
                    break;
                }
            }
        }
    }

    /// Adds a pull's messages to the events the loop waits for.
    pub(super) fn watch_pull(
        &mut self,
        batch: async_nats::jetstream::consumer::pull::Batch,
        id: u64,
        lane: usize,
        idle: Duration,
    ) {
        let name = self.lanes[lane].lane.to_string().into();
        self.pulls.push(tag(batch, id, idle, name));
    }

    /// A pull request the server did not take: back off, and make sure the lane's consumer
    /// still exists.
    pub(super) async fn pull_failed(&mut self, i: usize, e: String) {
        let cause = format!("pull request on {} failed: {e}", self.lanes[i].lane);
        self.pull_backoff = self
            .pull_outage
            .failed(&cause)
            .max(Duration::from_millis(500));
        self.check_consumer(i, true).await;
    }

    /// Takes `ev` and every other pull event already waiting (up to a claim group's worth):
    /// their messages are claimed together in one statement.
    pub(super) fn take_events(&mut self, ev: PullEvent) -> Arrivals {
        let mut got = Arrivals::default();
        let mut ev = Some(ev);
        while let Some(e) = ev.take() {
            match e {
                PullEvent::Msg(id, m) => {
                    let Some(a) = self.book.message(id, m.length as u64) else {
                        continue;
                    };
                    let lane = &mut self.lanes[a.lane];
                    // One that came without a slot: the lane has work, and its priority
                    // decides what runs next.
                    if !a.with_slot {
                        lane.hot = true;
                    }
                    let d = Delivered::new(m, &lane.lane, a.lane);
                    if a.with_slot {
                        got.arrived.push(d);
                    } else {
                        got.slotless.push(d);
                    }
                }
                PullEvent::Failed(cause) => {
                    debug!(queue = %self.policy.name, %cause, "pull status");
                }
                PullEvent::End(id) => {
                    if let Some(p) = self.book.ended(id) {
                        self.pull_ended(&p, &mut got);
                    }
                }
            }
            if got.arrived.len() + got.slotless.len() >= self.batch_cap {
                break;
            }
            ev = self.pulls.next().now_or_never().flatten();
        }
        got
    }

    /// What a pull's end says about its lane.
    pub(super) fn pull_ended(&mut self, p: &Pull, got: &mut Arrivals) {
        let lane = &mut self.lanes[p.lane];
        match p.kind {
            PullKind::Doorbell => lane.doorbell = false,
            PullKind::Watch => {
                lane.doorbell = false;
                // Filled: more may be waiting.
                if p.remaining == 0 {
                    lane.hot = true;
                }
            }
            // Ended short: the lane ran dry; a doorbell or a watch looks after it.
            PullKind::Work if p.remaining > 0 => lane.hot = false,
            PullKind::Work => {}
        }
        self.shared
            .stats
            .largest_pull_bytes
            .fetch_max(p.bytes, Ordering::Relaxed);
        if p.bytes == 0 {
            got.empty_ended.push(p.lane);
        }
    }

    /// Sends a pull request for up to `n` messages to lane `i` (bounded in time): a work
    /// pull takes what the lane holds now and ends (`no_wait`); a long poll (doorbell or
    /// watch) waits up to [`PULL_EXPIRES`] for its messages.
    pub(super) async fn send_pull(
        &mut self,
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
}

#[cfg(test)]
mod tests {
    use super::{PullBook, PullKind};
    use proptest::prelude::*;

    /// The book's totals, counted again from its pulls.
    fn recount(b: &PullBook) -> (usize, usize, usize) {
        let reserved = b.open.values().map(|p| p.reserved).sum();
        let loose = b
            .open
            .values()
            .filter(|p| p.kind == PullKind::Watch)
            .map(|p| p.reserved)
            .sum();
        let work = b.open.values().filter(|p| p.kind == PullKind::Work).count();
        (reserved, loose, work)
    }

    #[derive(Debug, Clone)]
    enum Op {
        Open(usize, u8, usize),
        Take(usize),
        Message(u64),
        End(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..3usize, 0..3u8, 0..20usize).prop_map(|(l, k, n)| Op::Open(l, k, n)),
            (0..30usize).prop_map(Op::Take),
            (0..12u64).prop_map(Op::Message),
            (0..12u64).prop_map(Op::End),
        ]
    }

    proptest! {
        /// Whatever happens in whatever order, the totals are those of the open pulls, and
        /// no slot is handed out twice.
        #[test]
        fn the_totals_always_match_the_open_pulls(ops in proptest::collection::vec(op(), 0..60)) {
            let mut b = PullBook::default();
            for op in ops {
                match op {
                    Op::Open(lane, k, n) => {
                        let kind = [PullKind::Work, PullKind::Watch, PullKind::Doorbell][k as usize];
                        b.opened(lane, kind, n);
                    }
                    Op::Take(want) => {
                        let loose = b.loose();
                        let taken = b.take_from_watches(want);
                        prop_assert_eq!(taken, want.min(loose));
                    }
                    Op::Message(id) => {
                        let before = b.reserved();
                        if let Some(a) = b.message(id, 10) {
                            prop_assert_eq!(b.reserved(), before - usize::from(a.with_slot));
                        }
                    }
                    Op::End(id) => {
                        b.ended(id);
                        prop_assert!(b.lane_of(id).is_none());
                    }
                }
                prop_assert_eq!((b.reserved(), b.loose(), b.work_pulls()), recount(&b));
            }
        }
    }

    #[test]
    fn a_work_pull_holds_a_slot_per_message_a_watch_loosely_a_doorbell_none() {
        let mut b = PullBook::default();
        let work = b.opened(0, PullKind::Work, 3);
        let watch = b.opened(1, PullKind::Watch, 4);
        let bell = b.opened(2, PullKind::Doorbell, 1);
        assert_eq!((b.reserved(), b.loose(), b.work_pulls()), (7, 4, 1));
        // The doorbell's message comes without a slot; a work pull's with one.
        assert!(!b.message(bell, 5).unwrap().with_slot);
        assert!(b.message(work, 5).unwrap().with_slot);
        assert_eq!(b.reserved(), 6);
        // Another lane's messages take the watch's slots, and no more than it holds.
        assert_eq!(b.take_from_watches(10), 4);
        assert_eq!((b.reserved(), b.loose()), (2, 0));
        assert!(!b.message(watch, 5).unwrap().with_slot);
        // A pull that ends frees what it still held.
        let p = b.ended(work).unwrap();
        assert_eq!((p.remaining, p.bytes), (2, 5));
        assert_eq!((b.reserved(), b.work_pulls()), (0, 0));
        assert!(
            b.message(work, 5).is_none(),
            "an ended pull takes no message"
        );
    }
}
