//! The hot path: claim a batch of delivered messages, record progress, settle finished
//! attempts. One statement per batch, every write after the claim fenced by owner and lease.

use super::sql;
use super::{Claim, ClaimAnswer, ClaimInput, Result, SettleInput, Store, StoreError};
use crate::job::JobStatus;
use serde_json::Value;
use std::time::Duration;
use tokio_postgres::types::ToSql;

pub(super) fn ms(d: Duration) -> i64 {
    d.as_millis().min(i64::MAX as u128) as i64
}

/// A batch of new jobs as one array per column, the shape `job_claim`, `job_adopt` and
/// `job_dead_unserved` take. Borrows the batch: payloads are not copied.
pub(super) struct Columns<'a> {
    ids: Vec<&'a str>,
    queues: Vec<&'a str>,
    payloads: Vec<&'a Value>,
    priorities: Vec<i16>,
    max_attempts: Vec<i32>,
    timeouts: Vec<Option<i32>>,
    idempotency_keys: Vec<Option<&'a str>>,
    run_ats: Vec<Option<i64>>,
    backoffs: Vec<Option<Value>>,
    traces: Vec<Option<&'a str>>,
    thens: Vec<Option<&'a Value>>,
    /// The jobs' keys (`jobs.key`): not among [`Columns::params`], each statement takes them
    /// last ([`Columns::keys`]).
    keys: Vec<Option<&'a str>>,
    /// What gates each job (`jobs.gate`, version 23; NULL for none): each statement takes
    /// them after the keys ([`Columns::gates`]).
    gates: Vec<Option<&'a Value>>,
    /// The batch each job joins (version 34; NULL for none): each statement takes them last
    /// ([`Columns::batches`]).
    batches: Vec<Option<&'a str>>,
}

