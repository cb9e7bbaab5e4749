//! Slots: a claimed job runs in one of the queue's `concurrency` slots; one claimed ahead
//! waits for the next to free (or goes back); the slot frees, and the producer hears of it,
//! however the job's task ends.

use super::*;

/// How a job claimed ahead of its slot stopped waiting for one.
pub(super) enum Waited {
    Slot(OwnedSemaphorePermit),
    /// No slot freed within HOLD_MAX.
    TimedOut,
    /// The attempt was stopped, or the worker drains.
    Stopped,
}

/// Jobs that ended since the producer last looked, and the bell that wakes it for them.
pub(crate) struct Freed {
    pub(super) rung: Notify,
    pub(super) ended: std::sync::atomic::AtomicUsize,
    /// Jobs that ended within SHORT_JOB since the last one that did not.
    pub(super) short_run: std::sync::atomic::AtomicUsize,
    /// Jobs claimed ahead that wait for a slot.
    pub(super) waiting: std::sync::atomic::AtomicUsize,
    /// The producer's queue (for the log).
    pub(super) queue: String,
}

impl Freed {
    /// How many jobs ended since the last call.
    pub(super) fn take(&self) -> usize {
        self.ended.swap(0, Ordering::AcqRel)
    }
}

/// Frees a job's slot and tells its producer when the job's task ends, however it ends (a
/// panic outside the handler's own guard included).
pub(super) struct JobEnd {
    pub(super) permit: Option<OwnedSemaphorePermit>,
    pub(super) freed: Arc<Freed>,
    pub(super) started: Instant,
}

impl Drop for JobEnd {
    fn drop(&mut self) {
        if std::thread::panicking() {
            error!(queue = %self.freed.queue, "a job task panicked");
        }
        drop(self.permit.take());
        if self.started.elapsed() <= SHORT_JOB {
            self.freed.short_run.fetch_add(1, Ordering::Relaxed);
        } else {
            self.freed.short_run.store(0, Ordering::Relaxed);
        }
        self.freed.ended.fetch_add(1, Ordering::AcqRel);
        self.freed.rung.notify_one();
    }
}

/// Runs a job holding its slot; the slot frees (and the producer hears of it) at the end.
/// A job claimed ahead has no slot yet: it waits for one, and if none frees within HOLD_MAX
/// (or the attempt was stopped meanwhile) it is given back, its attempt refunded, and never
/// runs here.
pub(super) async fn run_in_slot(
    shared: Arc<Shared>,
    attempt: crate::worker::ledger::Attempt,
    job: Owned,
    done: mpsc::Sender<Finished>,
    (permit, slots): (Option<OwnedSemaphorePermit>, Arc<Semaphore>),
    freed: Arc<Freed>,
    stored_ns: i128,
) {
    let permit = match permit {
        Some(p) => p,
        None => {
            // The wait ends early when the attempt is stopped (taken from this worker, or
            // released at the end of a drain's grace) and when the worker starts to drain: a
            // job that has not started yet goes back at once for another worker to run.
            let got = tokio::select! {
                biased;
                _ = attempt.control.token().cancelled() => Waited::Stopped,
                _ = shared.fetch_cancel.cancelled() => Waited::Stopped,
                p = tokio::time::timeout(HOLD_MAX, slots.acquire_owned()) => match p {
                    Ok(Ok(p)) => Waited::Slot(p),
                    Ok(Err(_closed)) => Waited::Stopped,
                    Err(_elapsed) => Waited::TimedOut,
                },
            };
            freed.waiting.fetch_sub(1, Ordering::AcqRel);
            match (got, attempt.control.stopped()) {
                (Waited::Slot(p), None) => p,
                (_, Some(Stop::Lost)) => {
                    // Taken from this worker meanwhile: nothing to settle or ack (as for an
                    // attempt that was running).
                    shared.ledger.settled(&job.id, job.lease);
                    freed.rung.notify_one();
                    return;
                }
                (got, _) => {
                    if matches!(got, Waited::TimedOut) {
                        // No slot freed in a second: the jobs are not short any more. Claim
                        // nothing ahead until a group of short ones has ended again (else
                        // jobs would go back and forth every second behind long ones).
                        freed.short_run.store(0, Ordering::Relaxed);
                        debug!(job.id = %job.id, job.lease = job.lease, "claimed ahead and no slot freed in time: giving it back");
                    }
                    let attempts = (job.attempt, job.max_attempts);
                    release_unstarted(&shared, &done, &attempt, job.id, job.lease, attempts).await;
                    freed.rung.notify_one();
                    return;
                }
            }
        }
    };
    Stats::add(&shared.stats.claimed, 1);
    let m = &attempt.policy.metrics;
    m.started.inc();
    if stored_ns > 0 {
        let now_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as i128)
            .unwrap_or(0);
        m.wait.observe((now_ns - stored_ns).max(0) as f64 / 1e9);
    }
    let _end = JobEnd {
        permit: Some(permit),
        freed,
        started: Instant::now(),
    };
    execute(shared, attempt, job, done, stored_ns).await;
}

/// Gives back a claimed attempt that never started (the worker stopped or fenced itself off
/// as it was claimed, or it was claimed ahead and no slot freed): it leaves the running set of
/// the ledger, and the completer releases it (attempt refunded) before acking its message.
pub(super) async fn release_unstarted(
    shared: &Shared,
    done: &mpsc::Sender<Finished>,
    attempt: &crate::worker::ledger::Attempt,
    id: String,
    lease: i64,
    attempts: (u32, u32),
) {
    shared.ledger.finished(&id, lease);
    let released = Finished::released(
        id,
        attempt.policy.clone(),
        lease,
        attempts,
        attempt.acker.clone(),
    );
    let _ = done.send(released).await;
}

impl Producer {
    /// Records a claimed job in the ledger and runs it in its slot: at once when one is
    /// free; a job claimed ahead (see SHORT_JOB) takes the next one to free.
    pub(super) async fn dispatch(&mut self, d: Delivered, job: Owned) {
        let shared = &self.shared;
        let stored_ns = d.stored_ns;
        let control = Arc::new(AttemptControl::new(shared.pacing.stop_grace(KILL_GRACE)));
        let attempt = shared.ledger.claimed(
            &job.id,
            job.lease,
            self.policy.clone(),
            Some(d.acker()),
            control,
        );
        self.spawn_job(attempt, job, stored_ns);
    }

    /// Runs an owned job (in the ledger already) in its slot: at once when one is free, else
    /// in the next to free. `stored_ns`: since when it waited (for the wait histogram).
    pub(super) fn spawn_job(
        &mut self,
        attempt: crate::worker::ledger::Attempt,
        job: Owned,
        stored_ns: i128,
    ) {
        let shared = &self.shared;
        let permit = self.slots.clone().try_acquire_owned().ok();
        if permit.is_none() {
            self.freed.waiting.fetch_add(1, Ordering::AcqRel);
        }
        self.jobs.spawn(shared.supervisor.job(run_in_slot(
            shared.clone(),
            attempt,
            job,
            self.done.clone(),
            (permit, self.slots.clone()),
            self.freed.clone(),
            stored_ns,
        )));
    }
}
