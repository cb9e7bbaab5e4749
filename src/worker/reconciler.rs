//! The Reconciler keeps the stream and PostgreSQL in step for this worker's queues, in both
//! directions:
//!
//! - **Adoption** (every `adopt_after`): a message delivered to a worker that stopped before
//!   claiming it — killed, paused, or shut down with pull requests still open — has no row,
//!   and JetStream would redeliver it only after `ack_wait` (10 minutes by default). The
//!   adopter reads the messages the queue's consumer has delivered and not seen acked,
//!   straight from the stream (the work-queue stream still holds every unacked message),
//!   derives each one's job id exactly as the claim would, and adopts those that have had no
//!   row for two rounds in a row as jobs due now; the scheduler publishes them at once. A
//!   live worker claiming one of them at the same moment finds the same row: one job either
//!   way (invariant 11). The original message, when JetStream redelivers it, finds its job.
//! - **Broker-loss repair** (every `sweep_every`): a `queued` job whose message cannot be in
//!   the stream any more — its publish was never confirmed, the consumer has delivered its
//!   sequence already (a live fetcher would have claimed it), it was purged, or the stream
//!   was created again since — is republished after `broker_lost_after`. Jobs whose message
//!   still waits in a backlog are never touched, so this works under any load.

use super::outage::Outage;
use super::{Shared, Stats};
use crate::broker::{Lane, StoredMessage, StreamPosition};
use crate::job::DEFAULT_PRIORITY;
use crate::job::{self, MessageOrigin};
use crate::store::ClaimInput;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// Most delivered messages read from the stream per queue and round.
const ADOPT_SCAN: usize = 2000;
/// Most jobs republished per queue and round.
const REPAIR_LIMIT: i64 = 1000;

pub(crate) struct Reconciler {
    shared: Arc<Shared>,
    /// Per queue: stream sequences seen delivered without a row in the last round.
    rowless: HashMap<String, HashSet<u64>>,
}

impl Reconciler {
    pub fn new(shared: Arc<Shared>) -> Reconciler {
        Reconciler {
            shared,
            rowless: HashMap::new(),
        }
    }

