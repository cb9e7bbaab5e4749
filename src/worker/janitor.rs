//! The Janitor: messages no consumer will deliver — published to a queue no worker serves
//! *yet* (producers are often deployed before the workers of a new queue), to a removed
//! queue, to a typo (`jobs.emial`), or to a priority-band subject before bands exist.
//!
//! Unserved is not invalid (invariant 12). Such messages **wait** for `unserved_grace`
//! (default 1 h): each round records what waits in `unserved_subjects` (printed by
//! `jobwarden stats`) and says so in the log. Once the oldest of them is older than the
//! grace they become dead jobs that keep their own id, payload and settings, so `jobwarden
//! dlq retry` runs the real job once a pod serves the queue; only then are they deleted from
//! the stream.
//!
//! A subject counts as served when any consumer of the stream (ours or an operator's) has a
//! filter matching it, so a queue that only newer pods serve during a rolling deploy is left
//! alone. The janitor reads the stream directly (`STREAM.MSG.GET`) and creates no consumer,
//! so it can never stand in the way of a pod provisioning a queue's consumer.
//!
//! A flood of messages on distinct subjects (a producer that puts an id in the subject, a
//! fuzzer) costs a bounded amount per round, whatever its size: the subject listing (one
//! request, its counts for free) is cut at [`LISTED_SUBJECTS`]; only the
//! [`SUBJECTS_PER_ROUND`] subjects with the most messages are read, recorded and
//! dead-lettered when due (the others wait for a later round: the grace counts from when a
//! message was stored, so they are dead-lettered as soon as their turn comes); at most
//! [`ROUND_LIMIT`] messages are dead-lettered per round; the log gets one summary line per
//! round, and `/metrics` one series per queue for the [`METRIC_QUEUES`] queues with the most
//! waiting messages plus one `other` series.

use super::outage::{Outage, LOG_EVERY};
use super::producer::invalid_payload;
use super::{Shared, Stats};
use crate::broker::StoredMessage;
use crate::job::{self, MessageOrigin};
use crate::store::ClaimInput;
use futures::{StreamExt, TryStreamExt};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Most messages dead-lettered per round (every subject together).
const ROUND_LIMIT: usize = 1000;
/// Most unserved subjects read (their oldest message), recorded in `unserved_subjects` and
/// dead-lettered per round: the ones with the most messages.
pub(crate) const SUBJECTS_PER_ROUND: usize = 100;
/// Most subjects taken from the stream's subject listing per round.
pub(crate) const LISTED_SUBJECTS: usize = 10_000;
/// Queues named in `jobwarden_unserved_messages`; the rest add up in `queue="other"`.
pub(crate) const METRIC_QUEUES: usize = 10;
/// Subjects named in the round's summary log line.
const LOGGED_SUBJECTS: usize = 5;

/// What the janitor last saw waiting on subjects no worker serves, for `/metrics`.
#[derive(Debug, Default)]
pub(crate) struct UnservedView(std::sync::Mutex<UnservedSummary>);

#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct UnservedSummary {
    /// Distinct subjects with waiting messages (of those listed).
    pub subjects: u64,
    /// Waiting messages of the [`METRIC_QUEUES`] queues with the most, most first.
    pub top_queues: Vec<(String, u64)>,
    /// Waiting messages of every other queue.
    pub other: u64,
}

impl UnservedView {
    pub fn get(&self) -> UnservedSummary {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set(&self, s: UnservedSummary) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = s;
    }
}

/// Waiting messages by queue: the `top` queues with the most (ties by name), and the sum of
/// the rest.
fn summarize(prefix: &str, unserved: &[(String, usize)], top: usize) -> UnservedSummary {
    let mut by_queue: HashMap<String, u64> = HashMap::new();
    for (subject, count) in unserved {
        *by_queue.entry(queue_of(prefix, subject).0).or_default() += *count as u64;
    }
    let mut queues: Vec<(String, u64)> = by_queue.into_iter().collect();
    queues.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let other = queues.iter().skip(top).map(|q| q.1).sum();
    queues.truncate(top);
    UnservedSummary {
        subjects: unserved.len() as u64,
        top_queues: queues,
        other,
    }
}

pub(crate) struct Janitor {
    shared: Arc<Shared>,
    /// When the last summary line was logged.
    logged: Option<Instant>,
}

impl Janitor {
    pub fn new(shared: Arc<Shared>) -> Janitor {
        Janitor {
            shared,
            logged: None,
        }
    }

