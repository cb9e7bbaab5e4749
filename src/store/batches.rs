//! Batches (schema version 32): a batch's progress, and the scheduler's round that finishes
//! the batches whose members have all ended (their callbacks enqueued once); the members of
//! batches published over NATS (version 34), judged before their rows are written.

use super::{sql, ClaimInput, Result, Store};
use crate::contract::BatchDecl;
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

/// What becomes of a message that names a batch (see [`Store::batch_join`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BatchVerdict {
    /// The batch its job joins: `None` when the batch takes no member (enqueued through
    /// SQL, or finished).
    pub joins: Option<String>,
    /// Why the message is refused (kept as a dead job, a dead member of `joins` if any).
    pub refused: Option<String>,
    /// The batch is open and declared as this message declares it.
    pub open: bool,
}

impl BatchProgress {
    /// Members that have come (a batch published over NATS may not have them all yet).
    pub fn members(&self) -> i64 {
        self.waiting + self.running + self.ended()
    }

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
            _ => {
                let missing = i64::from(self.size) - self.members();
                if missing > 0 {
                    out.push_str(&format!(" · {missing} not come yet"));
                }
            }
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

    /// Judges the members of batches among `jobs` (schema version 34): declares each batch not
    /// known yet (by its first member), and says, per job, which batch it joins and whether it
    /// is refused. One verdict per job, in order (the default one for a job of no batch);
    /// no statement at all when none names a batch.
    pub async fn batch_join(&self, jobs: &[ClaimInput]) -> Result<Vec<BatchVerdict>> {
        let ids: Vec<&str> = jobs.iter().map(|i| i.job.id.as_str()).collect();
        let decls: Vec<Option<&BatchDecl>> = jobs.iter().map(|i| i.job.batch.as_ref()).collect();
        self.batch_join_decls(&ids, &decls).await
    }

    /// [`Store::batch_join`] for ids and their batches (`None` for none).
    pub async fn batch_join_decls(
        &self,
        ids: &[&str],
        decls: &[Option<&BatchDecl>],
    ) -> Result<Vec<BatchVerdict>> {
        let mut verdicts = vec![BatchVerdict::default(); ids.len()];
        if decls.iter().all(Option::is_none) {
            return Ok(verdicts);
        }
        let batches: Vec<Option<&str>> = decls.iter().map(|d| d.map(|d| d.id.as_str())).collect();
        let declared: Vec<Option<Value>> = decls
            .iter()
            .map(|d| d.map(BatchDecl::declaration))
            .collect();
        let c = self.client().await?;
        let st = c.prepare_cached(sql::BATCH_JOIN).await?;
        for r in c.query(&st, &[&ids, &batches, &declared]).await? {
            let n: i64 = r.get(0);
            if let Some(v) = usize::try_from(n - 1)
                .ok()
                .and_then(|i| verdicts.get_mut(i))
            {
                v.joins = r.get(1);
                v.refused = r.get(2);
                v.open = r.get(3);
            }
        }
        Ok(verdicts)
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
