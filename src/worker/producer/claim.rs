//! The claim pipeline: a group of delivered messages becomes claimed jobs in one
//! statement (one by one only when PostgreSQL refuses one message's data), and its answer
//! is taken in: jobs dispatched, the rest acked, kept, recorded or handed back.

use super::*;

/// What became of one message of a claim group.
pub(super) enum Answer {
    Claim(Claim),
    /// PostgreSQL refused this message's data: recorded as invalid.
    Refused(String),
    /// Not claimed (the database went away mid-way, or this worker is not registered):
    /// handed back to the stream.
    NotTried,
}

/// A claim group on its way to PostgreSQL: the messages it claims (with their inputs at the
/// same positions), and those it already knows the fate of.
pub(super) struct Claiming {
    pub(super) inputs: Vec<ClaimInput>,
    /// Per input: its row probably exists (a redelivery, a job republished from its row, or
    /// one with an idempotency key), so the claim's plain insert is not tried for it.
    pub(super) known: Vec<bool>,
    pub(super) messages: Vec<Delivered>,
    pub(super) rejected: Vec<Rejected>,
    pub(super) dropped: Vec<Delivered>,
    /// Held until the claim's answer is taken in (see `Ledger::claim_ticket`).
    pub(super) ticket: crate::worker::ledger::ClaimTicket,
}

/// A claim's answers (none when nothing was claimed; the flag false when this worker is not
/// registered), and how the database fared (for the outage log).
pub(super) type ClaimAnswer = (Option<(bool, Vec<Answer>)>, Option<Result<(), String>>);
pub(super) type ClaimDone = (
    Claiming,
    Option<(bool, Vec<Answer>)>,
    Option<Result<(), String>>,
);
pub(super) type Pending = FuturesUnordered<futures::future::BoxFuture<'static, ClaimDone>>;

/// Claims a group. When one message's data makes PostgreSQL reject the whole statement
/// (a value it cannot store), claims them one by one so only that message is refused,
/// with PostgreSQL's reason; claims already committed then are kept whatever happens to
/// the rest. `None` when nothing was claimed (the database is unavailable); the flag is
/// false when this worker is not registered. Also says how the database fared (for the
/// outage log), when there is something to say.
pub(super) async fn claim(
    shared: &Shared,
    stale: Duration,
    inputs: &[ClaimInput],
    known: &[bool],
) -> ClaimAnswer {
    // The common case first: the messages are new jobs, and one plain insert claims them.
    // Messages whose rows probably exist go straight to the full claim: one of them would make
    // the insert fail as a whole (it then claims nothing, and the full claim takes them all).
    let new: Vec<usize> = (0..inputs.len()).filter(|&i| !known[i]).collect();
    if new.is_empty() {
        return claim_existing(shared, stale, inputs).await;
    }
    let subset: Vec<ClaimInput>;
    let to_insert = if new.len() == inputs.len() {
        inputs
    } else {
        subset = new.iter().map(|&i| inputs[i].clone()).collect();
        &subset[..]
    };
    let fresh = match shared
        .store
        .job_claim_new(&shared.worker_id, stale, to_insert)
        .await
    {
        Ok(fresh) => fresh,
        Err(e) if e.rejected_data().is_none() => return (None, Some(Err(e.to_string()))),
        // One message's data was refused: the full claim finds which.
        Err(_) => return claim_existing(shared, stale, inputs).await,
    };
    let fresh = if new.len() == inputs.len() {
        fresh
    } else {
        let mut all = vec![None; inputs.len()];
        for (i, f) in new.into_iter().zip(fresh) {
            all[i] = f;
        }
        all
    };
    if fresh.iter().all(Option::is_some) {
        let answers = fresh.into_iter().flatten().map(Answer::Claim).collect();
        return (Some((true, answers)), Some(Ok(())));
    }
    // The rest exist already (or this worker may not claim): the full statement decides.
    let rest: Vec<ClaimInput> = inputs
        .iter()
        .zip(&fresh)
        .filter(|(_, f)| f.is_none())
        .map(|(i, _)| i.clone())
        .collect();
    let (answered, health) = claim_existing(shared, stale, &rest).await;
    let inserted = fresh.iter().any(Option::is_some);
    let (alive, mut others) = match answered {
        Some((alive, answers)) => (alive, answers.into_iter()),
        // The inserts are committed claims: they run; the rest goes back.
        None if inserted => (true, Vec::new().into_iter()),
        None => return (None, health),
    };
    let answers = fresh
        .into_iter()
        .map(|f| match f {
            Some(c) => Answer::Claim(c),
            None => others.next().unwrap_or(Answer::NotTried),
        })
        .collect();
    (Some((alive, answers)), health)
}