    pub async fn run(mut self, cancel: CancellationToken) {
        let every = self.shared.config.worker.sweep_every;
        let mut outage = Outage::new("janitor");
        // First look soon after start, then every sweep interval.
        let mut next = Duration::from_secs(1).min(every);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(next) => {}
            }
            next = match self.run_once().await {
                Ok(_) => {
                    outage.ok();
                    every
                }
                Err(e) => outage.failed(&e).max(every),
            };
        }
    }

    /// One round: records what waits on unserved subjects and dead-letters what waited
    /// longer than the grace, within the bounds above. Returns how many messages were
    /// dead-lettered.
    pub async fn run_once(&mut self) -> Result<usize, String> {
        let shared = self.shared.clone();
        let broker = &shared.broker;
        let prefix = broker.subject_prefix().to_string();
        let stream = broker.stream().await.map_err(|e| e.to_string())?;
        let (unserved, listed_all) = unserved_subjects(&stream, &prefix).await?;
        let summary = summarize(&prefix, &unserved, METRIC_QUEUES);
        let total: usize = unserved.iter().map(|u| u.1).sum();
        let now = shared.store.db_now().await.map_err(|e| e.to_string())?;
        let grace = shared.config.worker.unserved_grace;
        let mut waiting = Vec::new();
        let mut budget = ROUND_LIMIT;
        let mut dead: Vec<(&str, usize)> = Vec::new();
        for (subject, count) in unserved.iter().take(SUBJECTS_PER_ROUND) {
            let Some(first) = broker
                .first_message(&stream, subject, 1)
                .await
                .map_err(|e| e.to_string())?
            else {
                continue;
            };
            let oldest = stored_at(&first);
            let due = oldest + grace;
            let (queue, _) = queue_of(&prefix, subject);
            waiting.push((subject.clone(), queue, *count as i64, oldest, due));
            if now >= due && budget > 0 {
                let n = self
                    .dead_letter(&stream, subject, now, grace, budget)
                    .await?;
                budget -= n.min(budget);
                dead.push((subject, n));
            }
        }
        let recorded: usize = dead.iter().map(|d| d.1).sum();
        if recorded > 0 {
            let named: Vec<String> = dead
                .iter()
                .take(LOGGED_SUBJECTS)
                .map(|(s, n)| format!("{s} ({n})"))
                .collect();
            info!(messages = recorded, subjects = dead.len(), first = %named.join(", "),
                  "dead-lettered messages no worker served within unserved_grace (payload kept)");
        }
        if !waiting.is_empty() && self.logged.is_none_or(|t| t.elapsed() >= LOG_EVERY) {
            self.logged = Some(Instant::now());
            let named: Vec<String> = unserved
                .iter()
                .take(LOGGED_SUBJECTS)
                .map(|(s, n)| format!("{s} ({n})"))
                .collect();
            let oldest = waiting.iter().map(|w| w.3).min().unwrap_or(now);
            let age = now.duration_since(oldest).unwrap_or_default();
            warn!(subjects = %format!("{}{}", unserved.len(), if listed_all { "" } else { " or more" }),
                  messages = total, most = %named.join(", "), oldest = ?age, grace = ?grace,
                  "messages wait on subjects no worker serves; they become dead jobs (keeping \
                   their payload) once they have waited unserved_grace; configure the queue on \
                   a worker, or fix the producer's subject (`jobwarden stats` lists them)");
        }
        shared
            .stats
            .unserved_waiting
            .store(total as u64, std::sync::atomic::Ordering::Relaxed);
        shared.unserved.set(summary);
        shared
            .store
            .unserved_record(&waiting)
            .await
            .map_err(|e| e.to_string())?;
        Ok(recorded)
    }

    /// Dead-letters the messages of `subject` that waited longer than `grace` (at most
    /// `limit`), keeping each job's own id, payload and settings, then deletes them from the
    /// stream. Returns how many messages it took out of the stream.
    async fn dead_letter(
        &self,
        stream: &async_nats::jetstream::stream::Stream,
        subject: &str,
        now: SystemTime,
        grace: Duration,
        limit: usize,
    ) -> Result<usize, String> {
        let shared = &self.shared;
        let broker = &shared.broker;
        let prefix = broker.subject_prefix();
        let stream_name = broker.stream_name().to_string();
        let (queue, band) = queue_of(prefix, subject);
        let reason = format!(
            "no worker served queue `{queue}` (subject {subject}) within unserved_grace ({}); \
             configure [queues.{queue}] on a worker and run `jobwarden dlq retry`, or fix the \
             producer's subject",
            crate::config::fmt_dur(grace)
        );
        let messages = self
            .expired_messages(stream, subject, now, grace, limit)
            .await?;
        let (kept, invalid) = self.decode_unserved(&messages, &queue, band);
        let store = &shared.store;
        let me = &shared.worker_id;
        let reasons = vec![reason.clone(); kept.len()];
        let inserted = store
            .job_dead_kept(me, &kept, &reasons)
            .await
            .map_err(|e| e.to_string())?;
        // An id that has a row: the same job (same payload) enqueued through PostgreSQL or
        // retried from the dead-letter queue — that row is dead-lettered, no copy is made —
        // or another job, and then this message is kept under its own message id.
        let existing: Vec<(&str, &Value, &str)> = kept
            .iter()
            .filter(|k| !inserted.contains(&k.job.id))
            .map(|k| (k.job.id.as_str(), &k.job.payload, reason.as_str()))
            .collect();
        let same: HashMap<String, bool> = if existing.is_empty() {
            HashMap::new()
        } else {
            store
                .job_dead_unserved_existing(&existing)
                .await
                .map_err(|e| e.to_string())?
                .into_iter()
                .collect()
        };
        let clashes: Vec<ClaimInput> = kept
            .iter()
            .zip(&messages)
            .filter(|(k, _)| !inserted.contains(&k.job.id) && !same.contains_key(&k.job.id))
            .map(|(k, m)| {
                let mut k = k.clone();
                k.job.id = job::message_id(&MessageOrigin {
                    queue: &queue,
                    stream: &stream_name,
                    stream_seq: m.seq,
                    stored_ns: m.stored_ns,
                    msg_id: None,
                });
                k.job.idempotency_key = None;
                k
            })
            .collect();
        let mut n = inserted.len() + same.values().filter(|dead_now| **dead_now).count();
        if !clashes.is_empty() {
            let why = vec![
                format!(
                    "{reason}; its id is taken by another job, so it is kept under its message id"
                );
                clashes.len()
            ];
            n += store
                .job_dead_kept(me, &clashes, &why)
                .await
                .map_err(|e| e.to_string())?
                .len();
        }
        if !invalid.is_empty() {
            n += store
                .job_dead_invalid(me, &invalid)
                .await
                .map_err(|e| e.to_string())?
                .len();
        }
        if n > 0 {
            Stats::add(&shared.stats.unserved_dead_lettered, n as u64);
        }
        // Every message is recorded now (or was, in an earlier round): out of the stream.
        for m in &messages {
            broker
                .delete_message(stream, m.seq)
                .await
                .map_err(|e| e.to_string())?;
        }
        if n > 0 {
            for k in &kept {
                if inserted.contains(&k.job.id) || same.get(&k.job.id) == Some(&true) {
                    shared.announce_dead(&queue, &k.job.id, Some(&reason));
                }
            }
        }
        Ok(messages.len())
    }

    /// The messages of `subject` that waited longer than `grace`, oldest first, at most
    /// `limit`.
    async fn expired_messages(
        &self,
        stream: &async_nats::jetstream::stream::Stream,
        subject: &str,
        now: SystemTime,
        grace: Duration,
        limit: usize,
    ) -> Result<Vec<StoredMessage>, String> {
        let broker = &self.shared.broker;
        let mut messages: Vec<StoredMessage> = Vec::new();
        let mut from = 1;
        while messages.len() < limit {
            let Some(m) = broker
                .first_message(stream, subject, from)
                .await
                .map_err(|e| e.to_string())?
            else {
                break;
            };
            if stored_at(&m) + grace > now {
                break;
            }
            from = m.seq + 1;
            messages.push(m);
        }
        Ok(messages)
    }

    /// Decodes unserved messages as the producer would: jobs kept with their own id,
    /// payload and settings (at the priority of the band they came by), and those that
    /// cannot become jobs, recorded under their message id with the reason.
    fn decode_unserved(
        &self,
        messages: &[StoredMessage],
        queue: &str,
        band: Option<i16>,
    ) -> (Vec<ClaimInput>, Vec<crate::store::InvalidRow>) {
        let max_bytes = self.shared.config.worker.max_payload_bytes;
        let stream_name = self.shared.broker.stream_name().to_string();
        let mut kept: Vec<ClaimInput> = Vec::new();
        let mut invalid: Vec<crate::store::InvalidRow> = Vec::new();
        for m in messages {
            let msg_id = m
                .headers
                .get(async_nats::header::NATS_MESSAGE_ID)
                .map(|v| v.as_str().to_string());
            let origin = MessageOrigin {
                queue,
                stream: &stream_name,
                stream_seq: m.seq,
                stored_ns: m.stored_ns,
                msg_id: msg_id.as_deref(),
            };
            match job::decode(&m.payload, &origin, max_bytes) {
                Ok(mut job) => {
                    if let Some(p) = band {
                        job.priority = p;
                    }
                    let max_attempts = job
                        .max_attempts
                        .unwrap_or(crate::config::DEFAULT_MAX_ATTEMPTS as i32);
                    kept.push(ClaimInput {
                        job,
                        max_attempts,
                        traceparent: m.headers.get("traceparent").map(|v| v.as_str().to_string()),
                    });
                }
                Err(e) => invalid.push((
                    job::message_id(&origin),
                    queue.to_string(),
                    invalid_payload(&m.payload),
                    format!("{e} (and no worker served queue `{queue}`)"),
                    None,
                )),
            }
        }
        (kept, invalid)
    }
}

