//! Bulk actions by filter (`bulk_actions`, migrations/V19): cancel, retry or discard every job
//! matching a queue, a status, a range of enqueue times and a text, in batches, taking at
//! most as many jobs as the operator was shown, each action recorded with who did it.

use super::sql;
use super::{Result, Store};
use crate::job::JobStatus;
use serde::Serialize;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Jobs changed per statement (each batch its own transaction).
pub const BULK_BATCH: i64 = 1000;
/// The pause between batches, so that a large action leaves room to the hot path.
const BULK_PAUSE: Duration = Duration::from_millis(20);

/// What a bulk action does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BulkAction {
    /// Unfinished jobs never run (a running one is stopped); their dependents are cancelled.
    Cancel,
    /// Dead jobs get fresh attempts (same id, history kept).
    Retry,
    /// Dead or cancelled jobs are deleted.
    Discard,
}

impl BulkAction {
    pub fn as_str(self) -> &'static str {
        match self {
            BulkAction::Cancel => "cancel",
            BulkAction::Retry => "retry",
            BulkAction::Discard => "discard",
        }
    }

    pub fn parse(s: &str) -> Option<BulkAction> {
        [BulkAction::Cancel, BulkAction::Retry, BulkAction::Discard]
            .into_iter()
            .find(|a| a.as_str() == s)
    }

    /// The statuses it takes.
    pub fn statuses(self) -> &'static [JobStatus] {
        match self {
            BulkAction::Cancel => &[
                JobStatus::Waiting,
                JobStatus::Queued,
                JobStatus::Scheduled,
                JobStatus::Processing,
                JobStatus::Awaiting,
            ],
            BulkAction::Retry => &[JobStatus::Dead],
            BulkAction::Discard => &[JobStatus::Dead, JobStatus::Cancelled],
        }
    }

    /// `Err` (saying which it takes) when it cannot act on jobs of `status`.
    pub fn check(self, status: JobStatus) -> std::result::Result<(), String> {
        if self.statuses().contains(&status) {
            return Ok(());
        }
        let takes: Vec<&str> = self.statuses().iter().map(|s| s.as_str()).collect();
        Err(format!(
            "a bulk {} takes {} jobs, not {}: set the status to {}",
            self.as_str(),
            takes.join(" or "),
            status.as_str(),
            takes.join(", ")
        ))
    }
}

/// Which jobs a bulk action takes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BulkFilter {
    pub status: JobStatus,
    pub queue: Option<String>,
    /// Enqueued at or after (seconds since the Unix epoch).
    pub since: Option<f64>,
    /// Enqueued before (seconds since the Unix epoch).
    pub until: Option<f64>,
    /// Text in the job's id or last error.
    pub text: Option<String>,
}

impl BulkFilter {
    /// The filter in words, for messages: "status dead, queue email, enqueued since …".
    pub fn describe(&self) -> String {
        let mut parts = vec![format!("status {}", self.status.as_str())];
        if let Some(q) = &self.queue {
            parts.push(format!("queue {q:?}"));
        }
        let at = |t: f64| {
            let d = UNIX_EPOCH + Duration::from_secs_f64(t.max(0.0));
            humantime::format_rfc3339_seconds(d).to_string()
        };
        if let Some(t) = self.since {
            parts.push(format!("enqueued at or after {}", at(t)));
        }
        if let Some(t) = self.until {
            parts.push(format!("enqueued before {}", at(t)));
        }
        if let Some(t) = &self.text {
            parts.push(format!("id or last error containing {t:?}"));
        }
        parts.join(", ")
    }
}

/// What a bulk action did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BulkReport {
    /// Its row in `bulk_actions`.
    pub id: i64,
    /// Jobs it was allowed to take (the count shown before it ran).
    pub matched: i64,
    /// Jobs it changed.
    pub changed: i64,
}

impl Store {
    /// How many jobs `filter` matches now.
    pub async fn bulk_count(&self, filter: &BulkFilter) -> Result<i64> {
        let c = self.ops().await?;
        let st = c.prepare_cached(sql::BULK_COUNT).await?;
        Ok(c.query_one(
            &st,
            &[
                &filter.status.as_str(),
                &filter.queue,
                &filter.since,
                &filter.until,
                &filter.text,
            ],
        )
        .await?
        .get(0))
    }

