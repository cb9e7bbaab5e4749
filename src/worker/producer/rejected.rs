//! Messages that cannot run as they are: kept as dead jobs with their reason (a reused id,
//! a priority that contradicts the subject, data PostgreSQL refuses, an unreadable body),
//! or as poison messages when even that cannot be written. Nothing is dropped unrecorded.

use super::*;

/// A message that cannot run as it is: its id, and why.
pub(crate) struct Rejected {
    pub delivered: Delivered,
    pub id: String,
    pub reason: String,
    /// The batch it is a dead member of (schema version 34), if any.
    pub batch: Option<String>,
}

/// Why a message whose envelope names another priority than its subject's is refused.
pub(super) fn priority_mismatch(shared: &Shared, queue: &str, named: i16, lane: i16) -> String {
    let prefix = &shared.config.nats.subject_prefix;
    let came = Lane::of(queue, lane).subject(prefix);
    let right = Lane::of(queue, named).subject(prefix);
    format!(
        "field `priority` is invalid: the envelope names priority {named}, but the message was \
         published to {came} (priority {lane}); publish it to {right} (or leave the field out). \
         `jobwarden dlq retry` runs this one at priority {named}"
    )
}

/// The input of a message's own job, under its own message id (for keeping it dead).
pub(super) fn relabel(mut input: ClaimInput, own_id: &str) -> ClaimInput {
    input.job.id = own_id.to_string();
    input.job.idempotency_key = None;
    input
}

pub(super) fn conflict_reason(id: &str, status: &str) -> String {
    format!(
        "id {id:?} is already used by a {status} job with another payload (a producer reused \
         the id, or its Nats-Msg-Id, for another job); this message was kept as a dead job \
         under its own id: `jobwarden dlq retry` runs it"
    )
}

/// Keeps messages that reused a taken id as dead jobs with their own payload, then acks the
/// ones that were only waiting for that (a message whose job runs under the row's payload is
/// acked when that job settles).
pub(super) async fn keep_conflicts(
    shared: &Shared,
    items: Vec<(ClaimInput, String, Option<Delivered>)>,
) {
    keep_dead(shared, items, Kept::IdConflict).await
}

/// Why a message is kept as a dead job with its own payload.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Kept {
    /// It reused a taken id.
    IdConflict,
    /// Its envelope named another priority than its subject's.
    PriorityMismatch,
    /// Its batch refused it (schema version 34; see `members.rs`).
    BatchRefused,
}

/// Keeps messages as dead jobs with their own payload and fields (a retry runs them), then
/// acks them; naks them (they come back) when that cannot be written.
pub(super) async fn keep_dead(
    shared: &Shared,
    items: Vec<(ClaimInput, String, Option<Delivered>)>,
    why: Kept,
) {
    let (batch, rest): (Vec<ClaimInput>, Vec<(String, Option<Delivered>)>) =
        items.into_iter().map(|(i, r, d)| (i, (r, d))).unzip();
    let reasons: Vec<String> = rest.iter().map(|(r, _)| r.clone()).collect();
    let kept = shared
        .store
        .job_dead_kept(&shared.worker_id, &batch, &reasons)
        .await;
    let inserted: HashSet<String> = match &kept {
        Ok(ids) => ids.iter().cloned().collect(),
        Err(e) => {
            warn!(cause = %e, "could not keep messages that reused a taken id; they come back");
            HashSet::new()
        }
    };
    for (input, (reason, d)) in batch.into_iter().zip(rest) {
        // Not inserted but no error: this very message was kept before (its id is unique).
        let recorded = kept.is_ok();
        if recorded {
            if inserted.contains(&input.job.id) {
                match why {
                    Kept::IdConflict => {
                        Stats::add(&shared.stats.id_conflicts, 1);
                        warn!(job.id = %input.job.id, %reason, "message reused a taken id: kept as a dead job");
                    }
                    Kept::PriorityMismatch => {
                        Stats::add(&shared.stats.invalid, 1);
                        warn!(job.id = %input.job.id, %reason, "message named another priority than its subject's: kept as a dead job");
                    }
                    Kept::BatchRefused => {
                        Stats::add(&shared.stats.invalid, 1);
                        warn!(job.id = %input.job.id, batch = ?input.job.batch.as_ref().map(|b| &b.id), %reason, "message's batch refused it: kept as a dead job");
                    }
                }
                shared.announce_dead(&input.job.queue, &input.job.id, Some(&reason));
            }
            if let Some(d) = d {
                shared.outbound.ack(&d.acker(), AckKind::Ack);
            }
        } else if let Some(d) = d {
            shared
                .outbound
                .ack(&d.acker(), AckKind::Nak(Some(Duration::from_secs(5))));
        }
    }
}