/// The full claim (`job_claim.sql`): new jobs and existing rows alike.
pub(super) async fn claim_existing(
    shared: &Shared,
    stale: Duration,
    inputs: &[ClaimInput],
) -> ClaimAnswer {
    let store = &shared.store;
    let me = &shared.worker_id;
    match store.job_claim(me, stale, inputs).await {
        // Not registered: the statement wrote nothing, every message goes back.
        Ok(a) if !a.alive => {
            return (
                Some((false, inputs.iter().map(|_| Answer::NotTried).collect())),
                Some(Ok(())),
            );
        }
        Ok(a) => {
            return (
                Some((true, a.claims.into_iter().map(Answer::Claim).collect())),
                Some(Ok(())),
            );
        }
        Err(e) if e.rejected_data().is_none() => return (None, Some(Err(e.to_string()))),
        Err(_) => {}
    }
    let mut out = Vec::with_capacity(inputs.len());
    let mut health = None;
    // `alive`: still claiming; `registered`: the worker's row said it may.
    let (mut alive, mut registered) = (true, true);
    for input in inputs {
        if !alive {
            out.push(Answer::NotTried);
            continue;
        }
        match store
            .job_claim(me, stale, std::slice::from_ref(input))
            .await
        {
            Ok(a) if !a.alive => {
                registered = false;
                alive = false;
                out.push(Answer::NotTried);
            }
            Ok(mut a) => out.push(Answer::Claim(a.claims.remove(0))),
            Err(e) => match e.rejected_data() {
                Some(reason) => out.push(Answer::Refused(format!(
                    "PostgreSQL cannot store this job: {reason}"
                ))),
                // Gone mid-way: what was claimed stays claimed, the rest goes back.
                None => {
                    health = Some(Err(e.to_string()));
                    alive = false;
                    out.push(Answer::NotTried);
                }
            },
        }
    }
    (Some((registered, out)), health)
}

/// A message jobwarden republished from the job's row (the scheduler, for a retry, a due or
/// an SQL-enqueued job): `Nats-Msg-Id: <id>:<generation>`.
pub(super) fn republished(msg_id: &str, id: &str) -> bool {
    msg_id
        .strip_prefix(id)
        .and_then(|rest| rest.strip_prefix(':'))
        .is_some_and(|g| !g.is_empty() && g.bytes().all(|b| b.is_ascii_digit()))
}

