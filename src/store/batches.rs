//! Batches (schema version 32): a batch's progress, and the scheduler's round that finishes
//! the batches whose members have all ended (their callbacks enqueued once).

use super::{sql, Result, Store};
use serde::Serialize;
use serde_json::Value;

/// A batch's progress, as `jobwarden batch show` and `jobs show` print it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct BatchProgress {
    pub id: String,
    /// Members enqueued.
    pub size: i32,
    /// Members not started yet (waiting, queued, scheduled).
    pub waiting: i64,
    /// Members running or awaiting completion from outside.
    pub running: i64,
    pub completed: i64,
    pub dead: i64,
    pub cancelled: i64,
    /// When its last member had ended (its callbacks were enqueued then).
    pub finished_at: Option<String>,
    pub callbacks: Option<Vec<String>>,
    /// The counts and failed ids its callbacks received.
    pub outcome: Option<Value>,
}

impl BatchProgress {
    /// Members that have ended.
    pub fn ended(&self) -> i64 {
        self.completed + self.dead + self.cancelled
    }

    /// `9,900 of 10,000 ended (9,801 completed, 99 dead) · finished 2026-…`.
    pub fn summary(&self) -> String {
        let mut parts = vec![format!("{} completed", self.completed)];
        if self.dead > 0 {
            parts.push(format!("{} dead", self.dead));
        }
        if self.cancelled > 0 {
            parts.push(format!("{} cancelled", self.cancelled));
        }
        if self.running > 0 {
            parts.push(format!("{} running", self.running));
        }
        let mut out = format!(
            "{} of {} ended ({})",
            self.ended(),
            self.size,
            parts.join(", ")
        );
        match (&self.finished_at, &self.callbacks) {
            (Some(at), Some(cbs)) if !cbs.is_empty() => {
                out.push_str(&format!(" · finished {at}, callbacks {}", cbs.join(", ")));
            }
            (Some(at), _) => out.push_str(&format!(" · finished {at}")),
            _ => {}
        }
        out
    }
}

impl Store {
    /// One batch's progress; `None` when there is no such batch.
    pub async fn batch_progress(&self, id: &str) -> Result<Option<BatchProgress>> {
        let c = self.ops().await?;
        let st = c.prepare_cached(sql::BATCH_PROGRESS).await?;
        Ok(c.query_opt(&st, &[&id]).await?.map(|r| BatchProgress {
            id: id.to_string(),
            size: r.get(0),
            waiting: r.get(1),
            running: r.get(2),
            completed: r.get(3),
            dead: r.get(4),
            cancelled: r.get(5),
            finished_at: r.get(6),
            callbacks: r.get(7),
            outcome: r.get(8),
        }))
    }

    /// Finishes up to `limit` batches whose members have all ended: `(batch, callbacks)`.
    pub async fn batch_finish(&self, limit: i32) -> Result<Vec<(String, Vec<String>)>> {
        let c = self.raw().await?;
        let st = c.prepare_cached(sql::BATCH_FINISH).await?;
        Ok(c.query(&st, &[&limit])
            .await?
            .into_iter()
            .map(|r| {
                (
                    r.get(0),
                    r.get::<_, Option<Vec<String>>>(1).unwrap_or_default(),
                )
            })
            .collect())
    }
}
