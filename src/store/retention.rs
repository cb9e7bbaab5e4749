//! Retention: the deletes of the pruner (`worker::pruner`), on a connection of their own that
//! holds the pruner's advisory lock of this schema for the whole round.
//!
//! The connection is taken out of the pool for good ([`deadpool_postgres::Object::take`]):
//! dropping a [`PruneSession`] closes it, and PostgreSQL releases the session lock with it,
//! so a round that fails, is cancelled or whose pod dies never leaves the lock behind on a
//! pooled connection. It plans with PostgreSQL's defaults (the worker's pooled connections
//! forbid nested loops, which the "has an unfinished child" test needs).

use super::{sql, Result, Store};
use std::time::Duration;

/// A queue whose finished jobs of one status are kept other than by the default: how long,
/// and the completed_at (as PostgreSQL prints it) below which its keep_count cuts.
#[derive(Debug, Clone)]
pub struct QueueCut {
    pub queue: String,
    pub keep: Duration,
    pub floor: Option<String>,
}

/// What `jobwarden prune --dry-run` reports for one queue and status.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PrunePreview {
    pub queue: String,
    pub status: String,
    pub going: i64,
    pub kept: i64,
    /// Age of the oldest finished job kept, in seconds.
    pub oldest_kept_secs: Option<f64>,
}

/// A connection of its own, holding the pruner's lock of this schema (or a reader's, not).
pub struct PruneSession {
    client: deadpool_postgres::ClientWrapper,
    lock: String,
    /// Whether it holds the lock (a reader does not).
    locked: bool,
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl Store {
    /// The pruner's lock of this schema on a connection of its own, or `None` while another
    /// session (another pod's round) holds it.
    pub async fn prune_session(&self) -> Result<Option<PruneSession>> {
        let s = self.prune_reader().await?;
        let got: bool = s
            .client
            .query_one(sql::PRUNE_LOCK, &[&s.lock])
            .await?
            .get(0);
        Ok(got.then_some(PruneSession { locked: true, ..s }))
    }

    /// A connection set up as the pruner's, without its lock: for what only reads
    /// (`jobwarden prune --dry-run`), so it never waits for a round.
    pub async fn prune_reader(&self) -> Result<PruneSession> {
        let client = deadpool_postgres::Object::take(self.client().await?);
        client.query_one(sql::PRUNE_SESSION, &[]).await?;
        Ok(PruneSession {
            client,
            lock: format!("jobwarden.prune.{}", self.schema),
            locked: false,
        })
    }
}

impl PruneSession {
    /// Deletes up to `limit` jobs of `status` whose keep is over, completed at or after
    /// `after` (PostgreSQL's text of a timestamptz), oldest first. Returns each one's queue and
    /// completed_at.
    pub async fn prune_jobs(
        &self,
        status: &str,
        default_keep: Duration,
        cuts: &[QueueCut],
        after: &str,
        limit: i64,
    ) -> Result<Vec<(String, String)>> {
        let queues: Vec<&str> = cuts.iter().map(|c| c.queue.as_str()).collect();
        let keeps: Vec<i64> = cuts.iter().map(|c| ms(c.keep)).collect();
        let floors: Vec<Option<&str>> = cuts.iter().map(|c| c.floor.as_deref()).collect();
        let rows = self
            .client
            .query(
                sql::PRUNE_JOBS,
                &[
                    &status,
                    &ms(default_keep),
                    &queues,
                    &keeps,
                    &floors,
                    &after,
                    &limit,
                ],
            )
            .await?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    /// The completed_at of `queue`'s `n`-th newest finished job, when it has that many.
    pub async fn prune_count_floor(&self, queue: &str, n: i64) -> Result<Option<String>> {
        let row = self
            .client
            .query_opt(sql::PRUNE_COUNT_FLOOR, &[&queue, &n])
            .await?;
        Ok(row.map(|r| r.get(0)))
    }

    /// What a round would delete now, per queue and status. `cuts` are (status, cut).
    pub async fn prune_preview(
        &self,
        defaults: &[(&str, Duration)],
        cuts: &[(&str, QueueCut)],
    ) -> Result<Vec<PrunePreview>> {
        let statuses: Vec<&str> = defaults.iter().map(|d| d.0).collect();
        let default_ms: Vec<i64> = defaults.iter().map(|d| ms(d.1)).collect();
        let queues: Vec<&str> = cuts.iter().map(|c| c.1.queue.as_str()).collect();
        let of: Vec<&str> = cuts.iter().map(|c| c.0).collect();
        let keeps: Vec<i64> = cuts.iter().map(|c| ms(c.1.keep)).collect();
        let floors: Vec<Option<&str>> = cuts.iter().map(|c| c.1.floor.as_deref()).collect();
        let rows = self
            .client
            .query(
                sql::PRUNE_PREVIEW,
                &[&statuses, &default_ms, &queues, &of, &keeps, &floors],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| PrunePreview {
                queue: r.get(0),
                status: r.get(1),
                going: r.get(2),
                kept: r.get(3),
                oldest_kept_secs: r.get(4),
            })
            .collect())
    }

    /// Deletes up to `limit` poison messages older than `keep`.
    pub async fn prune_poison(&self, keep: Duration, limit: i64) -> Result<u64> {
        Ok(self
            .client
            .execute(sql::PRUNE_POISON, &[&ms(keep), &limit])
            .await?)
    }

    /// Deletes up to `limit` rows of workers stopped longer than `keep` ago.
    pub async fn prune_workers(&self, keep: Duration, limit: i64) -> Result<u64> {
        Ok(self
            .client
            .execute(sql::PRUNE_WORKERS, &[&ms(keep), &limit])
            .await?)
    }

    /// Deletes up to `limit` flow grants that count for nothing any more.
    pub async fn prune_flow_grants(&self, limit: i64) -> Result<u64> {
        Ok(self
            .client
            .execute(sql::PRUNE_FLOW_GRANTS, &[&limit])
            .await?)
    }

    /// Deletes up to `limit` attempt-log rows older than `keep` whose job is gone.
    pub async fn prune_attempt_orphans(&self, keep: Duration, limit: i64) -> Result<u64> {
        Ok(self
            .client
            .execute(sql::PRUNE_ATTEMPT_ORPHANS, &[&ms(keep), &limit])
            .await?)
    }

    /// Ends the round: releases the lock (if held) and closes the connection.
    pub async fn finish(self) -> Result<()> {
        if self.locked {
            self.client
                .query_one(sql::PRUNE_UNLOCK, &[&self.lock])
                .await?;
        }
        Ok(())
    }
}
