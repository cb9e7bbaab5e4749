//! Runs one claimed job: builds its context, calls the handler under the job's timeout,
//! keeps the JetStream message alive with in-progress acks while it runs, and hands the
//! outcome to the completer.
//!
//! Progress reports (from a Rust handler, exec stdout or the local API) go through
//! [`WorkerProgress`]: a write fenced by `(worker_id, lease)` and an in-progress ack. When the
//! fence rejects the write the job was taken from us: the attempt is cancelled, nothing is
//! settled or acked, and the loss is counted (invariant 1).

use super::{completer::Finished, InFlight, Shared, Stats, RELEASE_WAIT, STOP_SHUTDOWN};
use crate::backoff::Outcome;
use crate::handler::{Handler, JobContext, LostOwnership, Progress, ProgressSink};
use crate::store::StoreError;
use async_nats::jetstream::{message::Acker, AckKind};
use async_trait::async_trait;
use serde_json::Value;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

/// Extra time the worker gives a handler past its timeout before abandoning it: handlers
/// enforce the timeout themselves (exec kills its process group), this is the backstop.
const TIMEOUT_BACKSTOP: Duration = Duration::from_secs(7);

/// A job this worker now owns.
pub(crate) struct Owned {
    pub id: String,
    pub queue: String,
    pub lease: i64,
    pub attempt: u32,
    pub max_attempts: u32,
    pub timeout: Duration,
    pub payload: Value,
    pub traceparent: Option<String>,
    pub acker: Arc<Acker>,
    /// The job's own backoff, overriding the queue's.
    pub backoff: Option<crate::backoff::Backoff>,
}

/// Runs the job to its end and sends the outcome to the completer (unless ownership was lost).
pub(crate) async fn execute(
    shared: Arc<Shared>,
    handler: Arc<dyn Handler>,
    job: Owned,
    done: mpsc::Sender<Finished>,
) {
    let cancel = CancellationToken::new();
    let stop = Arc::new(AtomicU8::new(0));
    shared.inflight.lock().expect("inflight lock").insert(
        job.id.clone(),
        InFlight {
            lease: job.lease,
            acker: job.acker.clone(),
            cancel: cancel.clone(),
            stop: stop.clone(),
        },
    );
    let ctx = JobContext {
        id: job.id.clone(),
        queue: job.queue.clone(),
        attempt: job.attempt,
        max_attempts: job.max_attempts,
        payload: job.payload,
        timeout: job.timeout,
        traceparent: job.traceparent,
        api_base: shared.api_base.clone(),
        worker_id: shared.worker_id.clone(),
        cancel: cancel.clone(),
        progress: Arc::new(WorkerProgress(shared.clone())),
    };
    let started = Instant::now();
    // In-progress acks keep JetStream from redelivering a long job (invariant 5); they say
    // nothing about the job's health, which only progress reports refresh.
    let keepalive_every = (shared.config.nats.ack_wait / 3).max(Duration::from_millis(100));
    let outcome = {
        // A panicking handler is an attempt that failed, not a lost job.
        let run =
            futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(handler.handle(&ctx)));
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
                res = &mut run => break Some(outcome_of(res)),
                _ = cancel.cancelled() => {
                    let shutdown = stop.load(Ordering::SeqCst) == STOP_SHUTDOWN;
                    // The handler saw the cancel too (exec sends its process group TERM, then
                    // KILL after a grace; http aborts the request): give it that long to stop
                    // cleanly. A Rust handler is simply dropped when its job was lost.
                    let mut late = None;
                    if shutdown || handler.enforces_timeout() {
                        if let Ok(res) = tokio::time::timeout(RELEASE_WAIT, &mut run).await {
                            late = Some(outcome_of(res));
                        }
                    }
                    // Shutdown: give the job back (unless it finished meanwhile). Lost: a
                    // result that came in anyway goes to the completer, whose fenced write
                    // rejects and records it as lost ownership.
                    break if shutdown { late.or(Some(Outcome::Released)) } else { late };
                }
                _ = &mut deadline => {
                    cancel.cancel();
                    break Some(Outcome::Retry {
                        error: format!("timed out after {}", crate::config::fmt_dur(job.timeout)),
                        retry_after: None,
                    });
                }
                _ = keepalive.tick() => {
                    // Bounded: a disconnected client must not stall the timeout and cancel arms.
                    let ack = job.acker.ack_with(AckKind::Progress);
                    match tokio::time::timeout(Duration::from_secs(1), ack).await {
                        Ok(Err(e)) => debug!(job.id = %job.id, cause = %e, "in-progress ack failed"),
                        Err(_) => debug!(job.id = %job.id, "in-progress ack timed out"),
                        Ok(Ok(())) => {}
                    }
                }
            }
        }
    };
    {
        // Only our own entry: a newer attempt of the same job may have replaced it.
        let mut map = shared.inflight.lock().expect("inflight lock");
        if map.get(&job.id).is_some_and(|f| f.lease == job.lease) {
            map.remove(&job.id);
        }
    }
    // A handler that noticed the cancel may have returned an error before the executor saw
    // the cancel itself: what counts is why the attempt was stopped.
    let outcome = match (stop.load(Ordering::SeqCst), outcome) {
        (_, Some(Outcome::Success(r))) => Some(Outcome::Success(r)),
        (STOP_SHUTDOWN, _) => Some(Outcome::Released),
        (_, other) => other,
    };
    match outcome {
        Some(outcome) => {
            let finished = Finished {
                id: job.id,
                queue: job.queue,
                lease: job.lease,
                attempt: job.attempt,
                max_attempts: job.max_attempts,
                outcome,
                acker: job.acker,
                backoff: job.backoff,
                elapsed: started.elapsed(),
            };
            // The completer only goes away at the very end of a shutdown.
            let _ = done.send(finished).await;
        }
        None => {
            let mut owned = shared.owned.lock().expect("owned lock");
            if owned.get(&job.id) == Some(&job.lease) {
                owned.remove(&job.id);
            }
            drop(owned);
            warn!(job.id = %job.id, job.lease = job.lease, worker.id = %shared.worker_id,
                  "attempt stopped: ownership lost; not settling and not acking");
        }
    }
}

