//! Runs one claimed job: builds its context, calls the handler under the job's timeout,
//! keeps the JetStream message alive with in-progress acks while it runs, and hands the
//! outcome to the completer.
//!
//! Progress reports (from a Rust handler, exec stdout or the local API) go through
//! [`report_progress`]: they name the attempt (job id and lease), are matched against the
//! [ledger](super::ledger), written fenced by `(worker_id, lease)` (moving the job's stale
//! deadline by the queue's `stale_after`), and followed by an in-progress ack. When the
//! fence rejects the write the job was taken from us: the attempt is stopped, nothing is
//! settled or acked, and the loss is counted (invariant 1).

use super::completer::Finished;
use super::ledger::Attempt;
use super::{Shared, Stats, RELEASE_WAIT};
use crate::backoff::Outcome;
use crate::handler::{JobContext, LostOwnership, Progress, ProgressSink, Stop};
use crate::store::StoreError;
use async_nats::jetstream::AckKind;
use async_trait::async_trait;
use serde_json::Value;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tracing::warn;

/// Extra time the worker gives a handler past its timeout before abandoning it: handlers
/// enforce the timeout themselves (exec kills its process group), this is the backstop.
const TIMEOUT_BACKSTOP: Duration = Duration::from_secs(7);

/// A job this worker now owns, as the claim answered.
pub(crate) struct Owned {
    pub id: String,
    pub lease: i64,
    pub attempt: u32,
    pub max_attempts: u32,
    pub timeout: Duration,
    pub payload: Value,
    pub traceparent: Option<String>,
    /// The job's own backoff, overriding the queue's.
    pub backoff: Option<crate::backoff::Backoff>,
    /// Its parents' results (`JobContext::parents`).
    pub parents: Option<Value>,
}

