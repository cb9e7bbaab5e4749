//! Outbound: the fire-and-forget traffic to NATS — acks, naks, in-progress acks, dead-letter
//! events — sent by one task from a bounded queue, each send bounded in time.
//!
//! Nothing that settles jobs in PostgreSQL ever waits on NATS (the completer, the producer,
//! progress reports only enqueue here). The async-nats client buffers a limited number of
//! commands while it is disconnected, and a send then waits until it reconnects; here such a
//! wait ends after [`SEND_LIMIT`], and once the queue is full the overflow is dropped and
//! counted. A lost ack costs nothing but time: JetStream redelivers the message after
//! ack_wait and the claim finds the job settled (commit, then ack — invariant 3). A lost
//! in-progress ack is made up by the next one; a lost dead-letter event leaves the dead job
//! in PostgreSQL, which is the record.

use super::Stats;
use async_nats::jetstream::message::Acker;
use async_nats::jetstream::AckKind;
use bytes::Bytes;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, warn};

/// The message a job came by, to ack when it is settled (and to mark in progress while it
/// runs); `None` for a job a keyed queue took from PostgreSQL, which has none (its message
/// was acked when the job was parked).
pub(crate) type JobAck = Option<Arc<Acker>>;

/// Items waiting to be sent.
const QUEUE: usize = 16_384;
/// Longest one send may wait for the client (it blocks while disconnected with a full buffer).
pub(crate) const SEND_LIMIT: Duration = Duration::from_secs(1);

enum Out {
    Ack(Arc<Acker>, AckKind),
    Event {
        subject: String,
        body: Bytes,
    },
    /// Answered once everything queued before it was handed to the client.
    Flush(oneshot::Sender<()>),
}

pub(crate) struct Outbound {
    tx: mpsc::Sender<Out>,
    stats: Arc<Stats>,
}

impl Outbound {
    /// The handle, and the task that sends (spawn it; it ends when every handle is gone).
    pub fn new(
        client: async_nats::Client,
        stats: Arc<Stats>,
    ) -> (Outbound, impl std::future::Future<Output = ()>) {
        let (tx, rx) = mpsc::channel(QUEUE);
        (
            Outbound {
                tx,
                stats: stats.clone(),
            },
            run(client, rx, stats),
        )
    }

    /// Acks (or naks, or marks in progress) a delivery, in the background.
    pub fn ack(&self, acker: &Arc<Acker>, kind: AckKind) {
        self.push(Out::Ack(acker.clone(), kind));
    }

    /// Acks (or naks, or marks in progress) a job's message, if it came by one.
    pub fn ack_job(&self, acker: &JobAck, kind: AckKind) {
        if let Some(a) = acker {
            self.ack(a, kind);
        }
    }

    /// Publishes a core NATS event (not into the work stream), in the background.
    pub fn event(&self, subject: String, body: Bytes) {
        self.push(Out::Event { subject, body });
    }

    /// Waits (at most `limit`) until everything queued so far was handed to the client,
    /// then flushes the client: for a clean shutdown.
    pub async fn flush(&self, client: &async_nats::Client, limit: Duration) {
        let (tx, rx) = oneshot::channel();
        let done = async {
            if self.tx.send(Out::Flush(tx)).await.is_ok() {
                let _ = rx.await;
            }
            let _ = client.flush().await;
        };
        if tokio::time::timeout(limit, done).await.is_err() {
            warn!("some acks were not sent before shutdown; their messages are redelivered after ack_wait and found settled");
        }
    }

    fn push(&self, out: Out) {
        if let Err(e) = self.tx.try_send(out) {
            Stats::add(&self.stats.acks_dropped, 1);
            if matches!(e, mpsc::error::TrySendError::Full(_)) {
                debug!("outbound queue full (NATS unreachable?): dropped");
            }
        }
    }
}

async fn run(client: async_nats::Client, mut rx: mpsc::Receiver<Out>, stats: Arc<Stats>) {
    while let Some(out) = rx.recv().await {
        let sent = match out {
            Out::Ack(acker, kind) => tokio::time::timeout(SEND_LIMIT, acker.ack_with(kind))
                .await
                .map(|r| r.map_err(|e| e.to_string())),
            Out::Event { subject, body } => {
                tokio::time::timeout(SEND_LIMIT, client.publish(subject, body))
                    .await
                    .map(|r| r.map_err(|e| e.to_string()))
            }
            Out::Flush(done) => {
                let _ = done.send(());
                continue;
            }
        };
        match sent {
            Ok(Ok(())) => {}
            Ok(Err(cause)) => {
                Stats::add(&stats.acks_dropped, 1);
                debug!(%cause, "outbound send failed");
            }
            Err(_) => {
                Stats::add(&stats.acks_dropped, 1);
                debug!("outbound send timed out (NATS unreachable?)");
            }
        }
    }
}