impl<'a> Columns<'a> {
    pub(super) fn of(batch: &'a [ClaimInput]) -> Columns<'a> {
        let n = batch.len();
        let mut c = Columns {
            ids: Vec::with_capacity(n),
            queues: Vec::with_capacity(n),
            payloads: Vec::with_capacity(n),
            priorities: Vec::with_capacity(n),
            max_attempts: Vec::with_capacity(n),
            timeouts: Vec::with_capacity(n),
            idempotency_keys: Vec::with_capacity(n),
            run_ats: Vec::with_capacity(n),
            backoffs: Vec::with_capacity(n),
            traces: Vec::with_capacity(n),
            thens: Vec::with_capacity(n),
            keys: Vec::with_capacity(n),
            gates: Vec::with_capacity(n),
            batches: Vec::with_capacity(n),
        };
        for i in batch {
            let j = &i.job;
            c.ids.push(&j.id);
            c.queues.push(&j.queue);
            c.payloads.push(&j.payload);
            c.priorities.push(j.priority);
            c.max_attempts.push(i.max_attempts);
            c.timeouts.push(j.timeout_ms());
            c.idempotency_keys.push(j.idempotency_key.as_deref());
            c.run_ats.push(j.run_at_ms);
            c.backoffs.push(j.backoff_json());
            // Only a well-formed one is kept (every way in filters it; this is the last door).
            c.traces.push(
                i.traceparent
                    .as_deref()
                    .and_then(crate::contract::traceparent),
            );
            c.thens.push(j.then.as_ref());
            c.keys.push(j.key.as_deref());
            c.gates.push(j.gate.as_ref());
            c.batches.push(j.batch.as_ref().map(|b| b.id.as_str()));
        }
        c
    }

    /// The batch each job joins, the parameter each statement takes last.
    pub(super) fn batches(&self) -> &(dyn ToSql + Sync) {
        &self.batches
    }

    /// The jobs' keys, the parameter each statement takes after its others.
    pub(super) fn keys(&self) -> &(dyn ToSql + Sync) {
        &self.keys
    }

    /// What gates each job, the parameter each statement takes after the keys.
    pub(super) fn gates(&self) -> &(dyn ToSql + Sync) {
        &self.gates
    }

    /// The eleven arrays, in the order the statements number them.
    pub(super) fn params(&self) -> [&(dyn ToSql + Sync); 11] {
        [
            &self.ids,
            &self.queues,
            &self.payloads,
            &self.priorities,
            &self.max_attempts,
            &self.timeouts,
            &self.idempotency_keys,
            &self.run_ats,
            &self.backoffs,
            &self.traces,
            &self.thens,
        ]
    }
}

/// A claim statement's answer row for one message (columns 3 to 13 of `job_claim.sql`) as the
/// claim it made; `queue` is the message's.
fn claim_of(r: &tokio_postgres::Row, queue: &str) -> Claim {
    let status = JobStatus::parse(r.get(3)).unwrap_or(JobStatus::Dead);
    let payload: Option<Value> = r.get(8);
    let fresh: bool = r.get(9);
    let row_queue: String = r.get(10);
    let conflict = !r.get::<_, Option<bool>>(13).unwrap_or(true);
    if row_queue != queue {
        Claim::WrongQueue(row_queue)
    } else if r.get::<_, Option<bool>>(16) == Some(true) {
        Claim::Throttled
    } else if r.get::<_, Option<bool>>(15) == Some(true) {
        Claim::Expired
    } else if status == JobStatus::Processing && (fresh || payload.is_some()) {
        Claim::Claimed {
            lease: r.get(6),
            attempt: r.get(4),
            max_attempts: r.get(5),
            timeout_ms: r.get(7),
            payload,
            backoff: r
                .get::<_, Option<Value>>(11)
                .and_then(|v| serde_json::from_value(v).ok()),
            traceparent: r.get(12),
            conflict,
            parents: r.get(17),
        }
    } else {
        Claim::NotClaimable { status, conflict }
    }
}

/// The answer rows of `job_claim.sql` (or `job_intake.sql`, which answers alike), one per
/// input at its position.
pub(super) fn claim_answer(rows: Vec<tokio_postgres::Row>, batch: &[ClaimInput]) -> ClaimAnswer {
    let mut claims = vec![Claim::Duplicate; batch.len()];
    let (mut alive, mut paused) = (true, false);
    for r in rows {
        let idx = r.get::<_, i64>(0) as usize - 1;
        alive = r.get(1);
        paused = r.get(14);
        if !r.get::<_, bool>(2) {
            continue; // no row: inserted concurrently elsewhere (or not alive)
        }
        claims[idx] = claim_of(&r, &batch[idx].job.queue);
    }
    ClaimAnswer {
        alive,
        paused,
        claims,
    }
}

/// The rows a new-jobs statement inserted (`job_claim_new.sql`, `job_intake_new.sql`: id,
/// lease, attempt, running, expired) as claims, one per input in input order: `None` for an
/// input it did not insert.
pub(super) fn fresh_claims(
    rows: &[tokio_postgres::Row],
    batch: &[ClaimInput],
) -> Vec<Option<Claim>> {
    // A row inserted from a message holds the message's job: only its lease, attempt and
    // status come back.
    let fresh = |r: &tokio_postgres::Row, input: &ClaimInput| {
        if r.get::<_, bool>(5) {
            Claim::Throttled
        } else if r.get::<_, bool>(4) {
            Claim::Expired
        } else if r.get::<_, bool>(3) {
            Claim::Claimed {
                lease: r.get(1),
                attempt: r.get(2),
                max_attempts: input.max_attempts,
                timeout_ms: input.job.timeout_ms(),
                payload: None,
                backoff: None,
                traceparent: None,
                conflict: false,
                parents: None,
            }
        } else {
            Claim::NotClaimable {
                status: JobStatus::Scheduled,
                conflict: false,
            }
        }
    };
    let mut claims: Vec<Option<Claim>> = vec![None; batch.len()];
    if rows.len() == batch.len() {
        // Every one inserted: the rows come back in input order.
        for (i, r) in rows.iter().enumerate() {
            if r.get::<_, &str>(0) == batch[i].job.id {
                claims[i] = Some(fresh(r, &batch[i]));
            }
        }
        if claims.iter().all(Option::is_some) {
            return claims;
        }
    }
    let at: std::collections::HashMap<&str, usize> = batch
        .iter()
        .enumerate()
        .map(|(i, c)| (c.job.id.as_str(), i))
        .collect();
    for r in rows {
        if let Some(&i) = at.get(r.get::<_, &str>(0)) {
            claims[i] = Some(fresh(r, &batch[i]));
        }
    }
    claims
}

impl Store {
    /// Claims a batch of delivered jobs in one statement, as `worker_id`, with the stale
    /// deadline `stale_after` and the default expiry `expire_after` (the queue's, as this
    /// worker declares them). Ids must be distinct. Answers come back in input order.
    pub async fn job_claim(
        &self,
        worker_id: &str,
        stale_after: Duration,
        expire_after: Option<Duration>,
        batch: &[ClaimInput],
    ) -> Result<ClaimAnswer> {
        let sql = sql::JOB_CLAIM;
        let rows = self
            .claim_rows(sql, worker_id, stale_after, batch, Some(expire_after), &[])
            .await?;
        Ok(claim_answer(rows, batch))
    }

