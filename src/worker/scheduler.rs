//! The Scheduler: publishes delayed jobs, retries and reclaimed jobs when they become due.
//!
//! Due rows are locked with `FOR UPDATE SKIP LOCKED`, so the schedulers of several pods share
//! the work without publishing a job twice in one round. The publish happens inside the
//! transaction that records what became of each row, and every publish is bounded in time
//! (the rows stay locked meanwhile):
//!
//! - taken by the stream: `queued`, with the stream sequence (for broker-loss repair);
//! - answered `duplicate` (its `<id>:<generation>` message id was taken): published again at
//!   once under the next generation — a duplicate is not a publish;
//! - failed for now (NATS unreachable, timed out): tried again after a short wait, so it
//!   never holds back the jobs behind it;
//! - never publishable (the message is over the server's max_payload): dead, with the reason.
//!
//! A crash before commit leaves the rows `scheduled` (published again next round; the claim
//! absorbs the extra message).

use super::outage::Outage;
use super::{Shared, Stats};
use crate::broker::{Broker, BrokerError, BROKER_CALL_LIMIT};
use crate::job::Envelope;
use crate::store::{DueJob, DueRound, PublishReport};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// Most due jobs published in one round.
const ROUND_LIMIT: i64 = 500;
/// Most expired jobs ended in one round (a full round is followed by another at once).
const EXPIRE_LIMIT: i64 = 500;
/// Most batches finished in one round.
const BATCH_LIMIT: i32 = 50;
/// Most expiry rounds per tick (a backlog of expired jobs drains over a few ticks).
const EXPIRE_ROUNDS: usize = 8;
/// How often the expiry rounds run (not every tick: a job past its expiry whose message
/// arrives meanwhile is ended by its claim anyway).
const EXPIRE_EVERY: std::time::Duration = std::time::Duration::from_secs(1);
/// Most ended jobs whose dependents one chain round resolves, and most rounds per tick (a
/// dead parent's descendants die one generation per round).
const CHAIN_LIMIT: i64 = 500;
const CHAIN_ROUNDS: usize = 16;
/// How soon a lost LISTEN connection is opened again.
const LISTEN_RETRY: std::time::Duration = std::time::Duration::from_secs(5);
/// How often the paused queues are read (a resume starts the queue's jobs within this).
const PAUSES_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

pub(crate) struct Scheduler {
    shared: Arc<Shared>,
}

impl Scheduler {
    pub fn new(shared: Arc<Shared>) -> Scheduler {
        Scheduler { shared }
    }

    pub async fn run(self, cancel: CancellationToken) {
        let every = self.shared.config.worker.scheduler_every;
        let mut outage = Outage::new("scheduler");
        let mut chains = Outage::new("chain resolution");
        let mut wait = every;
        // Jobs enqueued through SQL (`enqueue()`) wake the scheduler when their transaction
        // commits; polling every `scheduler_every` covers a lost connection.
        let mut wake: Option<tokio::sync::mpsc::Receiver<()>> = None;
        let mut listen_tried: Option<std::time::Instant> = None;
        let mut rechecked = std::time::Instant::now();
        let mut pauses_read: Option<std::time::Instant> = None;
        let mut expired_at: Option<std::time::Instant> = None;
        loop {
            if pauses_read.is_none_or(|t| t.elapsed() >= PAUSES_EVERY) {
                pauses_read = Some(std::time::Instant::now());
                self.read_pauses().await;
            }
            if wake.is_none() && listen_tried.is_none_or(|t| t.elapsed() >= LISTEN_RETRY) {
                listen_tried = Some(std::time::Instant::now());
                match self.shared.store.listen_enqueues().await {
                    Ok((rx, driver)) => {
                        let sup = &self.shared.supervisor;
                        tokio::spawn(sup.task(super::Service::Scheduler, driver));
                        wake = Some(rx);
                    }
                    Err(e) => debug!(cause = %e, "cannot listen for enqueues; polling"),
                }
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
                woke = async { wake.as_mut()?.recv().await }, if wake.is_some() => {
                    if woke.is_none() {
                        wake = None;
                    }
                }
            }
            // Chains first: the jobs they make due are published in the same tick. (Their
            // failures back off with the publishing below, which fails with them.)
            match self.resolve_chains().await {
                Ok(()) => chains.ok(),
                Err(e) => {
                    chains.failed(&e);
                }
            }
            if rechecked.elapsed() >= self.shared.config.worker.sweep_every {
                rechecked = std::time::Instant::now();
                match self.shared.store.chain_recheck().await {
                    Ok(0) => {}
                    Ok(n) => info!(
                        jobs = n,
                        "chain recheck: ended parents marked for resolution, or jobs doomed by \
                         a retried parent waiting again"
                    ),
                    Err(e) => debug!(cause = %e, "chain recheck failed"),
                }
            }
            // Expired jobs end before the due ones are published: a due retry past its expiry
            // is ended, not published. (Failures back off with the publishing below.)
            if expired_at.is_none_or(|t| t.elapsed() >= EXPIRE_EVERY) {
                expired_at = Some(std::time::Instant::now());
                if let Err(e) = self.expire_due().await {
                    debug!(cause = %e, "expiry round failed");
                }
            }
            // Keep going while full rounds come back: a backlog drains without waiting ticks.
            wait = loop {
                match self.run_once().await {
                    Ok(r) if r.failed > 0 && r.published == 0 => {
                        let cause = format!(
                            "{} due jobs could not be published ({}); each is tried again in {:?}",
                            r.failed,
                            r.first_error.as_deref().unwrap_or("unknown"),
                            crate::store::PUBLISH_RETRY
                        );
                        break outage.failed(&cause).max(every);
                    }
                    Ok(r) if r.locked as i64 >= ROUND_LIMIT => continue,
                    Ok(_) => {
                        outage.ok();
                        break every;
                    }
                    Err(e) => break outage.failed(&e).max(every),
                }
            };
        }
    }