/// Runs the job to its end and sends the outcome to the completer (unless ownership was lost).
// One attempt from start to hand-over, read top to bottom: a line over the limit.
#[allow(clippy::too_many_lines)]
pub(crate) async fn execute(
    shared: Arc<Shared>,
    attempt: Attempt,
    job: Owned,
    done: mpsc::Sender<Finished>,
    stored_ns: i128,
) {
    let policy = attempt.policy.clone();
    let handler = policy.handler.clone();
    let control = attempt.control.clone();
    // Its trace (when traced): the handler gets the run's own context, so its spans are the
    // run's children.
    let (mut span, traceparent) = trace_attempt(&shared, &policy.name, &job, stored_ns);
    let ctx = JobContext {
        id: job.id.clone(),
        queue: policy.name.clone(),
        attempt: job.attempt,
        max_attempts: job.max_attempts,
        payload: job.payload,
        parents: job.parents,
        timeout: job.timeout,
        traceparent,
        api_base: shared.api_base.clone(),
        worker_id: shared.worker_id.clone(),
        cancel: control.token().clone(),
        lease: job.lease,
        completion_key: shared.completion_key.clone(),
        control: control.clone(),
        progress: Arc::new(WorkerProgress(shared.clone())),
    };
    shared.ledger.started(&job.id, job.lease);
    let started = Instant::now();
    // In-progress acks keep JetStream from redelivering a long job (invariant 5); they say
    // nothing about the job's health, which only progress reports refresh.
    let keepalive_every = (shared.config.nats.ack_wait / 3).max(Duration::from_millis(100));
    let outcome = if control.stopped().is_some() {
        // Stopped before its handler started (taken from this worker, or released, while it
        // waited to be spawned): it does not start at all.
        None
    } else {
        // A panicking handler is an attempt that failed (retried, with the panic's message),
        // not a lost job and not a failure of the worker: one job's data must not stop the
        // others (invariant 13). Panics in the executor's own code around it are the
        // executor's failure (see `supervisor`).
        let run = super::supervisor::caught(futures::FutureExt::catch_unwind(
            std::panic::AssertUnwindSafe(handler.handle(&ctx)),
        ));
        tokio::pin!(run);
        let limit = if handler.enforces_timeout() {
            job.timeout + TIMEOUT_BACKSTOP
        } else {
            job.timeout
        };
        let deadline = tokio::time::sleep(limit);
        tokio::pin!(deadline);
        let mut keepalive = tokio::time::interval_at(
            tokio::time::Instant::now() + keepalive_every,
            keepalive_every,
        );
        loop {
            tokio::select! {
                res = &mut run => break Some(outcome_of(res, &control)),
                _ = control.token().cancelled() => {
                    let shutdown = control.stopped() == Some(Stop::Shutdown);
                    // The handler saw the cancel too (exec sends its process group TERM, then
                    // KILL after a grace; http aborts the request): give it that long to stop
                    // cleanly. A Rust handler is simply dropped when its job was lost.
                    let mut late = None;
                    if shutdown || handler.enforces_timeout() {
                        if let Ok(res) = tokio::time::timeout(RELEASE_WAIT, &mut run).await {
                            late = Some(outcome_of(res, &control));
                        }
                    }
                    // Shutdown: give the job back (unless it finished meanwhile). Lost: a
                    // result that came in anyway goes to the completer, whose fenced write
                    // rejects and records it as lost ownership.
                    break if shutdown { late.or(Some(Outcome::Released)) } else { late };
                }
                _ = &mut deadline => {
                    control.token().cancel();
                    break Some(Outcome::Retry {
                        error: format!("timed out after {}", crate::config::fmt_dur(job.timeout)),
                        retry_after: None,
                    });
                }
                _ = keepalive.tick() => {
                    shared.outbound.ack_job(&attempt.acker, AckKind::Progress);
                }
            }
        }
    };
    // A handler that noticed the cancel may have returned an error before the executor saw
    // the cancel itself: what counts is why the attempt was stopped.
    // A lost attempt's own error (it saw the cancel) is no result; only a success (or a
    // deferral: the work went on elsewhere) that came in anyway goes on, to be recorded as a
    // late result the fence rejects.
    let outcome = match (control.stopped(), outcome) {
        (_, Some(Outcome::Success(r))) => Some(Outcome::Success(r)),
        (_, Some(Outcome::Deferred { deadline })) => Some(Outcome::Deferred { deadline }),
        (Some(Stop::Shutdown), _) => Some(Outcome::Released),
        (Some(Stop::Lost), _) => None,
        (None, other) => other,
    };
    run_ended(&mut span, &outcome);
    match outcome {
        Some(outcome) => {
            shared.ledger.finished(&job.id, job.lease);
            let finished = Finished {
                id: job.id,
                policy,
                lease: job.lease,
                attempt: job.attempt,
                max_attempts: job.max_attempts,
                outcome,
                acker: attempt.acker,
                backoff: job.backoff,
                elapsed: started.elapsed(),
                span,
            };
            // The completer only goes away at the very end of a shutdown.
            let _ = done.send(finished).await;
        }
        None => {
            shared.ledger.settled(&job.id, job.lease);
            warn!(job.id = %job.id, job.lease = job.lease, worker.id = %shared.worker_id,
                  "attempt stopped: ownership lost; not settling and not acking");
        }
    }
}

/// The run is over with `outcome`: its span says so (with the handler's error, if any). A
/// span dropped unsettled (its ownership lost) ends as `lost`.
fn run_ended(span: &mut Option<crate::telemetry::AttemptSpan>, outcome: &Option<Outcome>) {
    if let Some(span) = span.as_mut() {
        let failed = match outcome {
            Some(Outcome::Retry { error, .. } | Outcome::Permanent { error }) => {
                Some(error.as_str())
            }
            _ => None,
        };
        span.run_ended(failed);
    }
}

/// The attempt's `process` span (and, on a first attempt, its job's span from `stored_ns`,
/// when the stream stored its message), when traces are on and the job's trace is sampled;
/// and the `traceparent` its handler is given: the run's own, else the job's.
fn trace_attempt(
    shared: &Shared,
    queue: &str,
    job: &Owned,
    stored_ns: i128,
) -> (Option<crate::telemetry::AttemptSpan>, Option<String>) {
    let span = attempt_span(shared, queue, job, stored_ns);
    let traceparent = span
        .as_ref()
        .map(crate::telemetry::AttemptSpan::traceparent)
        .or_else(|| job.traceparent.clone());
    (span, traceparent)
}