    /// The claim's common case (`job_claim_new.sql`): inserts the rows of the batch's new
    /// jobs, already claimed, if this worker may claim. One answer per input, in input order:
    /// `None` for a message it did not insert (its id exists, or this worker is not
    /// registered) — [`Store::job_claim`] decides those.
    pub async fn job_claim_new(
        &self,
        worker_id: &str,
        stale_after: Duration,
        batch: &[ClaimInput],
    ) -> Result<Vec<Option<Claim>>> {
        let sql = sql::JOB_CLAIM_NEW;
        let rows = match self
            .claim_rows(sql, worker_id, stale_after, batch, None, &[])
            .await
        {
            // An id or idempotency key exists already: nothing was inserted.
            Err(e) if e.is_unique_violation() => return Ok(vec![None; batch.len()]),
            r => r?,
        };
        Ok(fresh_claims(&rows, batch))
    }

    /// Runs a claim statement (worker id, stale_after, the batch's columns, their expiries,
    /// — for `job_claim.sql`, `Some` — the queue's default expiry, and last their keys) and
    /// returns its answer rows.
    pub(super) async fn claim_rows(
        &self,
        sql: &str,
        worker_id: &str,
        stale_after: Duration,
        batch: &[ClaimInput],
        expire_after: Option<Option<Duration>>,
        extra: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>> {
        let cols = Columns::of(batch);
        let stale = ms(stale_after);
        let expiries: Vec<Option<i64>> = batch.iter().map(|i| i.job.expires_at_ms).collect();
        let default = expire_after.map(|d| d.map(ms));
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![&worker_id, &stale];
        params.extend(cols.params());
        params.push(&expiries);
        if let Some(d) = &default {
            params.push(d);
        }
        params.push(cols.keys());
        params.push(cols.gates());
        params.extend_from_slice(extra);
        params.push(cols.batches());
        let client = self.client().await?;
        let st = client.prepare_cached(sql).await?;
        Ok(client.query(&st, &params).await?)
    }

    /// Settles finished attempts in one statement; returns, per attempt of `batch`, whether
    /// its fenced write took effect (false: it lost its ownership).
    pub async fn job_settle(&self, worker_id: &str, batch: &[SettleInput]) -> Result<Vec<bool>> {
        let ids: Vec<&str> = batch.iter().map(|s| s.id.as_str()).collect();
        let leases: Vec<i64> = batch.iter().map(|s| s.lease).collect();
        let results: Vec<Option<&Value>> = batch.iter().map(|s| s.result.as_ref()).collect();
        let traces: Vec<Option<&str>> = batch.iter().map(|s| s.trace.as_deref()).collect();
        let client = self.client().await?;
        let rows = if batch.iter().all(SettleInput::is_plain_completion) {
            // The common case, in a statement of its own (fewer columns, no attempt log).
            let st = client.prepare_cached(sql::JOB_SETTLE_COMPLETED).await?;
            client
                .query(&st, &[&worker_id, &ids, &leases, &results, &traces])
                .await?
        } else {
            let statuses: Vec<&str> = batch.iter().map(|s| s.status.as_str()).collect();
            let delays: Vec<i64> = batch.iter().map(|s| ms(s.delay)).collect();
            let errors: Vec<Option<&str>> = batch.iter().map(|s| s.error.as_deref()).collect();
            let outcomes: Vec<&str> = batch.iter().map(|s| s.outcome).collect();
            let refunds: Vec<i32> = batch.iter().map(|s| i32::from(s.refund)).collect();
            let retries: Vec<i64> = batch.iter().map(|s| ms(s.retry)).collect();
            let st = client.prepare_cached(sql::JOB_SETTLE).await?;
            client
                .query(
                    &st,
                    &[
                        &worker_id, &ids, &leases, &statuses, &delays, &errors, &results,
                        &outcomes, &refunds, &retries, &traces,
                    ],
                )
                .await?
        };
        let settled = positions(&rows, batch.len());
        if settled.iter().any(|s| !s) {
            // The rare case: attempts whose job was taken from this worker. Their late
            // results are recorded on their own; the settle itself is committed already.
            let late: Vec<&SettleInput> = batch
                .iter()
                .zip(&settled)
                .filter(|(_, done)| !**done)
                .map(|(s, _)| s)
                .collect();
            let ids: Vec<&str> = late.iter().map(|s| s.id.as_str()).collect();
            let leases: Vec<i64> = late.iter().map(|s| s.lease).collect();
            let outcomes: Vec<&str> = late.iter().map(|s| s.outcome).collect();
            let recorded = match client.prepare_cached(sql::JOB_SETTLE_LATE).await {
                Ok(st) => client
                    .execute(&st, &[&worker_id, &ids, &leases, &outcomes])
                    .await
                    .map(|_| ()),
                Err(e) => Err(e),
            };
            if let Err(e) = recorded {
                tracing::warn!(cause = %e, "could not record late results (the settle stands)");
            }
        }
        Ok(settled)
    }

    /// Which of these attempts (id, lease, status settled to) this worker settled already,
    /// per attempt of `batch`: for a settle that was retried after its commit answer may have
    /// been lost.
    pub async fn job_settled_check(
        &self,
        worker_id: &str,
        batch: &[SettleInput],
    ) -> Result<Vec<bool>> {
        let ids: Vec<&str> = batch.iter().map(|s| s.id.as_str()).collect();
        let leases: Vec<i64> = batch.iter().map(|s| s.lease).collect();
        let statuses: Vec<&str> = batch.iter().map(|s| s.status.as_str()).collect();
        let client = self.client().await?;
        let st = client.prepare_cached(sql::JOB_SETTLED_CHECK).await?;
        let rows = client
            .query(&st, &[&worker_id, &ids, &leases, &statuses])
            .await?;
        Ok(positions(&rows, batch.len()))
    }

    /// Records a progress report (fenced) and moves the job's stale deadline to now +
    /// `stale_after`. `LostOwnership` when the lease moved on.
    #[allow(clippy::too_many_arguments)]
    pub async fn job_progress(
        &self,
        id: &str,
        worker_id: &str,
        lease: i64,
        stale_after: Duration,
        stage: Option<&str>,
        progress: Option<f32>,
        message: Option<&str>,
    ) -> Result<()> {
        let client = self.client().await?;
        let st = client.prepare_cached(sql::JOB_PROGRESS).await?;
        let stale = ms(stale_after);
        let n = client
            .execute(
                &st,
                &[&id, &worker_id, &lease, &stage, &progress, &message, &stale],
            )
            .await?;
        if n == 1 {
            Ok(())
        } else {
            Err(StoreError::LostOwnership {
                job_id: id.to_string(),
                lease,
            })
        }
    }
}

/// Flags, per position of a batch of `len`, the rows that name it (their first column: a
/// 1-based position, as `WITH ORDINALITY` numbers an unnested batch).
fn positions(rows: &[tokio_postgres::Row], len: usize) -> Vec<bool> {
    let mut flags = vec![false; len];
    for r in rows {
        let n: i32 = r.get(0);
        if let Some(f) = usize::try_from(n - 1).ok().and_then(|i| flags.get_mut(i)) {
            *f = true;
        }
    }
    flags
}
