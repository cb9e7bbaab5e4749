//! The producer side for Rust programs (and the `enqueue` command): a job is written to
//! PostgreSQL first, then published. Postgres is the truth, so a publish that fails after the
//! commit loses nothing: the job waits `queued` until the broker-loss sweep republishes it.
//!
//! Producers in other languages publish a JSON message to `jobs.<queue>` with any NATS
//! client; see `docs/message-format.md`.

use crate::broker::Broker;
use crate::job::{Envelope, JobStatus, NewJob, DEFAULT_PRIORITY};
use crate::store::{in_schema, sql, Enqueued, Store};
use serde_json::Value;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{0}")]
    Invalid(String),
    /// The job contract refused a field (the same words at every door).
    #[error(transparent)]
    Refused(#[from] crate::contract::Refused),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// The id or idempotency key belongs to a job with another payload (the message says
    /// which, and which job holds it).
    #[error("{0}")]
    Conflict(String),
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
    /// Jobs that must all complete before this one runs (it waits as `waiting`). A dead
    /// parent makes this job dead too, a cancelled one cancels it.
    pub depends_on: Vec<String>,
    /// Jobs created when this one completes (each may have its own `then`).
    pub then: Vec<Then>,
    /// Not started by this instant, the job never runs: it ends `cancelled`, last_error
    /// `expired: not started by <instant>`. Not with `expires_in`.
    pub expires_at: Option<std::time::SystemTime>,
    /// Not started this long after it is enqueued (database time), the job never runs.
    /// Not with `expires_at`.
    pub expires_in: Option<Duration>,
    /// What groups the job with others (a customer, a tenant), e.g. `customer-42`: the
    /// rules of an id (the contract's `key`).
    pub key: Option<String>,
    /// Jobs of this key that come within this window collapse into the last one, run once
    /// the key has been quiet this long (needs `key`; replaces the queue's debounce).
    pub debounce: Option<Duration>,
    /// The debounced job runs at the latest this long after the first one came (at least
    /// `debounce`).
    pub debounce_max_wait: Option<Duration>,
    /// At most one job of this key per window; the others end at once, `cancelled` with
    /// `throttled: ...` (needs `key`; not with `debounce`).
    pub throttle: Option<Duration>,
    /// The idempotency key is held this long only (needs `idempotency_key`).
    pub unique_for: Option<Duration>,
}

/// One job of a bulk enqueue ([`Client::enqueue_many`]).
#[derive(Debug, Clone)]
pub struct BulkJob {
    pub queue: String,
    pub payload: Value,
    pub opts: EnqueueOptions,
}

impl BulkJob {
    pub fn new(queue: impl Into<String>, payload: Value, opts: EnqueueOptions) -> BulkJob {
        BulkJob {
            queue: queue.into(),
            payload,
            opts,
        }
    }
}

/// A batch: jobs enqueued together, with callback jobs that run once when every member has
/// ended (see [`Client::enqueue_batch`]).
#[derive(Debug, Clone, Default)]
pub struct Batch {
    /// The batch's id (made up when `None`).
    pub id: Option<String>,
    pub jobs: Vec<BulkJob>,
    /// Runs once every member has ended, whatever became of them.
    pub on_complete: Option<BulkJob>,
    /// Runs once every member has ended, if every one completed.
    pub on_success: Option<BulkJob>,
}

/// The `then` of an enqueue and its check are part of the job's wire format: they live
/// with the envelope in [`crate::job`].
pub use crate::job::{check_then, Then};

#[derive(Clone)]
pub struct Client {
    store: Store,
    broker: Broker,
    default_max_attempts: i32,
    max_payload_bytes: Option<usize>,
}

impl Client {
    pub fn new(store: Store, broker: Broker) -> Client {
        Client {
            store,
            broker,
            default_max_attempts: crate::config::DEFAULT_MAX_ATTEMPTS as i32,
            max_payload_bytes: None,
        }
    }

    /// Refuses jobs whose message is over the workers' `worker.max_payload_bytes` (the
    /// server's max_payload is always checked).
    pub fn with_max_payload_bytes(mut self, n: usize) -> Client {
        self.max_payload_bytes = Some(n);
        self
    }

