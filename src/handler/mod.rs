//! Handing a job to the application: one [`Handler`] trait, three kinds behind it.
//!
//! - [`http::HttpHandler`]: POST the job to a local URL; the app reports progress on the
//!   sidecar's local API.
//! - [`exec::ExecHandler`]: run a command per job, payload on stdin, progress as JSON lines
//!   on stdout, exit code decides.
//! - any Rust type implementing [`Handler`], for programs linking jobwarden as a library.
//!
//! A handler only does the work and says how it went; settling the job (commit, then ack)
//! is the worker's business.

pub mod exec;
pub mod http;
pub(crate) mod http_client;

/// The http handler's response framing, for the fuzz target in `fuzz/` (not an API).
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing {
    pub use super::http_client::framing::{frame, Framed};
}

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Why a running attempt was stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// The job was taken from this worker (reclaimed, cancelled), or the worker fenced
    /// itself off: another worker may run it soon, so it stops quickly and settles nothing.
    Lost,
    /// Graceful shutdown or drain: the job is given back without costing an attempt.
    Shutdown,
}

/// Stops one attempt: the reason, then its cancellation token (the handler sees the
/// token; the worker reads the reason).
#[derive(Debug)]
pub struct AttemptControl {
    cancel: CancellationToken,
    reason: AtomicU8,
    /// SIGTERM→SIGKILL grace for an exec handler, in ms.
    kill_grace_ms: AtomicU64,
    /// The grace used when the attempt is lost (shorter: the job may run elsewhere soon).
    lost_grace: Duration,
    /// The deadline the handler deferred its job with ([`JobContext::defer`]), in ms; 0
    /// while it has not.
    deferred_ms: AtomicU64,
}

impl AttemptControl {
    pub fn new(lost_grace: Duration) -> AttemptControl {
        AttemptControl {
            cancel: CancellationToken::new(),
            reason: AtomicU8::new(0),
            kill_grace_ms: AtomicU64::new(exec::KILL_GRACE.as_millis() as u64),
            lost_grace,
            deferred_ms: AtomicU64::new(0),
        }
    }

    /// Stops the attempt for `why` (the first reason given wins).
    pub fn stop(&self, why: Stop) {
        let code = match why {
            Stop::Lost => 1,
            Stop::Shutdown => 2,
        };
        if self
            .reason
            .compare_exchange(0, code, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
            && why == Stop::Lost
        {
            let grace = exec::KILL_GRACE.min(self.lost_grace);
            self.kill_grace_ms
                .store(grace.as_millis() as u64, Ordering::SeqCst);
        }
        self.cancel.cancel();
    }

    /// Why the attempt was stopped, if it was.
    pub fn stopped(&self) -> Option<Stop> {
        match self.reason.load(Ordering::SeqCst) {
            1 => Some(Stop::Lost),
            2 => Some(Stop::Shutdown),
            _ => None,
        }
    }

    pub fn token(&self) -> &CancellationToken {
        &self.cancel
    }

    /// The deadline the handler deferred its job with, if it did.
    pub fn deferred(&self) -> Option<Duration> {
        match self.deferred_ms.load(Ordering::SeqCst) {
            0 => None,
            ms => Some(Duration::from_millis(ms)),
        }
    }

    /// How long an exec handler's process group gets between SIGTERM and SIGKILL now.
    pub fn kill_grace(&self) -> Duration {
        Duration::from_millis(self.kill_grace_ms.load(Ordering::SeqCst))
    }
}

/// A job handed to a handler.
#[derive(Clone)]
pub struct JobContext {
    pub id: String,
    pub queue: String,
    /// 1 for the first attempt.
    pub attempt: u32,
    pub max_attempts: u32,
    pub payload: Value,
    /// The results of the jobs this one follows, `{"<parent id>": <result>, ...}`: the job
    /// whose `then` created it, or every `depends_on` parent (null for a parent that completed
    /// without a result). `None` for a job that follows none. At most 65,536 bytes of
    /// results in all; one that does not fit is `{"omitted": "<why, where to read it>"}`.
    pub parents: Option<Value>,
    /// How long this attempt may run; the worker enforces it, handlers may pass it on.
    pub timeout: Duration,
    /// W3C trace context from the message headers, passed on to the application.
    pub traceparent: Option<String>,
    /// Base URL of the sidecar's local API (`http://127.0.0.1:7433`).
    pub api_base: String,
    /// The worker running this attempt (`<hostname>-<pid>-<hex>`).
    pub worker_id: String,
    /// Cancelled when the worker must stop this attempt (ownership lost, shutdown, cancel).
    pub cancel: CancellationToken,
    /// The fencing token of this attempt: progress reports name it, so a report from an
    /// attempt that was stopped never counts for a later one.
    pub lease: i64,
    /// The schema's completion key: [`JobContext::completion_token`] is made with it, when
    /// asked for (a handler that never defers never pays for it).
    pub(crate) completion_key: Arc<crate::completion::CompletionKey>,
    pub(crate) control: Arc<AttemptControl>,
    pub(crate) progress: Arc<dyn ProgressSink>,
}

/// A job id as one URL path segment: every byte but the unreserved ones (`A-Z a-z 0-9 - . _
/// ~`) percent-encoded, so the id comes back exactly from the local API's path (a `%`, `\`,
/// `;` or non-ASCII letter in an id included). The contract refuses `.` and `..`, which URL
/// parsers collapse even when encoded.
pub fn path_segment(id: &str) -> String {
    const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'.')
        .remove(b'_')
        .remove(b'~');
    percent_encoding::utf8_percent_encode(id, SEGMENT).to_string()
}

