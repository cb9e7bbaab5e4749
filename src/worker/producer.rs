//! The Producer of one queue: pulls messages, claims them, dispatches them.
//!
//! Flow control: a message pulled from JetStream is already on its ack_wait timer and holds a
//! `max_ack_pending` slot, so we never request more than we have free slots for:
//! `requested-but-undelivered + running <= concurrency`. Several pull requests may be
//! outstanding at once (a new one goes out as soon as enough slots free up), so the pipeline
//! stays full under load, and an idle queue always has a long-poll waiting, so a new message
//! reaches a handler without polling delay.
//!
//! Every message that arrived together is claimed in one statement (`store.job_claim`), then
//! the claimed jobs are spawned; messages whose job is terminal, running elsewhere or a
//! duplicate are acked and dropped; messages that cannot become jobs are recorded as dead
//! jobs (or poison messages) and acked. Nothing is acked before its database write commits.

use super::completer::Finished;
use super::executor::{execute, Owned};
use super::{Shared, Stats};
use crate::handler::Handler;
use crate::job::{self, MessageOrigin};
use crate::store::{Claim, ClaimInput};
use async_nats::jetstream::{consumer::PullConsumer, AckKind};
use futures::stream::{BoxStream, SelectAll};
use futures::{FutureExt, StreamExt};
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, warn};

/// How long one pull request waits at the server for messages. Short on purpose: a worker
/// that is paused (SIGSTOP) but still connected keeps receiving messages for its open pull
/// requests until they expire; those messages wait out ack_wait, and their jobs are
/// republished by broker-loss reconciliation.
const PULL_EXPIRES: Duration = Duration::from_secs(5);

enum PullEvent {
    Msg(u64, Box<async_nats::jetstream::Message>),
    Failed(String),
    End(u64),
}

/// A delivered message and its stream sequence.
pub(crate) struct Delivered {
    pub body: async_nats::jetstream::Message,
    pub seq: u64,
}

pub(crate) struct Producer {
    shared: Arc<Shared>,
    queue: String,
    consumer: PullConsumer,
    handler: Arc<dyn Handler>,
    done: mpsc::Sender<Finished>,
    slots: Arc<Semaphore>,
    freed: Arc<Notify>,
    concurrency: usize,
    max_attempts: i32,
    timeout: Duration,
}

impl Producer {
    pub fn new(
        shared: Arc<Shared>,
        queue: String,
        consumer: PullConsumer,
        handler: Arc<dyn Handler>,
        done: mpsc::Sender<Finished>,
    ) -> Producer {
        let q = &shared.config.queues[&queue];
        let (concurrency, max_attempts, timeout) =
            (q.concurrency, q.max_attempts as i32, q.timeout);
        Producer {
            shared,
            queue,
            consumer,
            handler,
            done,
            slots: Arc::new(Semaphore::new(concurrency)),
            freed: Arc::new(Notify::new()),
            concurrency,
            max_attempts,
            timeout,
        }
    }

