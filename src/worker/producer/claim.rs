//! A claim group's way: decoded (`decode.rs`), sent as one statement (`statement.rs`), and
//! its answer taken in here: jobs dispatched, the rest acked, kept, recorded or handed back.

use super::*;
use tracing::{debug, info};

/// What became of one message of a claim group.
pub(super) enum Answer {
    Claim(Claim),
    /// PostgreSQL refused this message's data: recorded as invalid.
    Refused(String),
    /// Not claimed (the database went away mid-way, this worker is not registered, or the
    /// queue is paused): handed back to the stream.
    NotTried,
}

/// A claim group on its way to PostgreSQL: the messages it claims (with their inputs at the
/// same positions), and those it already knows the fate of.
pub(super) struct Claiming {
    /// How many messages it counted in `Producer::claiming` when it was sent.
    pub(super) counted: usize,
    pub(super) inputs: Vec<ClaimInput>,
    /// Per input: its row probably exists (a redelivery, a job republished from its row, or
    /// one with an idempotency key), so the claim's plain insert is not tried for it.
    pub(super) known: Vec<bool>,
    pub(super) messages: Vec<Delivered>,
    pub(super) rejected: Vec<Rejected>,
    pub(super) dropped: Vec<Delivered>,
    /// Rejected messages whose body names a batch, by their position in `rejected` (see
    /// `members.rs`).
    pub(super) salvaged: Vec<(usize, crate::contract::BatchDecl)>,
    /// Members their batch refused: kept as dead jobs under their ids (see `members.rs`).
    pub(super) refused_members: Vec<(ClaimInput, String, Option<Delivered>)>,
    /// Held until the claim's answer is taken in (see `Ledger::claim_ticket`).
    pub(super) ticket: crate::worker::ledger::ClaimTicket,
    /// When its statement was sent: the jobs' stale deadlines count from about then.
    pub(super) sent: Instant,
    /// A keyed queue's intake: how many of its jobs it may start at once (free slots
    /// promised to it until it answers).
    pub(super) starts: usize,
    /// A capped or rate-limited queue's claim: the grants its messages use (see `Flow`).
    pub(super) grants: usize,
}

/// A claim group and its statement's answer, back in the producer.
pub(super) struct ClaimDone {
    pub(super) group: Claiming,
    pub(super) answer: ClaimAnswer,
}

pub(super) type Pending = FuturesUnordered<futures::future::BoxFuture<'static, ClaimDone>>;