    /// Marks the queues paused and resumed since the last read (`queue_pauses`): a paused
    /// queue's producer pulls nothing (the claim statements refuse its jobs in any case).
    async fn read_pauses(&self) {
        let paused = match self.shared.store.paused_queues().await {
            Ok(p) => p,
            Err(e) => {
                debug!(cause = %e, "cannot read the paused queues; trying again");
                return;
            }
        };
        for (name, policy) in &self.shared.queues {
            let now = paused.iter().any(|p| &p.queue == name);
            if policy.paused.swap(now, Ordering::SeqCst) != now {
                if now {
                    info!(queue = %name, "queue paused: its messages wait in the stream until it is resumed");
                } else {
                    info!(queue = %name, "queue resumed");
                }
            }
        }
    }

    /// Resolves the dependents of ended jobs (`then` jobs created, waiting children made due,
    /// dead or cancelled), generation after generation, until a round finds nothing. A round
    /// that fails is done again one job at a time, so one job whose `then` cannot be created
    /// (a spec PostgreSQL refuses) holds up no other: its specs are dropped, saying why.
    pub async fn resolve_chains(&self) -> Result<(), crate::store::StoreError> {
        let store = &self.shared.store;
        for _ in 0..CHAIN_ROUNDS {
            let round = match store.chain_resolve(CHAIN_LIMIT, None).await {
                Ok(round) => round,
                // The server is away: nothing to learn one job at a time.
                Err(e) if e.is_transient() => return Err(e),
                Err(e) => {
                    warn!(cause = %e, "chain round failed; resolving one job at a time");
                    for id in store.chain_pending_ids(CHAIN_LIMIT).await? {
                        self.resolve_one(&id).await?;
                    }
                    return Ok(());
                }
            };
            self.announce(&round);
            if round.parents == 0 {
                break;
            }
            debug!(
                parents = round.parents,
                created = round.created,
                decided = round.decided,
                "chain round"
            );
        }
        Ok(())
    }

    async fn resolve_one(&self, id: &str) -> Result<(), crate::store::StoreError> {
        let store = &self.shared.store;
        let e = match store.chain_resolve(1, Some(id)).await {
            Ok(round) => {
                self.announce(&round);
                return Ok(());
            }
            Err(e) => e.to_string(),
        };
        if store.chain_drop_then(id, &e).await? {
            warn!(job.id = %id, cause = %e, "the job's then jobs cannot be created; dropped (kept in its last_error)");
            match store.chain_resolve(1, Some(id)).await {
                Ok(round) => {
                    self.announce(&round);
                    return Ok(());
                }
                Err(again) => {
                    store.chain_give_up(id, &again.to_string()).await?;
                    warn!(job.id = %id, cause = %again, "the job's dependents cannot be resolved");
                }
            }
        } else {
            store.chain_give_up(id, &e).await?;
            warn!(job.id = %id, cause = %e, "the job's dependents cannot be resolved");
        }
        Ok(())
    }