/// The subjects under `prefix` that hold messages no consumer of the stream (ours or an
/// operator's) filters, most messages first (ties by name, so consecutive rounds look at the
/// same subjects until they are dead-lettered); and whether the listing was complete.
async fn unserved_subjects(
    stream: &async_nats::jetstream::stream::Stream,
    prefix: &str,
) -> Result<(Vec<(String, usize)>, bool), String> {
    let listing = async {
        stream
            .info_with_subjects(format!("{prefix}.>"))
            .await
            .map_err(|e| e.to_string())?
            .take(LISTED_SUBJECTS)
            .try_collect::<Vec<(String, usize)>>()
            .await
            .map_err(|e| e.to_string())
    };
    let subjects = crate::broker::bounded("stream subjects", listing)
        .await
        .map_err(|e| e.to_string())?;
    let listed_all = subjects.len() < LISTED_SUBJECTS;
    let infos = crate::broker::bounded(
        "stream consumers",
        stream.consumers().try_collect::<Vec<_>>(),
    )
    .await
    .map_err(|e| e.to_string())?;
    let mut filters: Vec<String> = Vec::new();
    for c in infos {
        filters.push(c.config.filter_subject.clone());
        filters.extend(c.config.filter_subjects.iter().cloned());
    }
    let mut unserved: Vec<(String, usize)> = subjects
        .into_iter()
        .filter(|(subject, count)| {
            *count > 0 && !filters.iter().any(|f| subject_matches(f, subject))
        })
        .collect();
    unserved.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    Ok((unserved, listed_all))
}