impl Producer {
    /// Decodes a group of messages and starts its claim statement; returns without waiting
    /// for it unless `CLAIMS_IN_FLIGHT` are already out (then it finishes the first to answer).
    pub(super) async fn start_claim(&mut self, arrived: Vec<Delivered>, grants: usize) {
        let shared = self.shared.clone();
        let queue = self.policy.name.clone();
        let Decoded {
            inputs,
            known,
            messages,
            mut rejected,
            dropped,
            mismatched,
            salvaged,
        } = self.decode(arrived);
        if !mismatched.is_empty() {
            keep_dead(&shared, mismatched, Kept::PriorityMismatch).await;
        }
        if inputs.is_empty() {
            self.grants_used(grants, 0);
            judge_salvaged(&shared, &mut rejected, &salvaged).await;
            record_invalid(&shared, &queue, rejected).await;
            self.drop_messages(dropped);
            return;
        }
        // A worker fenced off (or declared dead) claims nothing: hand the messages back.
        if shared.fenced.load(Ordering::SeqCst) {
            self.grants_used(grants, 0);
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
        // A keyed queue's intake may start as many jobs as there are slots free (and, while
        // its jobs are short, a claim group more: see SHORT_JOB) and not promised to another
        // intake in flight.
        let starts = if self.keyed.is_some() {
            (self.slots.available_permits() + self.ahead())
                .saturating_sub(self.starting + self.freed.waiting.load(Ordering::Acquire))
                .min(messages.len())
        } else {
            0
        };
        self.starting += starts;
        let group = Claiming {
            counted: messages.len(),
            inputs,
            known,
            messages,
            rejected,
            dropped,
            salvaged,
            refused_members: Vec::new(),
            ticket: shared.ledger.claim_ticket(),
            sent: Instant::now(),
            starts,
            grants,
        };
        let stale = self.policy.stale_after;
        let expire = self.policy.expire_after;
        let keys = self.policy.keys;
        self.pending.push(
            async move {
                let mut group = group;
                // Members of batches first (none in most groups: no statement then).
                if let Err(e) = judge_group(&shared, &mut group).await {
                    let answer = ClaimAnswer::failed(&e);
                    return ClaimDone { group, answer };
                }
                if group.inputs.is_empty() {
                    let answer = ClaimAnswer::ran(true, Vec::new());
                    return ClaimDone { group, answer };
                }
                let answer = match keys {
                    Some(rules) => {
                        let seqs: Vec<i64> = group
                            .messages
                            .iter()
                            .map(|d| d.seq.min(i64::MAX as u64) as i64)
                            .collect();
                        let batch = (&group.inputs[..], &group.known[..], &seqs[..]);
                        intake(&shared, rules, (stale, expire), batch, group.starts).await
                    }
                    None => claim(&shared, (stale, expire), &group.inputs, &group.known).await,
                };
                ClaimDone { group, answer }
            }
            .boxed(),
        );
    }

    /// Takes a claim's answer: runs what it claimed, acks and drops what needs nothing,
    /// keeps conflicts and invalid messages, hands the rest back. Returns how many it ran.
    pub(super) async fn finish_claim(&mut self, done: ClaimDone) -> usize {
        let ClaimDone { group, answer } = done;
        let grants = group.grants;
        let ran = self.take_answer(group, answer).await;
        self.grants_used(grants, ran);
        ran
    }

    /// A claim's grants are spent: `ran` of them started jobs, the rest go back.
    fn grants_used(&mut self, grants: usize, ran: usize) {
        if let Some(f) = self.flow.as_mut() {
            f.used(grants, ran);
        }
    }

    /// [`Self::finish_claim`] but for the grants.
    async fn take_answer(&mut self, group: Claiming, answer: ClaimAnswer) -> usize {
        let Claiming {
            counted,
            inputs,
            known: _,
            messages,
            rejected,
            dropped,
            salvaged: _,
            refused_members,
            ticket,
            sent,
            starts,
            grants: _,
        } = group;
        self.claiming -= counted;
        self.starting -= starts;
        match answer.health {
            Some(Ok(())) => self.claims.ok(),
            Some(Err(cause)) => {
                self.claims.failed(&cause);
            }
            None => {}
        }
        let Some(answers) = answer.answers else {
            drop(ticket);
            // (Members their batch refused come back too, and are judged again.)
            let back = messages
                .into_iter()
                .chain(refused_members.into_iter().filter_map(|(_, _, d)| d))
                .collect();
            self.hand_back_group(back, dropped, rejected).await;
            return 0;
        };
        if !answers.registered {
            // Others declared this worker dead: take no work until registered again.
            let shared = &self.shared;
            shared.fenced.store(true, Ordering::SeqCst);
            shared.reregister.notify_one();
            warn!(worker.id = %shared.worker_id, "claim refused: this worker is not registered (declared dead); registering again");
        }
        if answers.paused && !self.policy.paused.swap(true, Ordering::SeqCst) {
            tracing::info!(queue = %self.policy.name, "queue paused: its messages wait in the stream until it is resumed");
        }
        // A keyed queue's intake parked some of its jobs: the slots may take them now.
        if let Some(k) = self.keyed.as_mut() {
            if answers
                .each
                .iter()
                .any(|a| !matches!(a, Answer::Claim(Claim::Claimed { .. })))
            {
                k.nudge();
            }
        }
        if !refused_members.is_empty() {
            keep_dead(&self.shared, refused_members, Kept::BatchRefused).await;
        }
        let mut fates = Fates {
            rejected,
            dropped,
            ..Fates::default()
        };
        // A claim that committed as the worker fenced itself off (its answer came late) must
        // not run: others may take these jobs soon. They are given back, attempt refunded.
        // So must a claim answered so late that its jobs' stale deadlines (counted by the
        // database from the statement's start) are half gone: another worker's stale sweep
        // may take them while their handlers start here (a stalled database, a long wait).
        let give_back = if self.stop.is_cancelled() {
            Some(GiveBack::Stopping)
        } else if self.shared.fenced.load(Ordering::SeqCst) {
            Some(GiveBack::Fenced)
        } else if sent.elapsed() > self.policy.stale_after / 2 {
            Some(GiveBack::Late)
        } else {
            None
        };
        if self.shared.telemetry.is_on() {
            self.trace_claim(sent, &inputs, &answers.each);
        }
        for ((input, d), answer) in inputs.into_iter().zip(messages).zip(answers.each) {
            match answer {
                Answer::Claim(claim) => {
                    self.take_claim(input, d, claim, give_back, &mut fates)
                        .await
                }
                Answer::NotTried => fates.back.push(d),
                Answer::Refused(reason) => {
                    let batch = input.job.batch.map(|b| b.id);
                    fates.rejected.push(self.rejected(d, reason, batch));
                }
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

    /// A message that cannot run as it is, kept dead under its own id with `reason` (a dead
    /// member of `batch`, if it names one: its batch does not wait for it).
    /// The claim's `receive` span, linked to the traced jobs it claimed.
    fn trace_claim(&self, sent: Instant, inputs: &[ClaimInput], answers: &[Answer]) {
        let queue = &self.policy.name;
        let subject = format!("{}.{queue}", self.shared.broker.subject_prefix());
        let claimed: Vec<crate::telemetry::JobRef<'_>> = inputs
            .iter()
            .zip(answers)
            .filter_map(|(input, answer)| match answer {
                Answer::Claim(Claim::Claimed { traceparent, .. }) => {
                    Some(crate::telemetry::JobRef {
                        id: &input.job.id,
                        queue,
                        subject: &subject,
                        traceparent: traceparent.as_deref().or(input.traceparent.as_deref()),
                    })
                }
                _ => None,
            })
            .collect();
        let started = std::time::SystemTime::now()
            .checked_sub(sent.elapsed())
            .unwrap_or_else(std::time::SystemTime::now);
        self.shared
            .telemetry
            .claimed(queue, &subject, started, &claimed);
    }

    fn rejected(&self, d: Delivered, reason: String, batch: Option<String>) -> Rejected {
        Rejected {
            id: self.own_id(&d),
            reason,
            batch,
            delivered: d,
        }
    }

    /// The message's own id (for keeping it dead under).
    fn own_id(&self, d: &Delivered) -> String {
        d.own_id(&self.policy.name, self.shared.broker.stream_name())
    }

    /// A message whose job the claim ended as expired: counted, and acked with the rest.
    fn expired(&self, id: &str, d: Delivered) -> Delivered {
        info!(job.id = %id, queue = %self.policy.name, "job expired before it started: ended cancelled, message acked");
        self.policy.metrics.expired.inc();
        d
    }

    /// A message whose job its throttle ended as it came: acked, counted.
    fn throttled(&self, id: &str, d: Delivered) -> Delivered {
        debug!(job.id = %id, queue = %self.policy.name, "job throttled (its key ran a job within the window): ended cancelled, message acked");
        self.policy.metrics.throttled.inc();
        d
    }

    /// What one message's claim says: run its job (or give it back when this worker stops
    /// or fenced itself off), keep a message that reused a taken id, drop the rest.
    async fn take_claim(
        &mut self,
        input: ClaimInput,
        d: Delivered,
        claim: Claim,
        give_back: Option<GiveBack>,
        fates: &mut Fates,
    ) {
        let id = input.job.id.clone();
        match claim {
            Claim::Claimed {
                lease,
                attempt,
                max_attempts,
                ..
            } if give_back.is_some() => {
                match give_back {
                    Some(GiveBack::Stopping) => {
                        debug!(job.id = %id, job.lease = lease, "claimed as this worker stopped: giving it back")
                    }
                    Some(GiveBack::Fenced) => {
                        warn!(job.id = %id, job.lease = lease, "claimed as this worker fenced itself off: giving it back")
                    }
                    _ => {
                        warn!(job.id = %id, job.lease = lease, "claim answered after half of stale_after: giving it back")
                    }
                }
                // Owned until the release settles: in the ledger meanwhile, so a drain waits
                // for it (and counts it).
                let shared = &self.shared;
                let control = AttemptControl::new(shared.pacing.stop_grace(KILL_GRACE));
                let owned = shared.ledger.claimed(
                    &id,
                    lease,
                    self.policy.clone(),
                    Some(d.acker()),
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
                parents,
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
                    parents,
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
            Claim::Expired => fates.dropped.push(self.expired(&id, d)),
            Claim::Throttled => fates.dropped.push(self.throttled(&id, d)),
            Claim::Duplicate => fates.dropped.push(d),
            Claim::WrongQueue(other) => fates.rejected.push(self.rejected(
                d,
                format!("id {id:?} belongs to a job of queue {other}; give this job another id"),
                input.job.batch.map(|b| b.id),
            )),
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

/// Why a claimed job is given back instead of run.
#[derive(Clone, Copy)]
enum GiveBack {
    /// The worker stops.
    Stopping,
    /// The worker fenced itself off: others are about to declare it dead.
    Fenced,
    /// The answer came after half of the queue's stale_after.
    Late,
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
