//! The Scheduler: publishes delayed jobs and retries when they become due.
//!
//! Due rows are locked with `FOR UPDATE SKIP LOCKED`, so the schedulers of several pods share
//! the work without publishing a job twice in one round. The publish happens inside the
//! transaction that marks the rows `queued`: a crash before commit leaves them `scheduled`
//! (published again next round; the claim absorbs the extra message), a failed publish leaves
//! them `scheduled` too. Each publish uses `Nats-Msg-Id: <id>:<generation>`.

use super::{Shared, Stats};
use crate::job::Envelope;
use crate::store::DueJob;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// Most due jobs published in one round.
const ROUND_LIMIT: i64 = 500;

pub(crate) struct Scheduler {
    shared: Arc<Shared>,
}

impl Scheduler {
    pub fn new(shared: Arc<Shared>) -> Scheduler {
        Scheduler { shared }
    }

    pub async fn run(self, cancel: CancellationToken) {
        let mut tick = tokio::time::interval(self.shared.config.worker.scheduler_every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tick.tick() => {}
            }
            // Keep going while full rounds come back: a backlog drains without waiting ticks.
            loop {
                match self.run_once().await {
                    Ok(n) if n as i64 >= ROUND_LIMIT => continue,
                    Ok(_) => break,
                    Err(e) => {
                        warn!(cause = %e, "scheduler round failed");
                        break;
                    }
                }
            }
        }
    }

    /// Publishes one round of due jobs; returns how many were published.
    pub async fn run_once(&self) -> Result<usize, crate::store::StoreError> {
        let broker = self.shared.broker.clone();
        let n = self
            .shared
            .store
            .job_publish_due(ROUND_LIMIT, |due| publish_all(broker, due))
            .await?;
        Stats::add(&self.shared.stats.scheduled_published, n as u64);
        Ok(n)
    }
}

/// Publishes every due job concurrently, waiting for the stream's acks; returns the ids the
/// stream accepted.
async fn publish_all(broker: crate::broker::Broker, due: Vec<DueJob>) -> Vec<String> {
    let mut pending = Vec::with_capacity(due.len());
    for job in due {
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
        match broker
            .publish_job(&job.queue, &envelope, job.generation)
            .await
        {
            Ok(ack) => pending.push((job.id, ack)),
            Err(e) => {
                warn!(job.id = %job.id, cause = %e, "publishing a due job failed; will retry")
            }
        }
    }
    let mut published = Vec::with_capacity(pending.len());
    for (id, ack) in pending {
        match ack.await {
            Ok(_) => published.push(id),
            Err(e) => {
                warn!(job.id = %id, cause = %e, "stream did not confirm a due job; will retry")
            }
        }
    }
    published
}
