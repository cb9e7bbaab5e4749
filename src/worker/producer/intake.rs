//! The way in from a pull to a claim: the events a pull brought, the messages that wait for
//! a slot (`held`) and go back when none frees, what is ready to claim, and the grants of a
//! capped or rate-limited queue.

use super::*;

impl Producer {
    /// Held messages first — those of the highest lane that has work; one of a lower lane
    /// waits (and goes back after HOLD_MAX), so priorities stay strict. Returns whether it
    /// admitted some and the loop should look again at once.
    pub(super) async fn admit_held(&mut self, room: Room) -> bool {
        if room.free_for_work == 0 || self.held.is_empty() {
            return false;
        }
        let best_hot = self.best_hot();
        self.held.sort_by_key(|(d, _)| d.rank);
        let n = self
            .held
            .iter()
            .take_while(|(d, _)| d.rank <= best_hot)
            .count()
            .min(room.free_for_work);
        if n == 0 {
            return false;
        }
        self.book.take_from_watches(n.saturating_sub(room.free));
        let take: Vec<Delivered> = self.held.drain(..n).map(|(d, _)| d).collect();
        let before = self.held.len();
        self.admit(take).await;
        // Unless messages went back to wait for grants (then on to the timers).
        self.held.len() <= before
    }

    /// Held messages that waited HOLD_MAX (all of them when fenced) go back to the stream.
    pub(super) fn send_back_held(&mut self, fenced: bool) {
        if self.held.is_empty() {
            return;
        }
        let now = Instant::now();
        let (back, keep): (Vec<_>, Vec<_>) = self
            .held
            .drain(..)
            .partition(|(_, at)| fenced || now.duration_since(*at) >= HOLD_MAX);
        self.held = keep;
        for (d, _) in back {
            // Every slot is busy: back to the stream; the lane stays hot, so it is pulled
            // from as soon as a slot frees.
            if let Some(l) = self.lanes.get_mut(d.rank) {
                l.hot = true;
            }
            self.shared.outbound.ack(&d.acker(), AckKind::Nak(None));
        }
    }

    /// Places the messages that arrived: ready to claim when a slot is theirs, held when
    /// not. A pull that brought nothing may mean its consumer is gone.
    pub(super) async fn take_in(&mut self, got: Arrivals) {
        let Arrivals {
            mut arrived,
            slotless,
            empty_ended,
        } = got;
        if !slotless.is_empty() {
            // A message that came without a slot never takes a free one from a
            // higher-priority lane that has work: that lane's next pull gets the slot. It
            // waits with the held ones (and goes back to the stream after HOLD_MAX).
            let best_hot = self.best_hot();
            let now = Instant::now();
            for d in slotless {
                if d.rank > best_hot {
                    self.held.push((d, now));
                } else {
                    arrived.push(d);
                }
            }
        }
        if !arrived.is_empty() {
            // A work pull's messages have their slots (a watch's, those it still held); a
            // doorbell's only if one is free.
            arrived.sort_by_key(|d| d.rank);
            let room = self.free_slots().saturating_sub(self.book.reserved());
            if arrived.len() > room {
                let now = Instant::now();
                self.held.extend(arrived.drain(room..).map(|d| (d, now)));
            }
            self.ready.append(&mut arrived);
        } else {
            for i in empty_ended {
                self.check_consumer(i, false).await;
            }
        }
    }

    /// Claims what is ready while a statement may go out (a queue under a cap or rate limit
    /// claims one group at a time, inside `admit`). Highest priority first (a stable sort:
    /// arrival order within a lane); taking from the front keeps the rest sorted.
    pub(super) async fn claim_ready(&mut self) {
        self.ready.sort_by_key(|d| d.rank);
        while !self.ready.is_empty() && self.pending.len() < CLAIMS_IN_FLIGHT {
            let take = self.ready.len().min(self.batch_cap);
            let group: Vec<Delivered> = self.ready.drain(..take).collect();
            self.admit(group).await;
        }
    }

    /// Claims messages of a queue without limits at once; under a cap or rate limit only as
    /// many as it holds grants for (the rest wait in `held`, highest priority first). The
    /// grants go with the claim, which spends them when its answer is taken in.
    pub(super) async fn admit(&mut self, mut msgs: Vec<Delivered>) {
        let Some(flow) = self.flow.as_mut() else {
            self.start_claim(msgs, 0).await;
            return;
        };
        let granted = flow.reserve(msgs.len()).await;
        if msgs.len() > granted {
            msgs.sort_by_key(|d| d.rank);
            self.held.extend(msgs.drain(granted..).map(|d| {
                let at = d.arrived;
                (d, at)
            }));
        }
        if msgs.is_empty() {
            return;
        }
        flow.claiming(msgs.len());
        let n = msgs.len();
        self.start_claim(msgs, n).await;
    }
}