impl Producer {
    /// Decodes a group of messages and starts its claim statement; returns without waiting
    /// for it unless `CLAIMS_IN_FLIGHT` are already out (then it finishes the first to answer).
    pub(super) async fn start_claim(&mut self, arrived: Vec<Delivered>) {
        let shared = self.shared.clone();
        let max_bytes = shared.config.worker.max_payload_bytes;
        let stream = shared.broker.stream_name().to_string();
        let queue = self.policy.name.clone();
        // The claimable messages, and their claim inputs at the same positions.
        let mut inputs: Vec<ClaimInput> = Vec::with_capacity(arrived.len());
        let mut known: Vec<bool> = Vec::with_capacity(arrived.len());
        let mut messages: Vec<Delivered> = Vec::with_capacity(arrived.len());
        let mut rejected: Vec<Rejected> = Vec::new();
        let mut dropped: Vec<Delivered> = Vec::new();
        let mut mismatched = Vec::new();
        let mut seen = HashSet::with_capacity(arrived.len());
        for d in arrived {
            let msg_id = d.header(async_nats::header::NATS_MESSAGE_ID.as_ref());
            let origin = MessageOrigin {
                queue: &queue,
                stream: &stream,
                stream_seq: d.seq,
                stored_ns: d.stored_ns,
                msg_id: msg_id.as_deref(),
            };
            match job::decode(&d.msg.payload, &origin, max_bytes) {
                Ok(mut job) if seen.insert(job.id.clone()) => {
                    // The subject a message came by is its priority: the lane it is delivered
                    // in. An envelope naming another one could not be honoured (JetStream has
                    // the message in that lane's order already), so it is refused, saying
                    // which subject to publish it to; stored, it would run at one priority and
                    // say another.
                    let lane_priority = d.band.map_or(job::DEFAULT_PRIORITY, i16::from);
                    if job.priority_named && job.priority != lane_priority {
                        let reason =
                            priority_mismatch(&shared, &queue, job.priority, lane_priority);
                        let max_attempts =
                            job.max_attempts.unwrap_or(self.policy.max_attempts as i32);
                        let own = d.own_id(&queue, &stream);
                        let input = ClaimInput {
                            job,
                            max_attempts,
                            traceparent: None,
                        };
                        mismatched.push((relabel(input, &own), reason, Some(d)));
                        continue;
                    }
                    job.priority = lane_priority;
                    let max_attempts = job.max_attempts.unwrap_or(self.policy.max_attempts as i32);
                    // A job with an idempotency key may be a duplicate by design.
                    known.push(
                        d.delivered > 1
                            || job.idempotency_key.is_some()
                            || msg_id.as_deref().is_some_and(|m| republished(m, &job.id)),
                    );
                    inputs.push(ClaimInput {
                        job,
                        max_attempts,
                        traceparent: d
                            .header("traceparent")
                            .filter(|t| crate::contract::traceparent(t).is_some()),
                    });
                    messages.push(d);
                }
                Ok(_) => dropped.push(d),
                Err(e) => rejected.push(Rejected {
                    id: d.own_id(&queue, &stream),
                    reason: e.to_string(),
                    delivered: d,
                }),
            }
        }
        if !mismatched.is_empty() {
            keep_dead(&shared, mismatched, Kept::PriorityMismatch).await;
        }
        if inputs.is_empty() {
            record_invalid(&shared, &queue, rejected).await;
            self.drop_messages(dropped);
            return;
        }
        // A worker fenced off (or declared dead) claims nothing: hand the messages back.
        if shared.fenced.load(Ordering::SeqCst) {
            let back = messages
                .into_iter()
                .chain(dropped)
                .chain(rejected.into_iter().map(|r| r.delivered));
            self.hand_back(back).await;
            return;
        }
        while self.pending.len() >= CLAIMS_IN_FLIGHT {
            let Some(done) = self.pending.next().await else {
                break;
            };
            self.finish_claim(done).await;
        }
        self.claiming += messages.len();
        // How many of these have no slot of their own yet (claimed ahead, see SHORT_JOB).
        let taken =
            self.policy.concurrency - self.slots.available_permits().min(self.policy.concurrency);
        let promised =
            taken + self.claiming + self.ready.len() + self.freed.waiting.load(Ordering::Acquire);
        let beyond = promised.saturating_sub(self.policy.concurrency);
        Stats::add(
            &shared.stats.claimed_ahead,
            beyond.min(messages.len()) as u64,
        );
        let group = Claiming {
            inputs,
            known,
            messages,
            rejected,
            dropped,
            ticket: shared.ledger.claim_ticket(),
        };
        let stale = self.policy.stale_after;
        self.pending.push(
            async move {
                let (answered, health) = claim(&shared, stale, &group.inputs, &group.known).await;
                (group, answered, health)
            }
            .boxed(),
        );
    }