impl JobContext {
    /// Reports progress: refreshes the job's activity time (fenced by lease) and tells
    /// JetStream the message is still being worked on. `Err` means the job was taken away
    /// from this worker: stop working on it.
    pub async fn progress(&self, report: Progress) -> Result<(), LostOwnership> {
        self.progress.report(&self.id, self.lease, report).await
    }

    /// Where the application reports this attempt's progress over HTTP (the sidecar's local
    /// API): `<api>/v1/jobs/<id>/progress?lease=<lease>`.
    pub fn progress_url(&self) -> String {
        format!(
            "{}/v1/jobs/{}/progress?lease={}",
            self.api_base.trim_end_matches('/'),
            path_segment(&self.id),
            self.lease
        )
    }

    /// The token that completes or fails this attempt from outside once the handler has
    /// deferred it ([`JobContext::defer`]): `<lease>.<32 hex digits>`. Pass it to whatever
    /// will report the outcome (a payment provider's webhook, an approval link); see
    /// [`crate::completion`].
    pub fn completion_token(&self) -> String {
        self.completion_key.token(&self.id, self.lease)
    }

    /// Defers the job: the handler has handed the work to something that will report its
    /// outcome later, with [`JobContext::completion_token`], through `complete` or `fail`
    /// (the local API's `POST /v1/jobs/<id>/complete`, SQL `complete(id, token, result)`,
    /// `jobwarden jobs complete`, [`crate::Client::complete`]). Return what this returns:
    ///
    /// ```ignore
    /// start_payment(&job.payload, &job.completion_token()).await?;
    /// return job.defer(Duration::from_secs(900));
    /// ```
    ///
    /// The job becomes `awaiting`: its slot is freed, its message acked, no heartbeat is
    /// needed. If neither comes within `deadline` (at most 30 days), it is retried or
    /// dead-lettered by its policy. A deadline out of range is an error worth a retry.
    pub fn defer(&self, deadline: Duration) -> HandlerResult {
        let deadline = crate::completion::check_deadline(deadline).map_err(JobError::retry)?;
        let ms = u64::try_from(deadline.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        self.control.deferred_ms.store(ms, Ordering::SeqCst);
        Ok(None)
    }

    /// The deadline this attempt was deferred with, once [`JobContext::defer`] was called.
    pub fn deferred(&self) -> Option<Duration> {
        self.control.deferred()
    }

    /// Where the outcome of this attempt is reported once it has deferred (the local API):
    /// `<api>/v1/jobs/<id>/complete` (and `.../fail`); the body names the token.
    pub fn complete_url(&self) -> String {
        format!(
            "{}/v1/jobs/{}/complete",
            self.api_base.trim_end_matches('/'),
            path_segment(&self.id)
        )
    }

    /// Idempotency key for side effects of this attempt: `<job id>` is stable across retries.
    pub fn idempotency_key(&self) -> &str {
        &self.id
    }

    /// A context whose progress reports go nowhere, for unit-testing handlers.
    pub fn detached(id: &str, queue: &str, payload: Value) -> JobContext {
        struct Nowhere;
        #[async_trait]
        impl ProgressSink for Nowhere {
            async fn report(&self, _: &str, _: i64, _: Progress) -> Result<(), LostOwnership> {
                Ok(())
            }
        }
        let control = Arc::new(AttemptControl::new(exec::KILL_GRACE));
        JobContext {
            id: id.into(),
            queue: queue.into(),
            attempt: 1,
            max_attempts: 1,
            payload,
            parents: None,
            timeout: Duration::from_secs(30),
            traceparent: None,
            api_base: "http://127.0.0.1:0".into(),
            worker_id: "detached".into(),
            cancel: control.token().clone(),
            lease: 1,
            completion_key: Arc::new(crate::completion::CompletionKey::unusable()),
            control,
            progress: Arc::new(Nowhere),
        }
    }
}

/// A progress report: every field optional, the latest non-null value of each is kept.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Progress {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// The job's lease moved on to another owner; this attempt must stop.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("job {0} is no longer owned by this worker")]
pub struct LostOwnership(pub String);

/// Where progress reports go (the worker implements it with a fenced write + in-progress ack).
#[async_trait]
pub trait ProgressSink: Send + Sync {
    async fn report(&self, job_id: &str, lease: i64, report: Progress)
        -> Result<(), LostOwnership>;
}

/// How an attempt failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum JobError {
    /// Worth another attempt (after the queue's backoff, or `retry_after` when given).
    #[error("{message}")]
    Retry {
        message: String,
        retry_after: Option<Duration>,
    },
    /// Will never succeed: dead-letter now.
    #[error("{0}")]
    Permanent(String),
}

