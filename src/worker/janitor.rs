//! The Janitor: finds messages no consumer will ever deliver — published to a queue no
//! worker serves (`jobs.emial` for `jobs.email`, a queue removed from the configuration, a
//! priority-band subject before bands exist) — and records each as a `dead` job with the
//! reason, so a typo in a producer shows up in the dead-letter queue instead of sitting in
//! the stream forever (invariant 9).
//!
//! A subject counts as served when any consumer of the stream (ours or an operator's) has a
//! filter matching it, so a queue that only newer pods serve during a rolling deploy is left
//! alone. To read an orphan subject the janitor creates a short-lived consumer filtered on
//! exactly that subject, drains it, and deletes it again.

use super::producer::{record_invalid, Delivered};
use super::Shared;
use async_nats::jetstream::consumer;
use futures::{StreamExt, TryStreamExt};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Most messages read from one orphan subject per round.
const ROUND_LIMIT: usize = 1000;

pub(crate) struct Janitor {
    shared: Arc<Shared>,
}

impl Janitor {
    pub fn new(shared: Arc<Shared>) -> Janitor {
        Janitor { shared }
    }

    pub async fn run(self, cancel: CancellationToken) {
        let every = self.shared.config.worker.sweep_every;
        // First look soon after start, then every sweep interval.
        let mut next = Duration::from_secs(1).min(every);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(next) => {}
            }
            next = every;
            if let Err(e) = self.run_once().await {
                warn!(cause = %e, "janitor round failed");
            }
        }
    }

    /// One round: returns how many orphan messages were recorded.
    pub async fn run_once(&self) -> Result<usize, String> {
        let broker = &self.shared.broker;
        let prefix = &self.shared.config.nats.subject_prefix;
        let stream = broker.stream().await.map_err(|e| e.to_string())?;
        let subjects: Vec<(String, usize)> = stream
            .info_with_subjects(format!("{prefix}.>"))
            .await
            .map_err(|e| e.to_string())?
            .try_collect()
            .await
            .map_err(|e| e.to_string())?;
        if subjects.is_empty() {
            return Ok(0);
        }
        let filters: Vec<String> = stream
            .consumers()
            .map_ok(|c| c.config.filter_subject)
            .try_collect()
            .await
            .map_err(|e| e.to_string())?;
        let mut recorded = 0;
        for (subject, count) in subjects {
            if count == 0 || filters.iter().any(|f| subject_matches(f, &subject)) {
                continue;
            }
            recorded += self.drain(&stream, prefix, &subject).await?;
        }
        Ok(recorded)
    }

    async fn drain(
        &self,
        stream: &async_nats::jetstream::stream::Stream,
        prefix: &str,
        subject: &str,
    ) -> Result<usize, String> {
        let queue = subject
            .strip_prefix(&format!("{prefix}."))
            .unwrap_or(subject)
            .to_string();
        let name = format!(
            "jobwarden-orphans-{}",
            queue.replace(|c: char| !c.is_ascii_alphanumeric() && c != '-', "_")
        );
        let reason = if queue.contains('.') {
            format!(
                "no consumer serves subject {subject}; publish to {prefix}.<queue> (priority \
                 band subjects are not served yet)"
            )
        } else {
            format!(
                "queue `{queue}` is not configured on any worker (no consumer serves subject \
                 {subject}); add a [queues.{queue}] section, or fix the producer's subject"
            )
        };
        let c: consumer::PullConsumer = stream
            .create_consumer(consumer::pull::Config {
                durable_name: Some(name.clone()),
                filter_subject: subject.to_string(),
                ack_policy: consumer::AckPolicy::Explicit,
                ack_wait: Duration::from_secs(30),
                max_deliver: -1,
                ..Default::default()
            })
            .await
            .map_err(|e| format!("orphan consumer for {subject}: {e}"))?;
        let mut items = Vec::new();
        let mut batch = c
            .fetch()
            .max_messages(ROUND_LIMIT)
            .messages()
            .await
            .map_err(|e| e.to_string())?;
        while let Some(Ok(m)) = batch.next().await {
            let seq = m.info().map(|i| i.stream_sequence).unwrap_or(0);
            let id = format!("{}-{seq}", self.shared.broker.stream_name());
            items.push((Delivered { body: m, seq }, id, reason.clone()));
        }
        let n = items.len();
        if n > 0 {
            info!(%subject, messages = n, "dead-lettering messages no consumer serves");
            // Confirmed acks: the consumer is deleted right after, and an unconfirmed ack
            // could arrive after it, leaving the message in the stream.
            record_invalid(&self.shared, &queue, items, true).await;
        }
        // Gone again at once, so it never stands in the way of a real consumer for this queue.
        let _ = stream.delete_consumer(&name).await;
        Ok(n)
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
    use super::subject_matches;

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
}