    fn announce(&self, round: &crate::store::ChainRound) {
        for (id, queue, reason) in &round.dead {
            warn!(job.id = %id, %queue, reason = %reason, "job dead-lettered: a job it depends on is dead");
            self.shared.announce_dead(queue, id, Some(reason));
        }
    }

    /// Ends the queued and scheduled jobs whose expiry has passed, in bounded rounds; returns
    /// how many it ended.
    pub async fn expire_due(&self) -> Result<usize, crate::store::StoreError> {
        if let Err(e) = self.finish_batches().await {
            debug!(cause = %e, "batch round failed");
        }
        let mut total = self.end_overdue().await?;
        for _ in 0..EXPIRE_ROUNDS {
            let ended = self.shared.store.job_expire_due(EXPIRE_LIMIT).await?;
            total += ended.len();
            for (id, queue) in &ended {
                info!(job.id = %id, %queue, "job expired before it started: ended cancelled");
                self.shared.metrics.expired(queue).inc();
            }
            if (ended.len() as i64) < EXPIRE_LIMIT {
                break;
            }
        }
        Ok(total)
    }

    /// Finishes the batches whose members have all ended: each one's callbacks are enqueued
    /// once (under the batch row's lock), whichever pod's round gets there first.
    pub async fn finish_batches(&self) -> Result<usize, crate::store::StoreError> {
        let mut total = 0;
        for _ in 0..EXPIRE_ROUNDS {
            let finished = self.shared.store.batch_finish(BATCH_LIMIT).await?;
            total += finished.len();
            for (batch, callbacks) in &finished {
                info!(%batch, ?callbacks, "batch finished: every member has ended");
            }
            if (finished.len() as i32) < BATCH_LIMIT {
                break;
            }
        }
        Ok(total)
    }

    /// Ends awaiting jobs whose deadline passed with no completion or failure from outside:
    /// retried after the backoff their worker computed as they deferred, or dead-lettered
    /// when they had no attempts left. Returns how many.
    pub async fn end_overdue(&self) -> Result<usize, crate::store::StoreError> {
        let mut total = 0;
        for _ in 0..EXPIRE_ROUNDS {
            let ended = self
                .shared
                .store
                .job_await_expire(EXPIRE_LIMIT as i32)
                .await?;
            total += ended.len();
            for e in &ended {
                let metrics = &self.shared.metrics;
                if e.status == "dead" {
                    warn!(job.id = %e.id, queue = %e.queue, "awaiting job's deadline passed with no attempts left: dead-lettered");
                    metrics.outcome(&e.queue, "dead").inc();
                    self.shared
                        .announce_dead(&e.queue, &e.id, Some("deadline passed"));
                } else {
                    info!(job.id = %e.id, queue = %e.queue, "awaiting job's deadline passed: retried after its backoff");
                    metrics.outcome(&e.queue, "retried").inc();
                }
            }
            if (ended.len() as i64) < EXPIRE_LIMIT {
                break;
            }
        }
        Ok(total)
    }

    /// Publishes one round of due jobs; returns what became of them.
    pub async fn run_once(&self) -> Result<DueRound, crate::store::StoreError> {
        let broker = self.shared.broker.clone();
        let limit = self.shared.config.worker.max_payload_bytes;
        let round = self
            .shared
            .store
            .job_publish_due(ROUND_LIMIT, |due| {
                publish_all(broker, due, limit, self.shared.telemetry.clone())
            })
            .await?;
        let stats = &self.shared.stats;
        Stats::add(&stats.scheduled_published, round.published as u64);
        Stats::add(&stats.republish_duplicates, round.duplicates as u64);
        Stats::add(&stats.unpublishable, round.dead.len() as u64);
        for (id, queue, reason) in &round.dead {
            warn!(job.id = %id, %queue, %reason, "job can never be published: dead-lettered");
            self.shared.announce_dead(queue, id, Some(reason));
        }
        Ok(round)
    }
}

