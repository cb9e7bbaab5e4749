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

/// Takes up to `want` loosely held slots back from the open watches; returns how many.
pub(super) fn unreserve_watches(open: &mut HashMap<u64, Pull>, want: usize) -> usize {
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

impl Producer {
    /// Sends a pull request for up to `n` messages to lane `i` (bounded in time): a work
    /// pull takes what the lane holds now and ends (`no_wait`); a long poll (doorbell or
    /// watch) waits up to [`PULL_EXPIRES`] for its messages.
    pub(super) async fn send_pull(
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
}
