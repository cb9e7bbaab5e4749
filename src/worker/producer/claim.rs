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

/// What a claim statement answered for its group.
pub(super) struct ClaimAnswer {
    /// One answer per input; `None` when nothing was claimed (the database is unavailable).
    pub(super) answers: Option<Answers>,
    /// How the database fared, for the outage log, when there is something to say.
    pub(super) health: Option<Result<(), String>>,
}

/// The answers of a claim that reached the database.
pub(super) struct Answers {
    /// False when this worker is not registered (declared dead): it claimed nothing.
    pub(super) registered: bool,
    /// One per input, at the same positions.
    pub(super) each: Vec<Answer>,
}

impl ClaimAnswer {
    /// Nothing claimed: the database failed with `e`.
    fn failed(e: &crate::store::StoreError) -> ClaimAnswer {
        ClaimAnswer {
            answers: None,
            health: Some(Err(e.to_string())),
        }
    }

    /// The statement ran.
    fn ran(registered: bool, each: Vec<Answer>) -> ClaimAnswer {
        ClaimAnswer {
            answers: Some(Answers { registered, each }),
            health: Some(Ok(())),
        }
    }
}

/// A claim group and its statement's answer, back in the producer.
pub(super) struct ClaimDone {
    pub(super) group: Claiming,
    pub(super) answer: ClaimAnswer,
}

pub(super) type Pending = FuturesUnordered<futures::future::BoxFuture<'static, ClaimDone>>;