/// Whether a worker would accept the message of a due job: the job contract as the decoder
/// applies it, and the body within the workers' payload limit. A row the contract refuses
/// (stored before it existed, or by hand) is never published: published, it would be
/// refused by every worker, recorded as a dead copy, and republished again and again.
fn refusal(envelope: &Envelope, limit: usize) -> Option<String> {
    let body = serde_json::to_value(envelope).expect("an envelope serialises");
    let serde_json::Value::Object(obj) = &body else {
        return None;
    };
    if let Err(e) = crate::contract::check_spec(obj, crate::contract::Door::Message, None) {
        return Some(format!("the job contract refuses it: {e}"));
    }
    let size = body.to_string().len();
    (size > limit).then(|| {
        format!(
            "its message is {size} bytes, over the workers' limit of {limit} bytes \
             (worker.max_payload_bytes)"
        )
    })
}

/// Publishes every due job concurrently, waiting (bounded) for the stream's answers.
async fn publish_all(
    broker: Broker,
    due: Vec<DueJob>,
    limit: usize,
    telemetry: crate::telemetry::Telemetry,
) -> PublishReport {
    let started = std::time::SystemTime::now();
    // (id, queue, traceparent, not run yet) of each job, for its span.
    let mut traced = Vec::new();
    let mut report = PublishReport::default();
    let mut pending = Vec::with_capacity(due.len());
    // The rows stay locked while this runs: once one send could not even be handed to the
    // client in time (NATS unreachable, its buffer full), the rest of the round fails at
    // once instead of waiting the same time each.
    let mut unreachable = false;
    for job in due {
        if unreachable {
            report.failed.push(job.id);
            continue;
        }
        let envelope = Envelope {
            id: Some(job.id.clone()),
            payload: job.payload,
            priority: Some(job.priority),
            max_attempts: Some(job.max_attempts),
            timeout_ms: job.timeout_ms.map(|t| t as u64),
            idempotency_key: None,
            run_at_ms: None,
            // The row keeps the job's own backoff; the claim reads it from there.
            backoff: None,
        };
        if let Some(reason) = refusal(&envelope, limit) {
            report.unpublishable.push((job.id, reason));
            continue;
        }
        if telemetry.is_on() {
            traced.push((
                job.id.clone(),
                job.queue.clone(),
                job.traceparent.clone(),
                job.attempts == 0,
            ));
        }
        match broker
            .publish_job(&job.queue, &envelope, job.generation)
            .await
        {
            Ok(ack) => pending.push((job.id, ack)),
            Err(e @ (BrokerError::TooLarge { .. } | BrokerError::Unpublishable { .. })) => {
                report.unpublishable.push((job.id, e.to_string()))
            }
            Err(e) => {
                debug!(job.id = %job.id, cause = %e, "publishing a due job failed");
                unreachable |= matches!(e, BrokerError::TimedOut { .. });
                report.first_error.get_or_insert_with(|| e.to_string());
                report.failed.push(job.id);
            }
        }
    }
    // The answers arrive together; one deadline for all of them.
    let answers =
        futures::future::join_all(pending.into_iter().map(|(id, ack)| async move {
            (id, tokio::time::timeout(BROKER_CALL_LIMIT, ack).await)
        }))
        .await;
    for (id, answer) in answers {
        match answer {
            Ok(Ok(a)) if a.duplicate => report.duplicates.push(id),
            Ok(Ok(a)) => report.published.push((id, a.sequence)),
            Ok(Err(e)) => {
                debug!(job.id = %id, cause = %e, "the stream did not take a due job");
                report.first_error.get_or_insert_with(|| e.to_string());
                report.failed.push(id);
            }
            Err(_) => {
                report
                    .first_error
                    .get_or_insert_with(|| "no answer from the stream in time".into());
                report.failed.push(id);
            }
        }
    }
    if !traced.is_empty() {
        let published: std::collections::HashSet<&str> =
            report.published.iter().map(|(id, _)| id.as_str()).collect();
        let prefix = broker.subject_prefix();
        for (id, queue, traceparent, first) in &traced {
            if published.contains(id.as_str()) {
                let subject = format!("{prefix}.{queue}");
                telemetry.published(
                    &crate::telemetry::JobRef {
                        id,
                        queue,
                        subject: &subject,
                        traceparent: traceparent.as_deref(),
                    },
                    if *first { "due" } else { "again" },
                    started,
                );
            }
        }
    }
    report
}
