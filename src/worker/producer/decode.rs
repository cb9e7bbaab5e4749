//! Decoding a group of delivered messages into claim inputs, by the job contract: the
//! claimable ones, and those whose fate is known before any statement (invalid — a key
//! `key_from` finds but the contract refuses among them —, a duplicate within the group, a
//! priority its subject contradicts).

use super::*;

/// A group's messages, decoded: the claimable ones (with their inputs at the same
/// positions) and the rest.
pub(super) struct Decoded {
    pub(super) inputs: Vec<ClaimInput>,
    /// Per input: its row probably exists (see `Claiming::known`).
    pub(super) known: Vec<bool>,
    pub(super) messages: Vec<Delivered>,
    pub(super) rejected: Vec<Rejected>,
    pub(super) dropped: Vec<Delivered>,
    /// Envelopes naming another priority than their subject's: kept as dead jobs.
    pub(super) mismatched: Vec<(ClaimInput, String, Option<Delivered>)>,
    /// Refused messages whose body names a batch (schema version 34), by their position in
    /// `rejected`: kept as dead members of it when it is open (see `members.rs`).
    pub(super) salvaged: Vec<(usize, crate::contract::BatchDecl)>,
}

/// A message jobwarden republished from the job's row (the scheduler, for a retry, a due or
/// an SQL-enqueued job): `Nats-Msg-Id: <id>:<generation>`.
pub(crate) fn republished(msg_id: &str, id: &str) -> bool {
    msg_id
        .strip_prefix(id)
        .and_then(|rest| rest.strip_prefix(':'))
        .is_some_and(|g| !g.is_empty() && g.bytes().all(|b| b.is_ascii_digit()))
}

/// A message that cannot become a job (kept dead under `id`, its own), and the batch its
/// body names, if any (a dead member of it, see `members.rs`).
fn refuse(
    rejected: &mut Vec<Rejected>,
    salvaged: &mut Vec<(usize, crate::contract::BatchDecl)>,
    (id, delivered): (String, Delivered),
    reason: String,
    batch: Option<crate::contract::BatchDecl>,
) {
    if let Some(b) = batch {
        salvaged.push((rejected.len(), b));
    }
    rejected.push(Rejected {
        id,
        reason,
        batch: None,
        delivered,
    });
}

impl Producer {
    /// Decodes a group's messages: the claimable ones with their claim inputs, and those
    /// whose fate is known already (invalid, a duplicate within the group, a priority that
    /// contradicts the subject).
    pub(super) fn decode(&self, arrived: Vec<Delivered>) -> Decoded {
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
        let mut salvaged = Vec::new();
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
                    // The queue's default expiry, for a message that carries none: counted
                    // from when the stream stored it (the time it was enqueued).
                    if job.expires_at_ms.is_none() {
                        job.expires_at_ms = self
                            .policy
                            .expire_after
                            .map(|e| job::stored_ms(&origin).saturating_add(e.as_millis() as i64));
                    }
                    let again = msg_id.as_deref().is_some_and(|m| republished(m, &job.id));
                    // The queue's key_from, for a message whose envelope names no key: a value
                    // the contract refuses there makes the message invalid, as any field.
                    let taken = self
                        .policy
                        .take_key(&mut job, again, |h| d.header(h))
                        .and_then(|()| self.policy.gate_job(&mut job, again));
                    if let Err(e) = taken {
                        let batch = job.batch.take();
                        let id = d.own_id(&queue, &stream);
                        refuse(&mut rejected, &mut salvaged, (id, d), e.to_string(), batch);
                        continue;
                    }
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
                    known.push(d.delivered > 1 || job.idempotency_key.is_some() || again);
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
                Err(e) => {
                    let batch = job::batch_of_refused(&d.msg.payload);
                    let id = d.own_id(&queue, &stream);
                    refuse(&mut rejected, &mut salvaged, (id, d), e.to_string(), batch);
                }
            }
        }
        Decoded {
            inputs,
            known,
            messages,
            rejected,
            dropped,
            mismatched,
            salvaged,
        }
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