/// Claims a group. When one message's data makes PostgreSQL reject the whole statement
/// (a value it cannot store), claims them one by one so only that message is refused,
/// with PostgreSQL's reason; claims already committed then are kept whatever happens to
/// the rest.
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
        Err(e) if e.rejected_data().is_none() => return ClaimAnswer::failed(&e),
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
        return ClaimAnswer::ran(true, answers);
    }
    // The rest exist already (or this worker may not claim): the full statement decides.
    let rest: Vec<ClaimInput> = inputs
        .iter()
        .zip(&fresh)
        .filter(|(_, f)| f.is_none())
        .map(|(i, _)| i.clone())
        .collect();
    let ClaimAnswer { answers, health } = claim_existing(shared, stale, &rest).await;
    let inserted = fresh.iter().any(Option::is_some);
    let (registered, mut others) = match answers {
        Some(a) => (a.registered, a.each.into_iter()),
        // The inserts are committed claims: they run; the rest goes back.
        None if inserted => (true, Vec::new().into_iter()),
        None => {
            return ClaimAnswer {
                answers: None,
                health,
            }
        }
    };
    let each = fresh
        .into_iter()
        .map(|f| match f {
            Some(c) => Answer::Claim(c),
            None => others.next().unwrap_or(Answer::NotTried),
        })
        .collect();
    ClaimAnswer {
        answers: Some(Answers { registered, each }),
        health,
    }
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
            return ClaimAnswer::ran(false, inputs.iter().map(|_| Answer::NotTried).collect());
        }
        Ok(a) => return ClaimAnswer::ran(true, a.claims.into_iter().map(Answer::Claim).collect()),
        Err(e) if e.rejected_data().is_none() => return ClaimAnswer::failed(&e),
        Err(_) => {}
    }
    let mut each = Vec::with_capacity(inputs.len());
    let mut health = None;
    // `alive`: still claiming; `registered`: the worker's row said it may.
    let (mut alive, mut registered) = (true, true);
    for input in inputs {
        if !alive {
            each.push(Answer::NotTried);
            continue;
        }
        match store
            .job_claim(me, stale, std::slice::from_ref(input))
            .await
        {
            Ok(a) if !a.alive => {
                registered = false;
                alive = false;
                each.push(Answer::NotTried);
            }
            Ok(mut a) => each.push(Answer::Claim(a.claims.remove(0))),
            Err(e) => match e.rejected_data() {
                Some(reason) => each.push(Answer::Refused(format!(
                    "PostgreSQL cannot store this job: {reason}"
                ))),
                // Gone mid-way: what was claimed stays claimed, the rest goes back.
                None => {
                    health = Some(Err(e.to_string()));
                    alive = false;
                    each.push(Answer::NotTried);
                }
            },
        }
    }
    ClaimAnswer {
        answers: Some(Answers { registered, each }),
        health,
    }
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
        let queue = self.policy.name.clone();
        let Decoded {
            inputs,
            known,
            messages,
            rejected,
            dropped,
            mismatched,
        } = self.decode(arrived);
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
            self.hand_back_group(messages, dropped, rejected).await;
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
                let answer = claim(&shared, stale, &group.inputs, &group.known).await;
                ClaimDone { group, answer }
            }
            .boxed(),
        );
    }

    /// Decodes a group's messages: the claimable ones with their claim inputs, and those
    /// whose fate is known already (invalid, a duplicate within the group, a priority that
    /// contradicts the subject).
    fn decode(&self, arrived: Vec<Delivered>) -> Decoded {
        let max_bytes = self.shared.config.worker.max_payload_bytes;
        let stream = self.shared.broker.stream_name().to_string();
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
                            priority_mismatch(&self.shared, &queue, job.priority, lane_priority);
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
        Decoded {
            inputs,
            known,
            messages,
            rejected,
            dropped,
            mismatched,
        }
    }

    /// Takes a claim's answer: runs what it claimed, acks and drops what needs nothing,
    /// keeps conflicts and invalid messages, hands the rest back. Returns how many it ran.
    pub(super) async fn finish_claim(&mut self, done: ClaimDone) -> usize {
        let ClaimDone { group, answer } = done;
        let Claiming {
            inputs,
            known: _,
            messages,
            rejected,
            dropped,
            ticket,
        } = group;
        self.claiming -= messages.len();
        match answer.health {
            Some(Ok(())) => self.claims.ok(),
            Some(Err(cause)) => {
                self.claims.failed(&cause);
            }
            None => {}
        }
        let Some(answers) = answer.answers else {
            drop(ticket);
            self.hand_back_group(messages, dropped, rejected).await;
            return 0;
        };
        if !answers.registered {
            // Others declared this worker dead: take no work until registered again.
            let shared = &self.shared;
            shared.fenced.store(true, Ordering::SeqCst);
            shared.reregister.notify_one();
            warn!(worker.id = %shared.worker_id, "claim refused: this worker is not registered (declared dead); registering again");
        }
        let mut fates = Fates {
            rejected,
            dropped,
            ..Fates::default()
        };
        // A claim that committed as the worker fenced itself off (its answer came late) must
        // not run: others may take these jobs soon. They are given back, attempt refunded.
        let stopping = self.stop.is_cancelled();
        let give_back = self.shared.fenced.load(Ordering::SeqCst) || stopping;
        for ((input, d), answer) in inputs.into_iter().zip(messages).zip(answers.each) {
            match answer {
                Answer::Claim(claim) => {
                    self.take_claim(input, d, claim, give_back, stopping, &mut fates)
                        .await
                }
                Answer::NotTried => fates.back.push(d),
                Answer::Refused(reason) => fates.rejected.push(Rejected {
                    id: self.own_id(&d),
                    reason,
                    delivered: d,
                }),
            }
        }
        // Every job this claim took is in the ledger now: the heartbeat may judge them.
        drop(ticket);
        self.settle_fates(fates).await
    }

    /// Hands every message of a group back, whatever was known of it: nothing was claimed.
    async fn hand_back_group(
        &mut self,
        messages: Vec<Delivered>,
        dropped: Vec<Delivered>,
        rejected: Vec<Rejected>,
    ) {
        let back = messages
            .into_iter()
            .chain(dropped)
            .chain(rejected.into_iter().map(|r| r.delivered));
        self.hand_back(back).await;
    }

    /// The message's own id (for keeping it dead under).
    fn own_id(&self, d: &Delivered) -> String {
        d.own_id(&self.policy.name, self.shared.broker.stream_name())
    }

    /// What one message's claim says: run its job (or give it back when this worker stops
    /// or fenced itself off), keep a message that reused a taken id, drop the rest.
    async fn take_claim(
        &mut self,
        input: ClaimInput,
        d: Delivered,
        claim: Claim,
        give_back: bool,
        stopping: bool,
        fates: &mut Fates,
    ) {
        let id = input.job.id.clone();
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
                // Owned until the release settles: in the ledger meanwhile, so a drain waits
                // for it (and counts it).
                let shared = &self.shared;
                let control = AttemptControl::new(shared.pacing.stop_grace(KILL_GRACE));
                let owned = shared.ledger.claimed(
                    &id,
                    lease,
                    self.policy.clone(),
                    d.acker(),
                    Arc::new(control),
                );
                let attempts = (attempt.max(1) as u32, max_attempts.max(1) as u32);
                release_unstarted(shared, &self.done, &owned, id, lease, attempts).await;
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
                            let reason = conflict_reason(&id, "queued");
                            let own_id = self.own_id(&d);
                            fates
                                .conflicts
                                .push((relabel(input, &own_id), reason, None));
                        }
                        (p, backoff)
                    }
                    // Created from the message: its payload moves into the job.
                    None => (input.job.payload, input.job.backoff),
                };
                let timeout = timeout_ms
                    .map(|ms| Duration::from_millis(ms.max(1) as u64))
                    .unwrap_or(self.policy.timeout);
                let job = Owned {
                    id,
                    lease,
                    attempt: attempt.max(1) as u32,
                    max_attempts: max_attempts.max(1) as u32,
                    timeout,
                    payload: job_payload,
                    backoff: job_backoff,
                    traceparent: traceparent.or(message_trace),
                };
                self.dispatch(d, job).await;
                fates.dispatched += 1;
            }
            Claim::NotClaimable {
                status,
                conflict: true,
            } => {
                let own_id = self.own_id(&d);
                let reason = conflict_reason(&id, status.as_str());
                fates
                    .conflicts
                    .push((relabel(input, &own_id), reason, Some(d)));
            }
            Claim::NotClaimable { status, .. } => {
                debug!(job.id = %id, %status, "message for a job that is not claimable; acked and dropped");
                fates.dropped.push(d);
            }
            Claim::Duplicate => fates.dropped.push(d),
            Claim::WrongQueue(other) => fates.rejected.push(Rejected {
                id: self.own_id(&d),
                reason: format!(
                    "id {id:?} belongs to a job of queue {other}; give this job another id"
                ),
                delivered: d,
            }),
        }
    }

    /// Acks what needs nothing, hands back what was not claimed, and — only now, with every
    /// claimed job recorded as owned and running — keeps conflicts and records invalid
    /// messages. Returns how many jobs were dispatched.
    async fn settle_fates(&mut self, fates: Fates) -> usize {
        let Fates {
            dispatched,
            back,
            dropped,
            rejected,
            conflicts,
        } = fates;
        self.drop_messages(dropped);
        if !back.is_empty() {
            self.hand_back(back).await;
        }
        if !conflicts.is_empty() {
            keep_conflicts(&self.shared, conflicts).await;
        }
        if !rejected.is_empty() {
            record_invalid(&self.shared, &self.policy.name, rejected).await;
        }
        dispatched
    }
}

/// A group's messages, decoded: the claimable ones (with their inputs at the same
/// positions) and the rest.
struct Decoded {
    inputs: Vec<ClaimInput>,
    /// Per input: its row probably exists (see `Claiming::known`).
    known: Vec<bool>,
    messages: Vec<Delivered>,
    rejected: Vec<Rejected>,
    dropped: Vec<Delivered>,
    /// Envelopes naming another priority than their subject's: kept as dead jobs.
    mismatched: Vec<(ClaimInput, String, Option<Delivered>)>,
}

/// Where the messages of a claim group go once its answer is in.
#[derive(Default)]
struct Fates {
    /// Jobs started (or waiting for their slot) here.
    dispatched: usize,
    /// Not claimed: back to the stream.
    back: Vec<Delivered>,
    /// Needing nothing from us (PostgreSQL holds their state): acked.
    dropped: Vec<Delivered>,
    /// Cannot run as they are: recorded as dead jobs.
    rejected: Vec<Rejected>,
    /// Reused a taken id: kept as dead jobs under their own message id, with their own
    /// payload, so a retry runs them.
    conflicts: Vec<(ClaimInput, String, Option<Delivered>)>,
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