    pub async fn run(self, cancel: CancellationToken) {
        let mut pulls: SelectAll<BoxStream<'static, PullEvent>> = SelectAll::new();
        // Per outstanding pull request: messages still to come.
        let mut remaining: HashMap<u64, usize> = HashMap::new();
        let mut reserved = 0usize;
        let mut next_pull = 0u64;
        let mut jobs: JoinSet<()> = JoinSet::new();
        let batch_cap = self.shared.config.worker.claim_batch.min(self.concurrency);
        // Refill once a quarter of the slots (or one batch) is free, or at once when idle.
        let refill_at = (batch_cap / 4).max(1);
        let mut pull_backoff = Duration::ZERO;

        loop {
            // A worker fenced off from PostgreSQL takes no new work until it is back.
            let fenced = self.shared.fenced.load(std::sync::atomic::Ordering::SeqCst);
            let free = self.slots.available_permits().saturating_sub(reserved);
            if !fenced
                && free > 0
                && (free >= refill_at || pulls.is_empty())
                && pull_backoff.is_zero()
            {
                let n = free.min(batch_cap);
                match self
                    .consumer
                    .batch()
                    .max_messages(n)
                    .expires(PULL_EXPIRES)
                    // No idle heartbeat: async-nats 0.51's batch stream stops waking up after
                    // the first one, leaving later messages unread until ack_wait.
                    .messages()
                    .await
                {
                    Ok(batch) => {
                        let id = next_pull;
                        next_pull += 1;
                        reserved += n;
                        remaining.insert(id, n);
                        let s = batch
                            .map(move |m| match m {
                                Ok(m) => PullEvent::Msg(id, Box::new(m)),
                                Err(e) => PullEvent::Failed(e.to_string()),
                            })
                            .chain(futures::stream::once(async move { PullEvent::End(id) }));
                        pulls.push(s.boxed());
                        continue;
                    }
                    Err(e) => {
                        pull_backoff = Duration::from_millis(500);
                        warn!(queue = %self.queue, cause = %e, "pull request failed; retrying");
                    }
                }
            }

            let mut arrived: Vec<Delivered> = Vec::new();
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = tokio::time::sleep(pull_backoff), if !pull_backoff.is_zero() => {
                    pull_backoff = Duration::ZERO;
                }
                _ = self.freed.notified() => {}
                _ = tokio::time::sleep(Duration::from_millis(200)), if fenced => {}
                Some(_) = jobs.join_next(), if !jobs.is_empty() => {}
                Some(ev) = pulls.next(), if !pulls.is_empty() => {
                    // Take this event and every other one already waiting: they are claimed
                    // together in one statement.
                    let mut ev = Some(ev);
                    while let Some(e) = ev.take() {
                        match e {
                            PullEvent::Msg(id, m) => {
                                reserved = reserved.saturating_sub(1);
                                if let Some(r) = remaining.get_mut(&id) {
                                    *r = r.saturating_sub(1);
                                }
                                let seq = m.info().map(|i| i.stream_sequence).unwrap_or(0);
                                arrived.push(Delivered { body: *m, seq });
                            }
                            PullEvent::Failed(cause) => {
                                debug!(queue = %self.queue, %cause, "pull status");
                            }
                            PullEvent::End(id) => {
                                reserved = reserved.saturating_sub(remaining.remove(&id).unwrap_or(0));
                            }
                        }
                        if arrived.len() >= batch_cap {
                            break;
                        }
                        ev = pulls.next().now_or_never().flatten();
                    }
                }
            }
            while let Some(res) = jobs.try_join_next() {
                if let Err(e) = res {
                    if e.is_panic() {
                        error!(queue = %self.queue, "a job task panicked: {e}");
                    }
                }
            }
            if !arrived.is_empty() {
                self.claim_and_dispatch(arrived, &mut jobs).await;
            }
        }
        // Stop fetching. Messages already delivered to us go back at once (a job that exists
        // only as a message would otherwise wait out ack_wait).
        while let Some(Some(ev)) = pulls.next().now_or_never() {
            if let PullEvent::Msg(_, m) = ev {
                let _ = m.ack_with(AckKind::Nak(None)).await;
            }
        }
        drop(pulls);
        // Let running jobs finish (the worker bounds this by shutdown_grace).
        while jobs.join_next().await.is_some() {}
    }

    /// Claims one group of delivered messages and dispatches the claimed jobs.
    async fn claim_and_dispatch(&self, arrived: Vec<Delivered>, jobs: &mut JoinSet<()>) {
        let max_bytes = self.shared.config.worker.max_payload_bytes;
        let stream = self.shared.broker.stream_name().to_string();
        let mut valid: Vec<(ClaimInput, Delivered)> = Vec::with_capacity(arrived.len());
        let mut invalid: Vec<(Delivered, String, String)> = Vec::new();
        let mut duplicates: Vec<Delivered> = Vec::new();
        let mut seen = HashSet::with_capacity(arrived.len());
        for d in arrived {
            let msg_id = d
                .body
                .headers
                .as_ref()
                .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
                .map(|v| v.as_str().to_string());
            let origin = MessageOrigin {
                queue: &self.queue,
                stream: &stream,
                stream_seq: d.seq,
                msg_id: msg_id.as_deref(),
            };
            match job::decode(&d.body.payload, &origin, max_bytes) {
                Ok(job) => {
                    if seen.insert(job.id.clone()) {
                        let max_attempts = job.max_attempts.unwrap_or(self.max_attempts);
                        let traceparent = d
                            .body
                            .headers
                            .as_ref()
                            .and_then(|h| h.get("traceparent"))
                            .map(|v| v.as_str().to_string());
                        valid.push((
                            ClaimInput {
                                job,
                                max_attempts,
                                traceparent,
                            },
                            d,
                        ));
                    } else {
                        duplicates.push(d);
                    }
                }
                Err(e) => {
                    let id = format!("{stream}-{}", d.seq);
                    invalid.push((d, id, e.to_string()));
                }
            }
        }
        if valid.is_empty() {
            if !invalid.is_empty() {
                record_invalid(&self.shared, &self.queue, invalid, false).await;
            }
            self.drop_messages(duplicates).await;
            return;
        }
        let inputs: Vec<ClaimInput> = valid.iter().map(|(c, _)| c.clone()).collect();
        // A worker fenced off (or declared dead) claims nothing: hand the messages back.
        let fenced = self.shared.fenced.load(std::sync::atomic::Ordering::SeqCst);
        let claims = if fenced {
            None
        } else {
            self.claim(&inputs).await
        };
        let Some(claims) = claims else {
            // Not claimed, not acked: hand the messages back for a later try.
            let msgs = valid
                .into_iter()
                .map(|(_, d)| d)
                .chain(duplicates)
                .chain(invalid.into_iter().map(|(d, _, _)| d));
            for d in msgs {
                let _ = d
                    .body
                    .ack_with(AckKind::Nak(Some(Duration::from_secs(1))))
                    .await;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            return;
        };
        let mut pairs = Vec::with_capacity(valid.len());
        for ((input, d), claim) in valid.into_iter().zip(claims) {
            let reason = match claim {
                Ok(Claim::WrongQueue(other)) => format!(
                    "id {:?} belongs to a job of queue {other}; give this job another id",
                    input.job.id
                ),
                Ok(c) => {
                    pairs.push((input, d, c));
                    continue;
                }
                Err(reason) => reason,
            };
            let id = format!("{stream}-{}", d.seq);
            invalid.push((d, id, reason));
        }
        for (input, d, claim) in pairs {
            match claim {
                Claim::Claimed {
                    lease,
                    attempt,
                    max_attempts,
                    timeout_ms,
                    payload,
                    backoff,
                    traceparent,
                } => {
                    // The pull accounting guarantees a free slot; waiting (rather than
                    // failing) keeps the job safe even if that ever stopped being true.
                    let permit = self
                        .slots
                        .clone()
                        .acquire_owned()
                        .await
                        .expect("the slot semaphore is never closed");
                    Stats::add(&self.shared.stats.claimed, 1);
                    self.shared
                        .owned
                        .lock()
                        .expect("owned lock")
                        .insert(input.job.id.clone(), lease);
                    // An older attempt of this job still running here was taken away (it
                    // was reclaimed, and we just claimed it again): stop it.
                    if let Some(old) = self
                        .shared
                        .inflight
                        .lock()
                        .expect("inflight lock")
                        .get(&input.job.id)
                    {
                        if old.lease != lease {
                            old.stop
                                .store(super::STOP_LOST, std::sync::atomic::Ordering::SeqCst);
                            old.cancel.cancel();
                        }
                    }
                    let traceparent = traceparent.or(input.traceparent);
                    let (_, acker) = d.body.split();
                    let owned = Owned {
                        id: input.job.id,
                        queue: self.queue.clone(),
                        lease,
                        attempt: attempt.max(1) as u32,
                        max_attempts: max_attempts.max(1) as u32,
                        timeout: timeout_ms
                            .map(|ms| Duration::from_millis(ms.max(1) as u64))
                            .unwrap_or(self.timeout),
                        payload: payload.unwrap_or(input.job.payload),
                        backoff: backoff.or(input.job.backoff),
                        traceparent,
                        acker: Arc::new(acker),
                    };
                    jobs.spawn(run_with_permit(
                        self.shared.clone(),
                        self.handler.clone(),
                        owned,
                        self.done.clone(),
                        permit,
                        self.freed.clone(),
                    ));
                }
                Claim::NotClaimable(status) => {
                    debug!(job.id = %input.job.id, %status, "message for a job that is not claimable; acked and dropped");
                    duplicates.push(d);
                }
                Claim::Duplicate | Claim::WrongQueue(_) => duplicates.push(d),
            }
        }
        self.drop_messages(duplicates).await;
        // Only now, with every claimed job recorded as owned and running.
        if !invalid.is_empty() {
            record_invalid(&self.shared, &self.queue, invalid, false).await;
        }
    }

    /// Claims a group. When one message's data makes PostgreSQL reject the whole statement
    /// (a value it cannot store), claims them one by one so only that message is rejected,
    /// with PostgreSQL's reason. `None` when the database is unavailable.
    async fn claim(&self, inputs: &[ClaimInput]) -> Option<Vec<Result<Claim, String>>> {
        let store = &self.shared.store;
        let me = &self.shared.worker_id;
        match store.job_claim(me, inputs).await {
            Ok(c) => return Some(c.into_iter().map(|(_, c)| Ok(c)).collect()),
            Err(e) if e.rejected_data().is_none() => {
                warn!(queue = %self.queue, cause = %e, n = inputs.len(), "claim failed; messages returned to the stream");
                return None;
            }
            Err(_) => {}
        }
        let mut out = Vec::with_capacity(inputs.len());
        for input in inputs {
            match store.job_claim(me, std::slice::from_ref(input)).await {
                Ok(mut c) => out.push(Ok(c.remove(0).1)),
                Err(e) => match e.rejected_data() {
                    Some(reason) => {
                        out.push(Err(format!("PostgreSQL cannot store this job: {reason}")))
                    }
                    None => return None,
                },
            }
        }
        Some(out)
    }

    /// Acks messages whose jobs need nothing from us (Postgres already holds their state).
    async fn drop_messages(&self, msgs: Vec<Delivered>) {
        Stats::add(&self.shared.stats.dropped, msgs.len() as u64);
        for d in msgs {
            let _ = d.body.ack().await;
        }
    }
}