    /// The store it enqueues into (to open a transaction for [`Client::enqueue_many_in`]).
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Max attempts for jobs that name none (normally the queue's configured value).
    pub fn with_default_max_attempts(mut self, n: i32) -> Client {
        self.default_max_attempts = n;
        self
    }

    /// Checks a job before it is stored, by the job contract ([`crate::contract`]) — the
    /// same rules as every other door — and checks that the message it will travel in fits
    /// the server and the workers. Returns the job, its envelope and max attempts.
    fn prepare(
        &self,
        queue: &str,
        payload: Value,
        opts: &EnqueueOptions,
    ) -> Result<(NewJob, Envelope, i32), ClientError> {
        let id = opts
            .id
            .clone()
            .unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
        let spec = spec_of(queue, payload, &id, opts);
        let checked = crate::contract::check_spec(
            &spec,
            crate::contract::Door::Enqueue,
            self.max_payload_bytes,
        )?;
        let priority = checked.priority.unwrap_or(DEFAULT_PRIORITY);
        let max_attempts = checked.max_attempts.unwrap_or(self.default_max_attempts);
        let timeout = checked.timeout_ms.map(|t| Duration::from_millis(t as u64));
        let gate = checked.gate.applied(
            &Default::default(),
            false,
            checked.idempotency_key.is_some(),
        );
        let new = NewJob {
            gate,
            id,
            queue: queue.to_string(),
            payload: checked.payload,
            priority,
            priority_named: checked.priority.is_some(),
            max_attempts: Some(max_attempts),
            timeout,
            idempotency_key: checked.idempotency_key,
            run_at_ms: None,
            backoff: checked.backoff,
            then: None,
            expires_at_ms: checked.expires_at_ms,
            key: checked.key,
            batch: None,
        };
        // The message the job will travel in (now, or when the scheduler publishes it) must
        // fit the server: say so now rather than store a job that can never be published.
        let envelope = Envelope {
            id: Some(new.id.clone()),
            payload: new.payload.clone(),
            priority: Some(priority),
            max_attempts: Some(max_attempts),
            timeout_ms: checked.timeout_ms.map(|t| t as u64),
            idempotency_key: new.idempotency_key.clone(),
            run_at_ms: None,
            backoff: new.backoff,
        };
        self.broker
            .job_message(&envelope, i32::MAX)
            .map_err(|e| ClientError::Invalid(e.to_string()))?;
        if let Some(limit) = self.max_payload_bytes {
            let size = serde_json::to_vec(&envelope).map(|b| b.len()).unwrap_or(0);
            if size > limit {
                return Err(ClientError::Invalid(format!(
                    "job {}: the message is {size} bytes, over the workers' limit of {limit} bytes \
                     (worker.max_payload_bytes); store large data elsewhere and pass a reference",
                    new.id
                )));
            }
        }
        Ok((new, envelope, max_attempts))
    }

    /// Enqueues a job inside the caller's own transaction (the outbox): if the transaction
    /// rolls back the job never existed; once it commits, a worker's scheduler publishes it
    /// (woken by the commit's NOTIFY). Runs the schema's SQL function `enqueue()`, which any
    /// language can call the same way. Returns the job's id; the same idempotency key (or
    /// id) with the same payload returns the existing job, with another payload is
    /// [`ClientError::Conflict`].
    pub async fn enqueue_in<C: tokio_postgres::GenericClient>(
        &self,
        tx: &C,
        queue: &str,
        payload: Value,
        opts: EnqueueOptions,
    ) -> Result<String, ClientError> {
        let (new, _envelope, max_attempts) = self.prepare(queue, payload, &opts)?;
        let sql = in_schema(sql::CLIENT_ENQUEUE, self.store.schema());
        let delay_ms = opts.delay.unwrap_or_default().as_millis() as i64;
        let (timeout_ms, backoff) = (new.timeout_ms(), new.backoff_json());
        let depends_on = (!opts.depends_on.is_empty()).then_some(&opts.depends_on);
        let then = (!opts.then.is_empty())
            .then(|| serde_json::to_value(&opts.then))
            .transpose()
            .map_err(|e| ClientError::Invalid(format!("then: {e}")))?;
        let expires_at_ms = new.expires_at_ms;
        let expires_in = opts.expires_in.map(|d| format!("{}ns", d.as_nanos()));
        let window = |f: &str| {
            new.gate
                .as_ref()
                .and_then(|g| g.get(f))
                .map(|ms| format!("{ms}ms"))
        };
        let (debounce, max_wait) = (window("debounce_ms"), window("max_wait_ms"));
        let (throttle, unique_for) = (window("throttle_ms"), window("unique_for_ms"));
        let row = tx
            .query_one(
                &sql,
                &[
                    &new.queue,
                    &new.payload,
                    &new.priority,
                    &delay_ms,
                    &max_attempts,
                    &new.idempotency_key,
                    &new.id,
                    &timeout_ms,
                    &backoff,
                    &depends_on,
                    &then,
                    &expires_at_ms,
                    &expires_in,
                    &new.key,
                    &debounce,
                    &max_wait,
                    &throttle,
                    &unique_for,
                ],
            )
            .await
            .map_err(refusal)?;
        Ok(row.get(0))
    }

    /// Enqueues many jobs inside the caller's own transaction (the outbox), as
    /// [`Client::enqueue_in`] would each, in one statement per 100,000 (the schema's
    /// `enqueue_many()`): all of them or, when one is refused, none — the error names it
    /// (`jobs[17]`, counted from 1) and its field. Returns their ids in order (an existing
    /// job's for a repeated id or idempotency key with the same payload). Once the
    /// transaction commits, the workers' schedulers publish them.
    pub async fn enqueue_many_in<C: tokio_postgres::GenericClient>(
        &self,
        tx: &C,
        jobs: &[BulkJob],
    ) -> Result<Vec<String>, ClientError> {
        if jobs.is_empty() {
            return Err(ClientError::Invalid(
                "jobs: is empty: give at least one job".into(),
            ));
        }
        let mut ids = Vec::with_capacity(jobs.len());
        for (c, chunk) in jobs.chunks(crate::contract::MAX_ENQUEUE_MANY).enumerate() {
            let first = c * crate::contract::MAX_ENQUEUE_MANY + 1;
            let mut specs = Vec::with_capacity(chunk.len());
            for (i, j) in chunk.iter().enumerate() {
                specs.push(self.bulk_spec(j, &format!("jobs[{}]", first + i))?);
            }
            let got = self
                .enqueue_specs_in(tx, specs)
                .await
                .map_err(|e| renumbered(e, first - 1))?;
            ids.extend(got);
        }
        Ok(ids)
    }

    /// Like [`Client::enqueue_many_in`] for job specs as they are (JSON objects with the
    /// fields of SQL `enqueue_many()`, e.g. read from a file): checked by the schema's
    /// contract only. Returns their ids in order.
    pub async fn enqueue_specs_in<C: tokio_postgres::GenericClient>(
        &self,
        tx: &C,
        specs: Vec<Value>,
    ) -> Result<Vec<String>, ClientError> {
        let sql = in_schema(sql::CLIENT_ENQUEUE_MANY, self.store.schema());
        let rows = tx
            .query(&sql, &[&Value::Array(specs)])
            .await
            .map_err(refusal)?;
        Ok(rows.iter().map(|r| r.get::<_, String>(1)).collect())
    }

    /// Completes an awaiting job (its handler deferred it) with its attempt's token: what a
    /// webhook receiver calls. `Ok(Err(..))` is a refusal (unknown job, a token not issued for
    /// it, a stale attempt, past its deadline, cancelled, a result over the limit), recorded
    /// in the job's attempts when it names an existing job. See [`crate::completion`].
    pub async fn complete(
        &self,
        id: &str,
        token: &str,
        result: Option<&Value>,
    ) -> Result<crate::store::EndResult, ClientError> {
        Ok(self.store.complete_job(id, token, result, "client").await?)
    }

    /// Fails an awaiting job with its attempt's token: retried after its backoff (or
    /// `retry_after`), dead when `permanent` or out of attempts.
    pub async fn fail(
        &self,
        id: &str,
        token: &str,
        error: &str,
        permanent: bool,
        retry_after: Option<Duration>,
    ) -> Result<crate::store::EndResult, ClientError> {
        Ok(self
            .store
            .fail_job(id, token, error, permanent, retry_after, "client")
            .await?)
    }

    /// The job spec of `j` (its fields as SQL `enqueue_many()` takes them), checked by the
    /// contract; `at` names it in an error.
    fn bulk_spec(&self, j: &BulkJob, at: &str) -> Result<Value, ClientError> {
        let (new, _envelope, max_attempts) = self
            .prepare(&j.queue, j.payload.clone(), &j.opts)
            .map_err(|e| ClientError::Invalid(format!("{at}: {e}")))?;
        let mut spec = spec_of(&j.queue, new.payload, &new.id, &j.opts);
        spec.insert("max_attempts".into(), max_attempts.into());
        Ok(Value::Object(spec))
    }

    /// Enqueues a batch inside the caller's own transaction (SQL `enqueue_batch()`): every
    /// member or none, checked as `enqueue_many` checks them (at most
    /// [`crate::contract::MAX_ENQUEUE_MANY`] members). Its callbacks run once, when every
    /// member has ended, and receive the batch's outcome as their parents' results:
    /// `{"<batch id>": {"size", "completed", "dead", "cancelled", "failed": [ids], ...}}`.
    /// Returns the batch's id.
    pub async fn enqueue_batch_in<C: tokio_postgres::GenericClient>(
        &self,
        tx: &C,
        batch: &Batch,
    ) -> Result<String, ClientError> {
        let mut members = Vec::with_capacity(batch.jobs.len());
        for (i, j) in batch.jobs.iter().enumerate() {
            members.push(self.bulk_spec(j, &format!("jobs[{}]", i + 1))?);
        }
        let mut spec = serde_json::Map::new();
        if let Some(id) = &batch.id {
            spec.insert("id".into(), id.clone().into());
        }
        spec.insert("jobs".into(), Value::Array(members));
        for (name, cb) in [
            ("on_complete", &batch.on_complete),
            ("on_success", &batch.on_success),
        ] {
            if let Some(cb) = cb {
                let mut cb_spec = self.bulk_spec(cb, name)?;
                if cb.opts.id.is_none() {
                    // Its id is the batch's (`<batch>.on_complete`), made when it is enqueued.
                    cb_spec.as_object_mut().expect("a spec").remove("id");
                }
                spec.insert(name.into(), cb_spec);
            }
        }
        self.enqueue_batch_spec_in(tx, Value::Object(spec)).await
    }

    /// Like [`Client::enqueue_batch_in`] for a batch spec as it is (`{"id", "jobs",
    /// "on_complete", "on_success"}`, e.g. read from a file): checked by the schema's
    /// `enqueue_batch()`.
    pub async fn enqueue_batch_spec_in<C: tokio_postgres::GenericClient>(
        &self,
        tx: &C,
        spec: Value,
    ) -> Result<String, ClientError> {
        let sql = in_schema(sql::CLIENT_ENQUEUE_BATCH, self.store.schema());
        let row = tx.query_one(&sql, &[&spec]).await.map_err(refusal)?;
        Ok(row.get(0))
    }

    /// [`Client::enqueue_batch_in`] in a transaction of its own.
    pub async fn enqueue_batch(&self, batch: &Batch) -> Result<String, ClientError> {
        let mut conn = self.store.raw().await?;
        let tx = conn
            .transaction()
            .await
            .map_err(|e| ClientError::Store(e.into()))?;
        let id = self.enqueue_batch_in(&*tx, batch).await?;
        tx.commit()
            .await
            .map_err(|e| ClientError::Store(e.into()))?;
        Ok(id)
    }

    /// [`Client::enqueue_many_in`] in a transaction of its own.
    pub async fn enqueue_many(&self, jobs: &[BulkJob]) -> Result<Vec<String>, ClientError> {
        let mut conn = self.store.raw().await?;
        let tx = conn
            .transaction()
            .await
            .map_err(|e| ClientError::Store(e.into()))?;
        let ids = self.enqueue_many_in(&*tx, jobs).await?;
        tx.commit()
            .await
            .map_err(|e| ClientError::Store(e.into()))?;
        Ok(ids)
    }

    /// Enqueues a job and returns it. Enqueueing an existing id or idempotency key returns the
    /// existing job (`created: false`) and publishes nothing.
    pub async fn enqueue(
        &self,
        queue: &str,
        payload: Value,
        opts: EnqueueOptions,
    ) -> Result<Enqueued, ClientError> {
        if !opts.depends_on.is_empty() || !opts.then.is_empty() {
            // Chains are made by the SQL function (one definition for every producer); the
            // scheduler publishes the job when it is due.
            let mut conn = self.store.raw().await?;
            let tx = conn
                .transaction()
                .await
                .map_err(|e| ClientError::Store(e.into()))?;
            let id = self.enqueue_in(&*tx, queue, payload, opts).await?;
            // A row created by this transaction has created_at = now() (its start).
            let row = tx
                .query_one(
                    &in_schema(sql::CLIENT_ENQUEUED, self.store.schema()),
                    &[&id],
                )
                .await
                .map_err(|e| ClientError::Store(e.into()))?;
            tx.commit()
                .await
                .map_err(|e| ClientError::Store(e.into()))?;
            return Ok(Enqueued {
                status: JobStatus::parse(row.get(0)).unwrap_or(JobStatus::Scheduled),
                id,
                created: row.get(2),
                generation: row.get(1),
                same_payload: true,
            });
        }
        let (new, envelope, max_attempts) = self.prepare(queue, payload, &opts)?;
        let delay = opts.delay.unwrap_or_default();
        let enq = self
            .store
            .job_insert(&new, max_attempts, delay, opts.expires_in)
            .await?;
        if !enq.same_payload {
            let taken = match &new.idempotency_key {
                Some(key) if enq.id != new.id => {
                    format!("idempotency key {key:?} of queue {queue}")
                }
                _ => format!("job id {:?}", new.id),
            };
            let existing = enq.id;
            return Err(ClientError::Conflict(format!(
                "{taken} already belongs to job {existing} with another payload; enqueue a \
                 different job under a new key (or id), or the same payload to get job \
                 {existing} back"
            )));
        }
        if !enq.created || enq.status != JobStatus::Queued {
            // Existing job, or a delayed one: the scheduler publishes it when due.
            return Ok(enq);
        }
        let ack = self
            .broker
            .publish_job_confirmed(queue, &envelope, enq.generation)
            .await
            .map_err(|e| ClientError::Publish {
                id: enq.id.clone(),
                status: enq.status,
                cause: e.to_string(),
            })?;
        // Broker-loss repair tells a message still in the stream from a lost one by this.
        // Not recorded (PostgreSQL went away just now): the job may be published once more.
        if let Err(e) = self
            .store
            .job_published(&enq.id, enq.generation, ack.sequence)
            .await
        {
            tracing::debug!(job.id = %enq.id, cause = %e, "stream sequence not recorded");
        }
        Ok(enq)
    }
}

/// An enqueue's spec, as the contract reads it (every field the options set).
/// A statement's error as the client's: a taken id or key is a conflict, a refused field or
/// a missing parent invalid input (PostgreSQL's words, which name them).
fn refusal(e: tokio_postgres::Error) -> ClientError {
    match e.as_db_error() {
        Some(db) if db.code() == &tokio_postgres::error::SqlState::UNIQUE_VIOLATION => {
            ClientError::Conflict(db.message().to_string())
        }
        Some(db)
            if db.code() == &tokio_postgres::error::SqlState::INVALID_PARAMETER_VALUE
                || db.code() == &tokio_postgres::error::SqlState::FOREIGN_KEY_VIOLATION =>
        {
            ClientError::Invalid(db.message().to_string())
        }
        _ => ClientError::Store(e.into()),
    }
}

/// A bulk statement's error about `jobs[i]` of a chunk, as the position in the whole call
/// (the chunk begins after `before` jobs).
fn renumbered(e: ClientError, before: usize) -> ClientError {
    if before == 0 {
        return e;
    }
    let fix = |m: String| member_renumbered(&m, before);
    match e {
        ClientError::Conflict(m) => ClientError::Conflict(fix(m)),
        ClientError::Invalid(m) => ClientError::Invalid(fix(m)),
        other => other,
    }
}

/// `jobs[i]` in a bulk enqueue's error message as `jobs[i + before]`.
pub fn member_renumbered(message: &str, before: usize) -> String {
    match member_of(message) {
        Some(i) => message.replacen(&format!("jobs[{i}]"), &format!("jobs[{}]", i + before), 1),
        None => message.to_string(),
    }
}

/// The member a bulk enqueue's error names (`jobs[i]`, from 1), if it names one.
pub fn member_of(message: &str) -> Option<usize> {
    let (_, rest) = message.split_once("jobs[")?;
    rest.split_once(']')?.0.parse().ok()
}

fn spec_of(
    queue: &str,
    payload: Value,
    id: &str,
    opts: &EnqueueOptions,
) -> serde_json::Map<String, Value> {
    let mut spec = serde_json::Map::new();
    spec.insert("queue".into(), queue.into());
    spec.insert("payload".into(), payload);
    spec.insert("id".into(), id.into());
    let ms = |d: Duration| Value::from(d.as_millis().min(i64::MAX as u128) as i64);
    let mut put = |k: &str, v: Option<Value>| {
        if let Some(v) = v {
            spec.insert(k.into(), v);
        }
    };
    put("priority", opts.priority.map(Value::from));
    put("max_attempts", opts.max_attempts.map(Value::from));
    // A timeout under a millisecond is 0 ms, which the contract refuses by name.
    put("timeout_ms", opts.timeout.map(ms));
    put("delay_ms", opts.delay.map(ms));
    put(
        "idempotency_key",
        opts.idempotency_key.clone().map(Value::from),
    );
    put(
        "backoff",
        opts.backoff
            .map(|b| serde_json::to_value(b).expect("a backoff serialises")),
    );
    if !opts.then.is_empty() {
        put(
            "then",
            Some(serde_json::to_value(&opts.then).expect("then specs serialise")),
        );
    }
    if !opts.depends_on.is_empty() {
        put("depends_on", Some(Value::from(opts.depends_on.clone())));
    }
    // An instant before 1970 is a negative number, which the contract refuses by name.
    put(
        "expires_at_ms",
        opts.expires_at
            .map(|t| match t.duration_since(std::time::UNIX_EPOCH) {
                Ok(d) => ms(d),
                Err(e) => Value::from(-(e.duration().as_millis().min(i64::MAX as u128) as i64)),
            }),
    );
    put(
        "expires_in",
        opts.expires_in
            .map(|d| Value::from(format!("{}ns", d.as_nanos()))),
    );
    put("key", opts.key.clone().map(Value::from));
    for (field, d) in [
        ("debounce", opts.debounce),
        ("debounce_max_wait", opts.debounce_max_wait),
        ("throttle", opts.throttle),
        ("unique_for", opts.unique_for),
    ] {
        put(field, d.map(|d| Value::from(format!("{}ns", d.as_nanos()))));
    }
    spec
}

#[cfg(test)]
mod tests {
    use super::member_renumbered;

    #[test]
    fn a_bulk_error_names_the_member_by_its_position_in_the_whole_call() {
        let m = "jobwarden: field `jobs[3].priority` is invalid: 12 is not a whole number";
        assert_eq!(
            member_renumbered(m, 100_000),
            "jobwarden: field `jobs[100003].priority` is invalid: 12 is not a whole number"
        );
        let m = "jobwarden.enqueue_many: jobs[7]: job id 'a' already belongs to a job";
        assert_eq!(
            member_renumbered(m, 200_000),
            "jobwarden.enqueue_many: jobs[200007]: job id 'a' already belongs to a job"
        );
        assert_eq!(member_renumbered("no member", 5), "no member");
        assert_eq!(member_renumbered("jobs[x]", 5), "jobs[x]");
    }
}
