//! A delivered message and what the producer reads from it.

use super::*;

/// A delivered message, where it sits in the stream, and when the stream stored it.
pub(crate) struct Delivered {
    /// Boxed as it came from the pull: a message is moved several times between its
    /// arrival and its dispatch, and a box moves as one pointer.
    pub msg: Box<async_nats::jetstream::Message>,
    pub seq: u64,
    pub stored_ns: i128,
    /// How many times JetStream has delivered it (1: the first time).
    pub(super) delivered: i64,
    /// The priority band it came from (`None`: the bare subject).
    pub band: Option<u8>,
    /// Its lane's place in the priority order (0 first).
    pub(super) rank: usize,
    /// When it reached this worker.
    pub(super) arrived: Instant,
}

impl Delivered {
    pub(super) fn new(
        msg: Box<async_nats::jetstream::Message>,
        lane: &Lane,
        rank: usize,
    ) -> Delivered {
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

    pub(super) fn acker(self) -> Arc<Acker> {
        Arc::new((*self.msg).split().1)
    }

    /// The message's own id (`<stream>-<seq>-<stored ns>`), under which it is recorded when
    /// it cannot run as the job it names.
    pub(super) fn own_id(&self, queue: &str, stream: &str) -> String {
        job::message_id(&MessageOrigin {
            queue,
            stream,
            stream_seq: self.seq,
            stored_ns: self.stored_ns,
            msg_id: None,
        })
    }

    pub(super) fn header(&self, name: &str) -> Option<String> {
        self.msg
            .headers
            .as_ref()
            .and_then(|h| h.get(name))
            .map(|v| v.as_str().to_string())
    }
}