fn attempt_span(
    shared: &Shared,
    queue: &str,
    job: &Owned,
    stored_ns: i128,
) -> Option<crate::telemetry::AttemptSpan> {
    // Most jobs are not traced: decided before anything is built for the spans.
    if !shared.telemetry.traces(&job.id, job.traceparent.as_deref()) {
        return None;
    }
    let subject = format!("{}.{queue}", shared.broker.subject_prefix());
    let queued_since = (stored_ns > 0).then(|| {
        std::time::SystemTime::UNIX_EPOCH
            + Duration::from_nanos(stored_ns.min(u64::MAX as i128) as u64)
    });
    shared.telemetry.attempt(
        &crate::telemetry::JobRef {
            id: &job.id,
            queue,
            subject: &subject,
            traceparent: job.traceparent.as_deref(),
        },
        job.attempt,
        job.max_attempts,
        queued_since,
    )
}

/// What a handler's (panic-guarded) future produced: a success after `job.defer()` is a
/// deferral.
fn outcome_of(
    res: Result<crate::handler::HandlerResult, Box<dyn std::any::Any + Send>>,
    control: &crate::handler::AttemptControl,
) -> Outcome {
    match res {
        Ok(Ok(result)) => match control.deferred() {
            Some(deadline) => Outcome::Deferred { deadline },
            None => Outcome::Success(result),
        },
        Ok(Err(e)) => e.into(),
        Err(panic) => Outcome::Retry {
            error: format!(
                "the handler panicked: {}",
                super::supervisor::panic_message(panic.as_ref())
            ),
            retry_after: None,
        },
    }
}

/// Progress reports from handlers: fenced write, then in-progress ack.
pub(crate) struct WorkerProgress(pub Arc<Shared>);

#[async_trait]
impl ProgressSink for WorkerProgress {
    async fn report(
        &self,
        job_id: &str,
        lease: i64,
        report: Progress,
    ) -> Result<(), LostOwnership> {
        report_progress(&self.0, job_id, lease, &report).await
    }
}

/// Records a progress report for attempt `(job_id, lease)` running in this worker. Shared by
/// handlers and the local API. `Err` when that attempt is not ours (any more).
pub(crate) async fn report_progress(
    shared: &Shared,
    job_id: &str,
    lease: i64,
    report: &Progress,
) -> Result<(), LostOwnership> {
    let Some((acker, policy)) = shared.ledger.progressed(job_id, lease) else {
        return Err(LostOwnership(job_id.to_string()));
    };
    let written = shared
        .store
        .job_progress(
            job_id,
            &shared.worker_id,
            lease,
            policy.stale_after,
            report.stage.as_deref(),
            report.progress,
            report.message.as_deref(),
        )
        .await;
    match written {
        Ok(()) => {
            shared.progress_outage.lock().expect("outage lock").ok();
            shared.outbound.ack_job(&acker, AckKind::Progress);
            Ok(())
        }
        Err(StoreError::LostOwnership { .. }) => {
            Stats::add(&shared.stats.lost_ownership, 1);
            warn!(job.id = %job_id, job.lease = lease, worker.id = %shared.worker_id,
                  "progress write rejected: job was taken from this worker");
            if shared.ledger.lost(job_id, lease) {
                Stats::add(&shared.stats.overlapping, 1);
            }
            Err(LostOwnership(job_id.to_string()))
        }
        Err(e) => {
            // A database blip must not stop healthy work; the report is simply not recorded
            // (said once per outage, not per report of every running job).
            let cause = format!("job {job_id}: {e}");
            shared
                .progress_outage
                .lock()
                .expect("outage lock")
                .failed(&cause);
            shared.outbound.ack_job(&acker, AckKind::Progress);
            Ok(())
        }
    }
}