    /// Takes a claim's answer: runs what it claimed, acks and drops what needs nothing,
    /// keeps conflicts and invalid messages, hands the rest back. Returns how many it ran.
    pub(super) async fn finish_claim(&mut self, done: ClaimDone) -> usize {
        let (group, answered, health) = done;
        let Claiming {
            inputs,
            known: _,
            messages,
            mut rejected,
            mut dropped,
            ticket,
        } = group;
        self.claiming -= messages.len();
        match health {
            Some(Ok(())) => self.claims.ok(),
            Some(Err(cause)) => {
                self.claims.failed(&cause);
            }
            None => {}
        }
        let shared = self.shared.clone();
        let stream = shared.broker.stream_name().to_string();
        let queue = self.policy.name.clone();
        let Some((alive, claims)) = answered else {
            drop(ticket);
            let back = messages
                .into_iter()
                .chain(dropped)
                .chain(rejected.into_iter().map(|r| r.delivered));
            self.hand_back(back).await;
            return 0;
        };
        if !alive {
            // Others declared this worker dead: take no work until registered again.
            shared.fenced.store(true, Ordering::SeqCst);
            shared.reregister.notify_one();
            warn!(worker.id = %shared.worker_id, "claim refused: this worker is not registered (declared dead); registering again");
        }
        // A claim that committed as the worker fenced itself off (its answer came late) must
        // not run: others may take these jobs soon. They are given back, attempt refunded.
        let stopping = self.stop.is_cancelled();
        let give_back = shared.fenced.load(Ordering::SeqCst) || stopping;
        let mut dispatched = 0;
        let mut back = Vec::new();
        // Messages of other jobs that reused a taken id: kept as dead jobs under their own
        // message id, with their own payload, so a retry runs them.
        let mut conflicts: Vec<(ClaimInput, String, Option<Delivered>)> = Vec::new();
        for ((input, d), answer) in inputs.into_iter().zip(messages).zip(claims) {
            let id = input.job.id.clone();
            let claim = match answer {
                Answer::Claim(c) => c,
                Answer::NotTried => {
                    back.push(d);
                    continue;
                }
                Answer::Refused(reason) => {
                    rejected.push(Rejected {
                        id: d.own_id(&queue, &stream),
                        reason,
                        delivered: d,
                    });
                    continue;
                }
            };
            match claim {
                Claim::Claimed {
                    lease,
                    attempt,
                    max_attempts,
                    ..
                } if give_back => {
                    if stopping {
                        debug!(job.id = %id, job.lease = lease, "claimed as this worker stopped: giving it back");
                    } else {
                        warn!(job.id = %id, job.lease = lease, "claimed as this worker fenced itself off: giving it back");
                    }
                    // Owned until the release settles: in the ledger meanwhile, so a drain
                    // waits for it (and counts it).
                    let control = AttemptControl::new(shared.pacing.stop_grace(KILL_GRACE));
                    let owned = shared.ledger.claimed(
                        &id,
                        lease,
                        self.policy.clone(),
                        d.acker(),
                        Arc::new(control),
                    );
                    let attempts = (attempt.max(1) as u32, max_attempts.max(1) as u32);
                    release_unstarted(&shared, &self.done, &owned, id, lease, attempts).await;
                }
                Claim::Claimed {
                    lease,
                    attempt,
                    max_attempts,
                    timeout_ms,
                    payload,
                    backoff,
                    traceparent,
                    conflict,
                } => {
                    let message_trace = input.traceparent.clone();
                    let (job_payload, job_backoff) = match payload {
                        // The row existed: PostgreSQL holds the job. A message with another
                        // payload is another job that reused the id: kept, not lost.
                        Some(p) => {
                            if conflict {
                                let own_id = d.own_id(&queue, &stream);
                                let reason = conflict_reason(&id, "queued");
                                conflicts.push((relabel(input, &own_id), reason, None));
                            }
                            (p, backoff)
                        }
                        // Created from the message: its payload moves into the job.
                        None => (input.job.payload, input.job.backoff),
                    };
                    self.dispatch(
                        d,
                        Owned {
                            id,
                            lease,
                            attempt: attempt.max(1) as u32,
                            max_attempts: max_attempts.max(1) as u32,
                            timeout: timeout_ms
                                .map(|ms| Duration::from_millis(ms.max(1) as u64))
                                .unwrap_or(self.policy.timeout),
                            payload: job_payload,
                            backoff: job_backoff,
                            traceparent: traceparent.or(message_trace),
                        },
                    )
                    .await;
                    dispatched += 1;
                }
                Claim::NotClaimable {
                    status,
                    conflict: true,
                } => {
                    let own_id = d.own_id(&queue, &stream);
                    let reason = conflict_reason(&id, status.as_str());
                    conflicts.push((relabel(input, &own_id), reason, Some(d)));
                }
                Claim::NotClaimable { status, .. } => {
                    debug!(job.id = %id, %status, "message for a job that is not claimable; acked and dropped");
                    dropped.push(d);
                }
                Claim::Duplicate => dropped.push(d),
                Claim::WrongQueue(other) => rejected.push(Rejected {
                    id: d.own_id(&queue, &stream),
                    reason: format!(
                        "id {id:?} belongs to a job of queue {other}; give this job another id"
                    ),
                    delivered: d,
                }),
            }
        }
        // Every job this claim took is in the ledger now: the heartbeat may judge them.
        drop(ticket);
        self.drop_messages(dropped);
        if !back.is_empty() {
            self.hand_back(back).await;
        }
        // Only now, with every claimed job recorded as owned and running.
        if !conflicts.is_empty() {
            keep_conflicts(&shared, conflicts).await;
        }
        if !rejected.is_empty() {
            record_invalid(&shared, &queue, rejected).await;
        }
        dispatched
    }
}

#[cfg(test)]
mod tests {
    use super::republished;

    #[test]
    fn a_message_id_with_the_jobs_generation_marks_a_republish() {
        assert!(republished("order-1:1", "order-1"));
        assert!(republished("order-1:42", "order-1"));
        // What producers send: the id alone, another id, or a suffix that is not a generation.
        assert!(!republished("order-1", "order-1"));
        assert!(!republished("order-1:", "order-1"));
        assert!(!republished("order-1:x2", "order-1"));
        assert!(!republished("order-12:1", "order-1"));
        assert!(!republished("other:1", "order-1"));
    }
}