/// When the stream stored a message.
fn stored_at(m: &StoredMessage) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_nanos(m.stored_ns.max(0) as u64)
}

/// The queue (and priority band, for `<prefix>.<queue>.<p>`) a subject stands for.
fn queue_of(prefix: &str, subject: &str) -> (String, Option<i16>) {
    let rest = subject
        .strip_prefix(prefix)
        .and_then(|r| r.strip_prefix('.'))
        .unwrap_or(subject);
    match rest.split_once('.') {
        Some((q, band)) => (
            q.to_string(),
            band.parse()
                .ok()
                .and_then(|p| crate::contract::Priority::new(p).ok())
                .map(i16::from),
        ),
        None => (rest.to_string(), None),
    }
}

/// NATS subject matching: `*` matches one token, `>` the rest (one or more tokens).
pub fn subject_matches(filter: &str, subject: &str) -> bool {
    if filter.is_empty() {
        return true; // a consumer without a filter reads the whole stream
    }
    let mut f = filter.split('.');
    let mut s = subject.split('.');
    loop {
        match (f.next(), s.next()) {
            (Some(">"), Some(_)) => return true,
            (Some("*"), Some(_)) => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{queue_of, subject_matches, summarize};

    #[test]
    fn unserved_queues_beyond_the_top_add_up_in_one_sum() {
        let subjects: Vec<(String, usize)> = vec![
            ("jobs.emial".into(), 7),
            ("jobs.emial.3".into(), 2),
            ("jobs.a".into(), 1),
            ("jobs.b".into(), 1),
            ("jobs.c".into(), 3),
        ];
        let s = summarize("jobs", &subjects, 2);
        assert_eq!(s.subjects, 5);
        assert_eq!(s.top_queues, vec![("emial".into(), 9), ("c".into(), 3)]);
        assert_eq!(s.other, 2);
    }

    #[test]
    fn matching() {
        assert!(subject_matches("jobs.email", "jobs.email"));
        assert!(!subject_matches("jobs.email", "jobs.email.3"));
        assert!(subject_matches("jobs.email.*", "jobs.email.3"));
        assert!(subject_matches("jobs.>", "jobs.email.3"));
        assert!(!subject_matches("jobs.>", "jobs"));
        assert!(!subject_matches("jobs.email", "jobs.emial"));
        assert!(subject_matches("", "jobs.x"));
    }

    #[test]
    fn subjects_name_their_queue_and_band() {
        assert_eq!(queue_of("jobs", "jobs.newq"), ("newq".into(), None));
        assert_eq!(queue_of("jobs", "jobs.email.3"), ("email".into(), Some(3)));
        assert_eq!(queue_of("jobs", "jobs.email.x"), ("email".into(), None));
    }
}
