//! Operator actions and statistics: retry and purge dead jobs, cancel, the `job_stats` view.

use super::{Result, Store};
use crate::job::JobStatus;
use serde::Serialize;
use std::time::Duration;

/// One row of the `job_stats` view.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct QueueStats {
    pub queue: String,
    pub queued: i64,
    pub scheduled: i64,
    pub processing: i64,
    pub completed_24h: i64,
    pub dead_24h: i64,
    pub oldest_queued_seconds: Option<f64>,
    pub p50_run_seconds: Option<f64>,
    pub p95_run_seconds: Option<f64>,
    pub retry_rate: f64,
}

impl Store {
    /// Retries dead jobs (by id, or every dead job of a queue); returns the ids retried.
    pub async fn job_retry_dead(
        &self,
        ids: Option<&[String]>,
        queue: Option<&str>,
    ) -> Result<Vec<String>> {
        let c = self.raw().await?;
        let st = c
            .prepare_cached(include_str!("sql/job_retry_dead.sql"))
            .await?;
        let rows = c.query(&st, &[&ids, &queue]).await?;
        Ok(rows.into_iter().map(|r| r.get(0)).collect())
    }

    /// Cancels a job; returns the status it had, or None when it was already finished (or
    /// does not exist).
    pub async fn job_cancel(&self, id: &str) -> Result<Option<JobStatus>> {
        let c = self.raw().await?;
        let st = c.prepare_cached(include_str!("sql/job_cancel.sql")).await?;
        let row = c.query_opt(&st, &[&id]).await?;
        Ok(row.and_then(|r| JobStatus::parse(r.get(0))))
    }

    /// Deletes dead jobs older than `age`; returns how many.
    pub async fn job_purge_dead(&self, age: Duration) -> Result<u64> {
        let c = self.raw().await?;
        let st = c
            .prepare_cached(include_str!("sql/job_purge_dead.sql"))
            .await?;
        let ms = age.as_millis().min(i64::MAX as u128) as i64;
        Ok(c.execute(&st, &[&ms]).await?)
    }

    /// Per-queue statistics from the `job_stats` view.
    pub async fn job_stats(&self) -> Result<Vec<QueueStats>> {
        let c = self.raw().await?;
        let st = c.prepare_cached(include_str!("sql/job_stats.sql")).await?;
        Ok(c.query(&st, &[])
            .await?
            .into_iter()
            .map(|r| QueueStats {
                queue: r.get(0),
                queued: r.get(1),
                scheduled: r.get(2),
                processing: r.get(3),
                completed_24h: r.get(4),
                dead_24h: r.get(5),
                oldest_queued_seconds: r.get(6),
                p50_run_seconds: r.get(7),
                p95_run_seconds: r.get(8),
                retry_rate: r.get(9),
            })
            .collect())
    }
}

/// The `jobwarden stats` table.
pub fn format_stats(rows: &[QueueStats]) -> String {
    let mut out = format!(
        "{:<12} {:>7} {:>9} {:>10} {:>13} {:>8} {:>13} {:>8} {:>8} {:>7}\n",
        "queue",
        "queued",
        "scheduled",
        "processing",
        "completed 24h",
        "dead 24h",
        "oldest queued",
        "p50 run",
        "p95 run",
        "retries"
    );
    let secs = |s: Option<f64>| s.map(|v| format!("{v:.3}s")).unwrap_or_else(|| "-".into());
    for r in rows {
        out.push_str(&format!(
            "{:<12} {:>7} {:>9} {:>10} {:>13} {:>8} {:>13} {:>8} {:>8} {:>6.1}%\n",
            r.queue,
            r.queued,
            r.scheduled,
            r.processing,
            r.completed_24h,
            r.dead_24h,
            r.oldest_queued_seconds
                .map(|v| format!("{v:.0}s"))
                .unwrap_or_else(|| "-".into()),
            secs(r.p50_run_seconds),
            secs(r.p95_run_seconds),
            r.retry_rate * 100.0
        ));
    }
    out
}

/// The "waiting for a worker" part of `jobwarden stats`: subjects no pod serves yet.
pub fn format_unserved(rows: &[super::UnservedRow]) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let mut out = String::from("\nwaiting for a worker (no consumer serves these subjects):\n");
    out.push_str(&format!(
        "{:<24} {:<12} {:>8} {:>10} {:>18}\n",
        "subject", "queue", "messages", "oldest", "dead-lettered in"
    ));
    for r in rows {
        let due = if r.dead_letter_in_seconds <= 0.0 {
            "now".to_string()
        } else {
            format!("{:.0}s", r.dead_letter_in_seconds)
        };
        out.push_str(&format!(
            "{:<24} {:<12} {:>8} {:>9.0}s {:>18}\n",
            r.subject, r.queue, r.messages, r.oldest_seconds, due
        ));
    }
    if let Some(r) = rows.first() {
        out.push_str(&format!(
            "(as a janitor saw them {:.0}s ago)\n",
            r.seen_seconds_ago
        ));
    }
    out
}
