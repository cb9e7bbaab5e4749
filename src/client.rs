//! The producer side for Rust programs (and the `enqueue` command): a job is written to
//! PostgreSQL first, then published. Postgres is the truth, so a publish that fails after the
//! commit loses nothing: the job waits `queued` until the broker-loss sweep republishes it.
//!
//! Producers in other languages publish a JSON message to `jobs.<queue>` with any NATS
//! client; see `docs/message-format.md`.

use crate::broker::Broker;
use crate::job::{self, Envelope, JobStatus, NewJob, DEFAULT_PRIORITY};
use crate::store::{Enqueued, Store};
use serde_json::Value;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error("job {id} is stored as {status} but publishing it failed: {cause}; it will be republished by the broker-loss sweep")]
    Publish {
        id: String,
        status: JobStatus,
        cause: String,
    },
}

/// Options of one enqueue; all optional.
#[derive(Debug, Clone, Default)]
pub struct EnqueueOptions {
    pub id: Option<String>,
    pub priority: Option<i16>,
    pub delay: Option<Duration>,
    pub max_attempts: Option<i32>,
    pub timeout: Option<Duration>,
    pub idempotency_key: Option<String>,
    /// Overrides the queue's backoff for this job.
    pub backoff: Option<crate::backoff::Backoff>,
}

#[derive(Clone)]
pub struct Client {
    store: Store,
    broker: Broker,
    default_max_attempts: i32,
}

impl Client {
    pub fn new(store: Store, broker: Broker) -> Client {
        Client {
            store,
            broker,
            default_max_attempts: crate::config::DEFAULT_MAX_ATTEMPTS as i32,
        }
    }

    /// Max attempts for jobs that name none (normally the queue's configured value).
    pub fn with_default_max_attempts(mut self, n: i32) -> Client {
        self.default_max_attempts = n;
        self
    }

    /// Enqueues a job and returns it. Enqueueing an existing id or idempotency key returns the
    /// existing job (`created: false`) and publishes nothing.
    pub async fn enqueue(
        &self,
        queue: &str,
        payload: Value,
        opts: EnqueueOptions,
    ) -> Result<Enqueued, ClientError> {
        job::validate_queue_name(queue).map_err(ClientError::Invalid)?;
        if !payload.is_object() {
            return Err(ClientError::Invalid(
                "payload must be a JSON object, e.g. '{\"to\":\"a@example.com\"}'".into(),
            ));
        }
        job::check_storable(&payload).map_err(|e| ClientError::Invalid(e.to_string()))?;
        let id = opts
            .id
            .clone()
            .unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
        job::validate_id(&id).map_err(|e| ClientError::Invalid(format!("--id {e}")))?;
        let priority = opts.priority.unwrap_or(DEFAULT_PRIORITY);
        if !(0..=9).contains(&priority) {
            return Err(ClientError::Invalid(format!(
                "priority {priority} must be from 0 (first) to 9 (last)"
            )));
        }
        let max_attempts = opts.max_attempts.unwrap_or(self.default_max_attempts);
        if !(1..=1000).contains(&max_attempts) {
            return Err(ClientError::Invalid(format!(
                "max attempts {max_attempts} must be from 1 to 1000"
            )));
        }
        let new = NewJob {
            id,
            queue: queue.to_string(),
            payload,
            priority,
            max_attempts: Some(max_attempts),
            timeout: opts.timeout,
            idempotency_key: opts.idempotency_key.clone(),
            run_at_ms: None,
            backoff: opts.backoff,
        };
        if let Some(b) = &new.backoff {
            b.validate()
                .map_err(|e| ClientError::Invalid(format!("backoff: {e}")))?;
        }
        let delay = opts.delay.unwrap_or_default();
        let enq = self.store.job_insert(&new, max_attempts, delay).await?;
        if !enq.created || enq.status != JobStatus::Queued {
            // Existing job, or a delayed one: the scheduler publishes it when due.
            return Ok(enq);
        }
        let envelope = Envelope {
            id: Some(new.id.clone()),
            payload: new.payload,
            priority: Some(priority),
            max_attempts: Some(max_attempts),
            timeout_ms: opts.timeout.map(|t| t.as_millis() as u64),
            idempotency_key: opts.idempotency_key,
            run_at_ms: None,
            backoff: opts.backoff,
        };
        let published = match self
            .broker
            .publish_job(queue, &envelope, enq.generation)
            .await
        {
            Ok(ack) => ack.await.map(|_| ()).map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        published.map_err(|cause| ClientError::Publish {
            id: enq.id.clone(),
            status: enq.status,
            cause,
        })?;
        Ok(enq)
    }
}