impl JobError {
    pub fn retry(message: impl Into<String>) -> JobError {
        JobError::Retry {
            message: message.into(),
            retry_after: None,
        }
    }
    pub fn permanent(message: impl Into<String>) -> JobError {
        JobError::Permanent(message.into())
    }
}

/// The result a handler returns: an optional JSON result stored on the job, or an error.
pub type HandlerResult = Result<Option<Value>, JobError>;

/// Runs jobs. Implement it to link jobwarden as a library; `http` and `exec` implement it for
/// applications in any language.
#[async_trait]
pub trait Handler: Send + Sync + 'static {
    async fn handle(&self, job: &JobContext) -> HandlerResult;

    /// True when the handler stops its own work at `job.timeout` (exec kills its process
    /// group, http aborts the request); the worker then waits a little longer before giving
    /// up on it. Otherwise the worker drops the handler's future at the timeout.
    fn enforces_timeout(&self) -> bool {
        false
    }
}

/// Any async closure `Fn(JobContext) -> Future<Output = HandlerResult>` is a handler.
pub struct FnHandler<F>(pub F);

#[async_trait]
impl<F, Fut> Handler for FnHandler<F>
where
    F: Fn(JobContext) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = HandlerResult> + Send + 'static,
{
    async fn handle(&self, job: &JobContext) -> HandlerResult {
        (self.0)(job.clone()).await
    }
}

/// Wraps an async closure as a shareable handler.
pub fn from_fn<F, Fut>(f: F) -> Arc<dyn Handler>
where
    F: Fn(JobContext) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = HandlerResult> + Send + 'static,
{
    Arc::new(FnHandler(f))
}

impl From<JobError> for crate::backoff::Outcome {
    fn from(e: JobError) -> Self {
        match e {
            JobError::Retry {
                message,
                retry_after,
            } => crate::backoff::Outcome::Retry {
                error: message,
                retry_after,
            },
            JobError::Permanent(error) => crate::backoff::Outcome::Permanent { error },
        }
    }
}