/// Records messages that cannot become jobs, then acks them: as dead jobs with the reason
/// when possible, in `poison_messages` otherwise. If even that fails they are nak'd and
/// come back later; nothing is dropped without a record (invariant 9).
pub(crate) async fn record_invalid(
    shared: &Shared,
    queue: &str,
    items: Vec<(Delivered, String, String)>,
    confirm_acks: bool,
) {
    let store = &shared.store;
    let me = &shared.worker_id;
    let rows: Vec<(String, String, Value, String)> = items
        .iter()
        .map(|(d, id, reason)| {
            (
                id.clone(),
                queue.to_string(),
                invalid_payload(&d.body.payload),
                reason.clone(),
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
    for (d, id, reason) in items {
        let recorded = inserted.contains(&id)
            || store
                .poison_insert(
                    me,
                    d.body.subject.as_str(),
                    Some(d.seq as i64),
                    &reason,
                    &d.body.payload,
                )
                .await
                .is_ok();
        if recorded {
            Stats::add(&shared.stats.invalid, 1);
            warn!(queue = %queue, nats.seq = d.seq, job.id = %id, %reason, "invalid message recorded and acked");
            let acked = if confirm_acks {
                d.body.double_ack().await
            } else {
                d.body.ack().await
            };
            if let Err(e) = acked {
                warn!(nats.seq = d.seq, cause = %e, "ack of a recorded invalid message failed");
            }
        } else {
            let _ = d
                .body
                .ack_with(AckKind::Nak(Some(Duration::from_secs(5))))
                .await;
        }
    }
}

/// Runs a job holding its slot; the slot frees (and the producer hears of it) at the end.
async fn run_with_permit(
    shared: Arc<Shared>,
    handler: Arc<dyn Handler>,
    job: Owned,
    done: mpsc::Sender<Finished>,
    permit: OwnedSemaphorePermit,
    freed: Arc<Notify>,
) {
    execute(shared, handler, job, done).await;
    drop(permit);
    freed.notify_one();
}

/// What a dead job keeps of a body that could not be decoded: the body itself when it is a
/// storable JSON value, else its first 4 KiB as text.
fn invalid_payload(body: &[u8]) -> Value {
    if let Ok(v) = serde_json::from_slice::<Value>(body) {
        if job::check_storable(&v).is_ok() && body.len() <= 64 * 1024 {
            return json!({ "invalid_body": v, "body_bytes": body.len() });
        }
    }
    let head = &body[..body.len().min(4096)];
    let text: String = String::from_utf8_lossy(head).replace('\0', "\u{FFFD}");
    json!({ "invalid_body_text": text, "body_bytes": body.len() })
}