    /// Runs `action` on the jobs `filter` matches, at most `expected` of them (the count the
    /// operator was shown), in batches of [`BULK_BATCH`]; records it in `bulk_actions` with
    /// `by`. The caller checked the action takes the filter's status.
    pub async fn bulk_run(
        &self,
        action: BulkAction,
        filter: &BulkFilter,
        by: &str,
        expected: i64,
    ) -> Result<BulkReport> {
        let c = self.ops().await?;
        let record = c.prepare_cached(sql::BULK_RECORD).await?;
        let filter_json = serde_json::to_value(filter).unwrap_or_default();
        let id: i64 = c
            .query_one(&record, &[&by, &action.as_str(), &filter_json, &expected])
            .await?
            .get(0);
        let reason = format!("{}led by {by} (bulk action {id})", action.as_str());
        let matcher = c.prepare_cached(sql::BULK_MATCH).await?;
        let mut changed = 0i64;
        let mut left = expected;
        while left > 0 {
            let ids: Vec<String> = c
                .query(
                    &matcher,
                    &[
                        &filter.status.as_str(),
                        &filter.queue,
                        &filter.since,
                        &filter.until,
                        &filter.text,
                        &left.min(BULK_BATCH),
                    ],
                )
                .await?
                .into_iter()
                .map(|r| r.get(0))
                .collect();
            if ids.is_empty() {
                break;
            }
            left -= ids.len() as i64;
            changed += match action {
                BulkAction::Cancel => {
                    let st = c.prepare_cached(sql::JOB_CANCEL).await?;
                    c.query(&st, &[&ids, &reason]).await?.len() as i64
                }
                BulkAction::Retry => self.job_retry_dead(Some(&ids), None).await?.len() as i64,
                BulkAction::Discard => self.bulk_discard(&ids).await?,
            };
            tokio::time::sleep(BULK_PAUSE).await;
        }
        let done = c.prepare_cached(sql::BULK_DONE).await?;
        c.execute(&done, &[&id, &changed]).await?;
        Ok(BulkReport {
            id,
            matched: expected,
            changed,
        })
    }

    /// Deletes dead or cancelled jobs by id; how many went.
    async fn bulk_discard(&self, ids: &[String]) -> Result<i64> {
        let c = self.ops().await?;
        let st = c.prepare_cached(sql::BULK_DISCARD).await?;
        Ok(c.execute(&st, &[&ids]).await? as i64)
    }
}

/// A time a filter names: an RFC 3339 instant (`2026-11-27T14:00:00Z`) or a duration before
/// `now` (`90m`, `2h`, `1d`), in seconds since the Unix epoch.
pub fn parse_when(text: &str, now: SystemTime) -> std::result::Result<f64, String> {
    let at = match humantime::parse_rfc3339_weak(text.trim()) {
        Ok(t) => t,
        Err(_) => match humantime::parse_duration(text.trim()) {
            Ok(d) => now.checked_sub(d).ok_or_else(|| format!("{text:?} is too long ago"))?,
            Err(_) => {
                return Err(format!(
                    "{text:?} is neither an instant (e.g. 2026-11-27T14:00:00Z) nor a duration before now (e.g. 90m, 2h, 1d)"
                ))
            }
        },
    };
    Ok(at
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_action_takes_only_its_statuses_and_says_which() {
        assert!(BulkAction::Cancel.check(JobStatus::Processing).is_ok());
        let e = BulkAction::Retry.check(JobStatus::Queued).unwrap_err();
        assert_eq!(
            e,
            "a bulk retry takes dead jobs, not queued: set the status to dead"
        );
        assert!(BulkAction::Discard.check(JobStatus::Completed).is_err());
        assert_eq!(BulkAction::parse("discard"), Some(BulkAction::Discard));
        assert_eq!(BulkAction::parse("delete"), None);
    }

    #[test]
    fn a_time_is_an_instant_or_a_duration_before_now() {
        let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        assert_eq!(parse_when("2h", now), Ok(1_800_000_000.0 - 7200.0));
        assert_eq!(parse_when("2027-01-15T08:00:00Z", now), Ok(1_800_000_000.0));
        let e = parse_when("yesterday", now).unwrap_err();
        assert!(e.contains("\"yesterday\"") && e.contains("2h"), "{e}");
    }
}