/// Records messages that cannot become jobs, then acks them: as dead jobs with the reason
/// when possible, in `poison_messages` otherwise. If even that fails they are nak'd and
/// come back later; nothing is dropped without a record (invariant 9).
pub(crate) async fn record_invalid(shared: &Shared, queue: &str, items: Vec<Rejected>) {
    if items.is_empty() {
        return;
    }
    let store = &shared.store;
    let me = &shared.worker_id;
    let rows: Vec<crate::store::InvalidRow> = items
        .iter()
        .map(|r| {
            (
                r.id.clone(),
                queue.to_string(),
                invalid_payload(&r.delivered.msg.payload),
                r.reason.clone(),
                r.batch.clone(),
            )
        })
        .collect();
    let inserted: HashSet<String> = match store.job_dead_invalid(me, &rows).await {
        Ok(ids) => ids.into_iter().collect(),
        Err(e) => {
            warn!(queue = %queue, cause = %e, "could not record invalid messages as dead jobs");
            HashSet::new()
        }
    };
    // An id that was not inserted but exists is this very message, recorded before (ids of
    // invalid messages are their own stream sequence and time).
    let missing: Vec<&str> = items
        .iter()
        .filter(|r| !inserted.contains(&r.id))
        .map(|r| r.id.as_str())
        .collect();
    let existing: HashSet<String> = if missing.is_empty() {
        HashSet::new()
    } else {
        store
            .jobs_existing(&missing)
            .await
            .unwrap_or_default()
            .into_iter()
            .collect()
    };
    for r in items {
        // Recorded now: as a dead job, or, when even that cannot be written, as a poison
        // message. (One whose dead job exists already is a redelivery, counted before.)
        let new = inserted.contains(&r.id)
            || !existing.contains(&r.id)
                && store
                    .poison_insert(
                        me,
                        r.delivered.msg.subject.as_str(),
                        Some(r.delivered.seq as i64),
                        &r.reason,
                        &r.delivered.msg.payload,
                    )
                    .await
                    .is_ok();
        if new || existing.contains(&r.id) {
            if new {
                Stats::add(&shared.stats.invalid, 1);
                warn!(queue = %queue, nats.seq = r.delivered.seq, job.id = %r.id, reason = %r.reason, "invalid message recorded and acked");
            }
            shared.outbound.ack(&r.delivered.acker(), AckKind::Ack);
        } else {
            shared.outbound.ack(
                &r.delivered.acker(),
                AckKind::Nak(Some(Duration::from_secs(5))),
            );
        }
    }
}

/// What a dead job keeps of a body that could not be decoded: the body itself when it is a
/// storable JSON value, else its first 4 KiB as text.
pub(crate) fn invalid_payload(body: &[u8]) -> Value {
    if let Ok(v) = serde_json::from_slice::<Value>(body) {
        if job::check_storable(&v).is_ok() && body.len() <= 64 * 1024 {
            return json!({ "invalid_body": v, "body_bytes": body.len() });
        }
    }
    let head = &body[..body.len().min(4096)];
    let text: String = String::from_utf8_lossy(head).replace('\0', "\u{FFFD}");
    json!({ "invalid_body_text": text, "body_bytes": body.len() })
}
