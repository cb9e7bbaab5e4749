//! Job chaining: resolving the dependents of jobs that ended (`chain_resolve.sql`), the
//! safety net that finds ended parents nobody marked (`chain_recheck.sql`), and a pipeline's
//! jobs (`pipeline_jobs.sql`).

use super::sql;
use super::{Result, Store};

/// What one chain round did.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ChainRound {
    /// Ended jobs whose dependents it resolved.
    pub parents: i64,
    /// `then` jobs it created.
    pub created: i64,
    /// Waiting children it made due, dead or cancelled.
    pub decided: i64,
    /// Children dead-lettered because a parent is dead: (id, queue, reason).
    pub dead: Vec<(String, String, String)>,
}

/// One job of a pipeline, with its parents.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PipelineJob {
    pub id: String,
    pub queue: String,
    pub status: String,
    pub attempts: i32,
    pub max_attempts: i32,
    pub last_error: Option<String>,
    pub parents: Vec<String>,
    /// `then` jobs not created yet (the job has not completed).
    pub pending_then: i32,
    /// RFC 3339, UTC.
    pub created_at: String,
    pub completed_at: Option<String>,
    /// Its result, which the jobs after it receive.
    pub result: Option<serde_json::Value>,
}

/// A row of `pipeline_jobs.sql` (its first ten columns and the twelfth).
impl From<&tokio_postgres::Row> for PipelineJob {
    fn from(r: &tokio_postgres::Row) -> PipelineJob {
        PipelineJob {
            id: r.get(0),
            queue: r.get(1),
            status: r.get(2),
            attempts: r.get(3),
            max_attempts: r.get(4),
            last_error: r.get(5),
            parents: r.get(6),
            pending_then: r.get(7),
            created_at: r.get(8),
            completed_at: r.get(9),
            result: r.get(11),
        }
    }
}

impl Store {
    /// Resolves the dependents of at most `limit` ended jobs, or of `only` (see
    /// `chain_resolve.sql`).
    pub async fn chain_resolve(&self, limit: i64, only: Option<&str>) -> Result<ChainRound> {
        let c = self.client().await?;
        let st = c.prepare_cached(sql::CHAIN_RESOLVE).await?;
        let r = c.query_one(&st, &[&limit, &only]).await?;
        let ids: Vec<String> = r.get(3);
        let queues: Vec<String> = r.get(4);
        let errors: Vec<Option<String>> = r.get(5);
        Ok(ChainRound {
            parents: r.get(0),
            created: r.get(1),
            decided: r.get(2),
            dead: ids
                .into_iter()
                .zip(queues)
                .zip(errors)
                .map(|((id, q), e)| (id, q, e.unwrap_or_default()))
                .collect(),
        })
    }

    /// Jobs whose dependents wait to be resolved, at most `limit`.
    pub async fn chain_pending_ids(&self, limit: i64) -> Result<Vec<String>> {
        let c = self.client().await?;
        let st = c.prepare_cached(sql::CHAIN_PENDING_IDS).await?;
        Ok(c.query(&st, &[&limit])
            .await?
            .into_iter()
            .map(|r| r.get(0))
            .collect())
    }

    /// Drops job `id`'s `then` specs, which cannot be created (`why`); true if it had some.
    pub async fn chain_drop_then(&self, id: &str, why: &str) -> Result<bool> {
        let c = self.client().await?;
        let st = c.prepare_cached(sql::CHAIN_DROP_THEN).await?;
        Ok(c.execute(&st, &[&id, &why]).await? > 0)
    }

    /// Stops trying to resolve job `id`'s dependents (`why`).
    pub async fn chain_give_up(&self, id: &str, why: &str) -> Result<()> {
        let c = self.client().await?;
        let st = c.prepare_cached(sql::CHAIN_GIVE_UP).await?;
        c.execute(&st, &[&id, &why]).await?;
        Ok(())
    }

    /// Marks ended parents of waiting jobs that nobody marked, and sends jobs doomed by a
    /// parent that was retried since back to waiting; returns how many rows it changed.
    pub async fn chain_recheck(&self) -> Result<i64> {
        let c = self.client().await?;
        let st = c.prepare_cached(sql::CHAIN_RECHECK).await?;
        Ok(c.query_one(&st, &[]).await?.get(0))
    }

    /// Cancels every unfinished job of the pipeline `id` belongs to, and the `then` jobs its
    /// completed jobs have not created yet; returns the ids cancelled.
    pub async fn pipeline_cancel(&self, id: &str) -> Result<Vec<String>> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        let drop_then = tx.prepare_cached(sql::PIPELINE_CANCEL_THEN).await?;
        tx.execute(&drop_then, &[&id]).await?;
        // A new statement, a new snapshot: jobs a round created meanwhile are seen.
        let st = tx.prepare_cached(sql::PIPELINE_CANCEL).await?;
        let rows = tx.query(&st, &[&id]).await?;
        tx.commit().await?;
        let mut ids: Vec<String> = rows.into_iter().map(|r| r.get(0)).collect();
        ids.sort();
        Ok(ids)
    }

    /// Every job of the pipeline `id` belongs to (or begins), oldest first; empty when the
    /// job does not exist.
    pub async fn pipeline_jobs(&self, id: &str) -> Result<Vec<PipelineJob>> {
        let c = self.client().await?;
        let st = c.prepare_cached(sql::PIPELINE_JOBS).await?;
        let all = i64::MAX;
        Ok(c.query(&st, &[&id, &None::<i64>, &"", &all])
            .await?
            .iter()
            .map(PipelineJob::from)
            .collect())
    }
}