/// What a handler's (panic-guarded) future produced.
fn outcome_of(
    res: Result<crate::handler::HandlerResult, Box<dyn std::any::Any + Send>>,
) -> Outcome {
    match res {
        Ok(Ok(result)) => Outcome::Success(result),
        Ok(Err(e)) => e.into(),
        Err(_) => Outcome::Retry {
            error: "the handler panicked".into(),
            retry_after: None,
        },
    }
}

/// Progress reports from handlers: fenced write, then in-progress ack.
pub(crate) struct WorkerProgress(pub Arc<Shared>);

#[async_trait]
impl ProgressSink for WorkerProgress {
    async fn report(&self, job_id: &str, report: Progress) -> Result<(), LostOwnership> {
        report_progress(&self.0, job_id, &report).await
    }
}

/// Records a progress report for a job running in this worker. Shared by handlers and the
/// local API. `Err` when the job is not ours (any more).
pub(crate) async fn report_progress(
    shared: &Shared,
    job_id: &str,
    report: &Progress,
) -> Result<(), LostOwnership> {
    let (lease, acker, cancel) = {
        let map = shared.inflight.lock().expect("inflight lock");
        match map.get(job_id) {
            Some(f) => (f.lease, f.acker.clone(), f.cancel.clone()),
            None => return Err(LostOwnership(job_id.to_string())),
        }
    };
    let written = shared
        .store
        .job_progress(
            job_id,
            &shared.worker_id,
            lease,
            report.stage.as_deref(),
            report.progress,
            report.message.as_deref(),
        )
        .await;
    match written {
        Ok(()) => {
            let _ = acker.ack_with(AckKind::Progress).await;
            Ok(())
        }
        Err(StoreError::LostOwnership { .. }) => {
            Stats::add(&shared.stats.lost_ownership, 1);
            warn!(job.id = %job_id, job.lease = lease, worker.id = %shared.worker_id,
                  "progress write rejected: job was taken from this worker");
            cancel.cancel();
            Err(LostOwnership(job_id.to_string()))
        }
        Err(e) => {
            // A database blip must not stop healthy work; the report is simply not recorded.
            warn!(job.id = %job_id, cause = %e, "progress not recorded");
            let _ = acker.ack_with(AckKind::Progress).await;
            Ok(())
        }
    }
}
