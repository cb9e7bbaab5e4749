//! A keyed queue's way through PostgreSQL (schema version 21): its messages' jobs are parked
//! (`job_intake.sql`), and its slots take them (`job_take()`) within each key's limit, in
//! turn order.

use super::jobs::{claim_answer, fresh_claims, Columns};
use super::{sql, Claim, ClaimAnswer, ClaimInput, Result, Store};
use crate::config::KeyRules;
use serde_json::Value;
use std::time::Duration;
use tokio_postgres::types::ToSql;

/// What a take gave this worker: its jobs, and whether parked jobs are left in the queue
/// (then a job that ends here may free their key: take again).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Takes {
    pub jobs: Vec<Taken>,
    pub more: bool,
}

/// A job a take gave this worker.
#[derive(Debug, Clone, PartialEq)]
pub struct Taken {
    pub id: String,
    pub attempt: i32,
    pub max_attempts: i32,
    pub lease: i64,
    pub timeout_ms: Option<i32>,
    pub payload: Value,
    pub backoff: Option<crate::backoff::Backoff>,
    pub traceparent: Option<String>,
    /// When the job was created (for the wait it had).
    pub created_ns: i128,
    /// Its parents' results (`parent_results`, version 28).
    pub parents: Option<Value>,
}

impl Store {
    /// Parks a batch of a keyed queue's delivered jobs; answers as [`Store::job_claim`] does
    /// (nothing is ever claimed here: a parked job is `NotClaimable` with status `queued`).
    /// `seqs`: the messages' stream sequences (publish order), at the batch's positions.
    pub async fn job_intake(
        &self,
        worker_id: &str,
        expire_after: Option<Duration>,
        rules: KeyRules,
        seqs: &[i64],
        batch: &[ClaimInput],
    ) -> Result<ClaimAnswer> {
        let cols = Columns::of(batch);
        let unused = 0_i64;
        let expiries: Vec<Option<i64>> = batch.iter().map(|i| i.job.expires_at_ms).collect();
        let default = expire_after.map(super::jobs::ms);
        let keys: Vec<Option<&str>> = batch.iter().map(|i| i.job.key.as_deref()).collect();
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![&worker_id, &unused];
        params.extend(cols.params());
        params.push(&expiries);
        params.push(&default);
        params.push(&keys);
        params.push(&rules.fair);
        params.push(&seqs);
        params.push(cols.gates());
        params.push(cols.batches());
        let client = self.client().await?;
        let st = client.prepare_cached(sql::JOB_INTAKE).await?;
        let rows = client.query(&st, &params).await?;
        Ok(claim_answer(rows, batch))
    }

    /// A keyed queue's common case (`job_intake_new.sql`): starts at once, claimed by this
    /// worker, up to `start` of the batch's new jobs whose key has room and nothing parked
    /// (with fair turns: while the queue has nothing parked). One answer per input, in input
    /// order, as [`Store::job_claim_new`] gives them: `None` for a message it did not start
    /// (every one when an id or idempotency key exists already); the full intake parks those.
    pub async fn job_intake_new(
        &self,
        worker_id: &str,
        stale_after: Duration,
        rules: KeyRules,
        (seqs, start): (&[i64], usize),
        batch: &[ClaimInput],
    ) -> Result<Vec<Option<Claim>>> {
        let start = start.min(i32::MAX as usize) as i32;
        let cap = rules.concurrency.map(|c| c.min(i32::MAX as u32) as i32);
        let rate_n = rules.rate.map(|r| r.starts.min(i32::MAX as u32) as i32);
        let rate_ms = rules.rate.map(|r| super::jobs::ms(r.window));
        let extra: [&(dyn ToSql + Sync); 6] = [&seqs, &start, &cap, &rules.fair, &rate_n, &rate_ms];
        let rows = match self
            .claim_rows(
                sql::JOB_INTAKE_NEW,
                worker_id,
                stale_after,
                batch,
                None,
                &extra,
            )
            .await
        {
            // An id or idempotency key exists already: nothing was inserted.
            Err(e) if e.is_unique_violation() => return Ok(vec![None; batch.len()]),
            r => r?,
        };
        Ok(fresh_claims(&rows, batch))
    }

    /// Takes up to `want` parked jobs of `queue` for this worker, within each key's limit.
    /// `horizon` (ordered queues): the lowest stream sequence whose message may not be parked
    /// yet; jobs of later messages wait (`None`: every message is parked).
    pub async fn job_take(
        &self,
        queue: &str,
        worker_id: &str,
        want: usize,
        (stale_after, expire_after): (Duration, Option<Duration>),
        rules: KeyRules,
        horizon: Option<i64>,
    ) -> Result<Takes> {
        let want = want.min(i32::MAX as usize) as i32;
        let stale = super::jobs::ms(stale_after);
        let expire = expire_after.map(super::jobs::ms);
        let cap = rules.concurrency.map(|c| c.min(i32::MAX as u32) as i32);
        let rate_n = rules.rate.map(|r| r.starts.min(i32::MAX as u32) as i32);
        let rate_ms = rules.rate.map(|r| super::jobs::ms(r.window));
        let client = self.client().await?;
        let st = client.prepare_cached(sql::JOB_TAKE).await?;
        let rows = client
            .query(
                &st,
                &[
                    &queue,
                    &worker_id,
                    &want,
                    &stale,
                    &expire,
                    &cap,
                    &rules.ordered,
                    &rules.dead_blocks,
                    &horizon,
                    &rate_n,
                    &rate_ms,
                    &rules.fair,
                ],
            )
            .await?;
        // A last row without an id: parked jobs are left.
        let more = rows
            .last()
            .is_some_and(|r| r.get::<_, Option<&str>>(0).is_none());
        let jobs = rows
            .iter()
            .filter(|r| r.get::<_, Option<&str>>(0).is_some())
            .map(|r| Taken {
                id: r.get(0),
                attempt: r.get(1),
                max_attempts: r.get(2),
                lease: r.get(3),
                timeout_ms: r.get(4),
                payload: r.get(5),
                backoff: r
                    .get::<_, Option<Value>>(6)
                    .and_then(|v| serde_json::from_value(v).ok()),
                traceparent: r.get(7),
                created_ns: r
                    .get::<_, std::time::SystemTime>(8)
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as i128),
                parents: r.get(9),
            })
            .collect();
        Ok(Takes { jobs, more })
    }
}