    pub async fn run(mut self, cancel: CancellationToken) {
        let w = self.shared.config.worker.clone();
        let tick = w.adopt_after.min(w.sweep_every);
        let mut outage = Outage::new("adoption and broker-loss repair");
        let mut last_adopt = Instant::now();
        let mut last_repair = Instant::now();
        let mut wait = tick;
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            let mut round: Result<(), String> = Ok(());
            if last_adopt.elapsed() >= w.adopt_after {
                last_adopt = Instant::now();
                round = self.adopt_once().await.map(|_| ());
            }
            if round.is_ok() && last_repair.elapsed() >= w.sweep_every {
                last_repair = Instant::now();
                round = self.repair_once().await.map(|_| ());
            }
            wait = match round {
                Ok(()) => {
                    outage.ok();
                    tick
                }
                Err(e) => outage.failed(&e).max(tick),
            };
        }
    }

    /// One adoption round over this worker's queues; returns how many jobs were adopted.
    pub async fn adopt_once(&mut self) -> Result<usize, String> {
        let lanes = self.shared.lanes.clone();
        let mut total = 0;
        for lane in &lanes {
            total += self.adopt_lane(lane).await?;
        }
        Ok(total)
    }

    async fn adopt_lane(&mut self, lane: &Lane) -> Result<usize, String> {
        let shared = self.shared.clone();
        // A paused queue's messages wait in the stream, delivered or not, until the resume.
        if shared.paused(&lane.queue) {
            self.rowless.remove(&lane.consumer_name());
            return Ok(0);
        }
        let broker = &shared.broker;
        let key = lane.consumer_name();
        let pos = broker
            .stream_position(lane)
            .await
            .map_err(|e| e.to_string())?;
        if pos.ack_pending == 0 {
            self.rowless.remove(&key);
            return Ok(0);
        }
        let (candidates, seqs, unreadable) = self.delivered_unacked(lane, &pos).await?;
        let taken_out = self.take_out(lane, unreadable).await?;
        if candidates.is_empty() {
            self.rowless.remove(&key);
            return Ok(0);
        }
        let queue = lane.queue.as_str();
        let ids: Vec<&str> = candidates.iter().map(|c| c.job.id.as_str()).collect();
        let existing: HashSet<String> = shared
            .store
            .jobs_existing(&ids)
            .await
            .map_err(|e| e.to_string())?
            .into_iter()
            .collect();
        let seen_before = self.rowless.remove(&key).unwrap_or_default();
        let mut now_rowless = HashSet::new();
        let mut adopt = Vec::new();
        let mut adopt_seqs = Vec::new();
        for (c, seq) in candidates.into_iter().zip(seqs) {
            if existing.contains(&c.job.id) {
                continue;
            }
            if seen_before.contains(&seq) {
                adopt.push(c);
                adopt_seqs.push(Some(seq.min(i64::MAX as u64) as i64));
            } else {
                now_rowless.insert(seq);
            }
        }
        self.rowless.insert(key, now_rowless);
        if adopt.is_empty() {
            return Ok(taken_out);
        }
        let adopted = match shared.store.job_adopt(&adopt, &adopt_seqs).await {
            Ok(ids) => ids,
            // One message PostgreSQL cannot store must not hold back the others: one by one
            // (that one is recorded as invalid when JetStream redelivers it).
            Err(e) if e.rejected_data().is_some() => {
                let mut ids = Vec::new();
                for (one, seq) in adopt.chunks(1).zip(adopt_seqs.chunks(1)) {
                    match shared.store.job_adopt(one, seq).await {
                        Ok(mut got) => ids.append(&mut got),
                        Err(e) if e.rejected_data().is_some() => {}
                        Err(e) => return Err(e.to_string()),
                    }
                }
                ids
            }
            Err(e) => return Err(e.to_string()),
        };
        if !adopted.is_empty() {
            Stats::add(&shared.stats.adopted, adopted.len() as u64);
            warn!(%queue, jobs = adopted.len(), first = %adopted[0],
                  "adopted messages a worker fetched but never claimed (it stopped); they run again now");
            self.delete_adopted(lane, &adopt, &adopt_seqs, &adopted)
                .await;
        }
        Ok(adopted.len())
    }

    /// An ordered queue's adopted messages go from the stream once their rows committed: a
    /// key's later jobs wait for every message before them to be done with (the queue's
    /// horizon, its consumers' ack floor), and an adopted message would otherwise hold that
    /// floor until JetStream redelivers it after `ack_wait` (invariant 11). Its job lives in
    /// its row (Postgres is the truth): deleting the message, as an ack would, loses nothing,
    /// and a worker that still acks it later acks nothing. A failed delete only leaves the
    /// wait as it was (logged).
    async fn delete_adopted(
        &self,
        lane: &Lane,
        adopt: &[ClaimInput],
        seqs: &[Option<i64>],
        adopted: &[String],
    ) {
        let shared = &self.shared;
        let ordered = shared.queues[lane.queue.as_str()]
            .keys
            .is_some_and(|k| k.ordered);
        if !ordered {
            return;
        }
        let adopted: HashSet<&str> = adopted.iter().map(String::as_str).collect();
        let gone = async {
            let stream = shared.broker.stream().await?;
            for (c, seq) in adopt.iter().zip(seqs) {
                if let (true, Some(seq)) = (adopted.contains(c.job.id.as_str()), seq) {
                    shared.broker.delete_message(&stream, *seq as u64).await?;
                }
            }
            Ok::<(), crate::broker::BrokerError>(())
        };
        if let Err(e) = gone.await {
            warn!(queue = %lane.queue, cause = %e, "could not delete adopted messages from the stream: the ordered queue's later jobs wait for their redelivery (ack_wait)");
        }
    }

    /// The queue's delivered, unacked messages that decode to jobs, with their sequences,
    /// and those whose headers the NATS client cannot read. (Other messages that do not
    /// decode, or name another priority than their lane's, are recorded when JetStream
    /// redelivers them.)
    async fn delivered_unacked(
        &self,
        lane: &Lane,
        pos: &StreamPosition,
    ) -> Result<(Vec<ClaimInput>, Vec<u64>, Vec<StoredMessage>), String> {
        let shared = &self.shared;
        let broker = &shared.broker;
        let queue = lane.queue.as_str();
        let policy = &shared.queues[queue];
        let stream = broker.stream().await.map_err(|e| e.to_string())?;
        let subject = broker.lane_subject(lane);
        let max_bytes = shared.config.worker.max_payload_bytes;
        let (mut inputs, mut seqs, mut unreadable) = (Vec::new(), Vec::new(), Vec::new());
        let mut from = pos.ack_floor + 1;
        for _ in 0..ADOPT_SCAN {
            if from > pos.delivered {
                break;
            }
            let Some(m) = broker
                .first_message(&stream, &subject, from)
                .await
                .map_err(|e| e.to_string())?
            else {
                break;
            };
            if m.seq > pos.delivered {
                break;
            }
            from = m.seq + 1;
            if m.unreadable.is_some() {
                unreadable.push(m);
                continue;
            }
            if let Ok(job) = self.job_of(lane, &m, max_bytes) {
                let max_attempts = job.max_attempts.unwrap_or(policy.max_attempts as i32);
                inputs.push(ClaimInput {
                    job,
                    max_attempts,
                    traceparent: m.headers.get("traceparent").map(|v| v.as_str().to_string()),
                });
                seqs.push(m.seq);
            }
        }
        Ok((inputs, seqs, unreadable))
    }

    /// The job a stored message of `lane` is, as the claim would make it (its id derived
    /// alike, its key from the queue's key_from, its priority its lane's), or why it is
    /// none.
    fn job_of(
        &self,
        lane: &Lane,
        m: &StoredMessage,
        max_bytes: usize,
    ) -> Result<job::NewJob, String> {
        let msg_id = m
            .headers
            .get(async_nats::header::NATS_MESSAGE_ID)
            .map(|v| v.as_str().to_string());
        let origin = MessageOrigin {
            queue: &lane.queue,
            stream: self.shared.broker.stream_name(),
            stream_seq: m.seq,
            stored_ns: m.stored_ns,
            msg_id: msg_id.as_deref(),
        };
        let mut job = job::decode(&m.payload, &origin, max_bytes).map_err(|e| e.to_string())?;
        let again = msg_id
            .as_deref()
            .is_some_and(|id| super::producer::republished(id, &job.id));
        let policy = &self.shared.queues[lane.queue.as_str()];
        policy
            .take_key(&mut job, again, |h| {
                m.headers.get(h).map(|v| v.as_str().to_string())
            })
            .and_then(|()| policy.gate_job(&mut job, again))
            .map_err(|e| e.to_string())?;
        if job.priority_named && job.priority != lane.priority() {
            return Err(format!(
                "field `priority` is invalid: the envelope names priority {}, but the message \
                 was published to {} (priority {})",
                job.priority,
                self.shared.broker.lane_subject(lane),
                lane.priority()
            ));
        }
        job.priority = lane.priority();
        Ok(job)
    }

    /// Takes out of the stream the delivered messages whose headers the NATS client cannot
    /// read. async-nats 0.51 panics in its connection task on a header value with a lone CR,
    /// so such a message killed the connection of the worker it was delivered to (which
    /// then ends, see the supervisor), and JetStream would deliver it again after `ack_wait`
    /// to the next one. Read raw here, its job is kept — adopted, due now, published again
    /// with clean headers — or, when it is no job, recorded dead with the reason; then the
    /// message is deleted. Returns how many were taken out.
    async fn take_out(&self, lane: &Lane, msgs: Vec<StoredMessage>) -> Result<usize, String> {
        if msgs.is_empty() {
            return Ok(0);
        }
        let shared = &self.shared;
        let broker = &shared.broker;
        let stream = broker.stream().await.map_err(|e| e.to_string())?;
        let max_bytes = shared.config.worker.max_payload_bytes;
        let policy = &shared.queues[lane.queue.as_str()];
        let mut done = 0;
        for m in msgs {
            let why = m.unreadable.clone().unwrap_or_default();
            let kept = match self.job_of(lane, &m, max_bytes) {
                Ok(job) => {
                    let id = job.id.clone();
                    let max_attempts = job.max_attempts.unwrap_or(policy.max_attempts as i32);
                    let input = ClaimInput {
                        job,
                        max_attempts,
                        traceparent: None,
                    };
                    let seq = Some(m.seq.min(i64::MAX as u64) as i64);
                    shared.store.job_adopt(&[input], &[seq]).await.map(|_| {
                        Stats::add(&shared.stats.adopted, 1);
                        warn!(job.id = %id, seq = m.seq, %why, "a message the NATS client cannot read was adopted from the stream and deleted there (its headers dropped); it runs again now");
                    })
                }
                Err(reason) => {
                    let own = job::message_id(&MessageOrigin {
                        queue: &lane.queue,
                        stream: broker.stream_name(),
                        stream_seq: m.seq,
                        stored_ns: m.stored_ns,
                        msg_id: None,
                    });
                    let reason = format!("{reason}; besides, {why}");
                    let row = (
                        own.clone(),
                        lane.queue.clone(),
                        super::producer::invalid_payload(&m.payload),
                        reason.clone(),
                        None,
                    );
                    shared
                        .store
                        .job_dead_invalid(&shared.worker_id, &[row])
                        .await
                        .map(|_| {
                            Stats::add(&shared.stats.invalid, 1);
                            warn!(job.id = %own, seq = m.seq, %reason, "a message the NATS client cannot read was recorded dead and deleted from the stream");
                        })
                }
            };
            kept.map_err(|e| e.to_string())?;
            broker
                .delete_message(&stream, m.seq)
                .await
                .map_err(|e| e.to_string())?;
            done += 1;
        }
        Ok(done)
    }

    /// One broker-loss repair round over this worker's queues; returns how many jobs were
    /// republished.
    pub async fn repair_once(&self) -> Result<usize, String> {
        let shared = &self.shared;
        let deadline: Duration = shared.config.worker.broker_lost_after;
        let mut total = 0;
        for lane in shared.lanes.iter() {
            // Jobs are published to the lane of their priority: band 5 carries none (the
            // default priority goes to the bare subject).
            if lane.band.is_some() && lane.priority() == DEFAULT_PRIORITY {
                continue;
            }
            if shared.paused(&lane.queue) {
                continue;
            }
            let pos = shared
                .broker
                .stream_position(lane)
                .await
                .map_err(|e| e.to_string())?;
            let ids = shared
                .store
                .job_requeue_lost(
                    &lane.queue,
                    lane.priority(),
                    deadline,
                    REPAIR_LIMIT,
                    &crate::store::StreamBounds {
                        gone_upto: pos.gone_upto,
                        last_seq: pos.last_seq,
                        created: pos.created,
                    },
                )
                .await
                .map_err(|e| e.to_string())?;
            if !ids.is_empty() {
                warn!(%lane, jobs = ids.len(), first = %ids[0],
                      "queued jobs whose message is no longer in the stream: republishing (broker_lost)");
            }
            total += ids.len();
        }
        Stats::add(&shared.stats.republished_broker_lost, total as u64);
        Ok(total)
    }
}
