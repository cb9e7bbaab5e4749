//! Keeping rows and stream messages in step: enqueueing (row first, then publish), the
//! scheduler's publishing of due jobs, messages that cannot become jobs, messages adopted
//! from the stream after their fetcher died, and messages of queues no pod serves.

use super::jobs::{ms, Columns};
use super::sql;
use super::{ClaimInput, DueJob, DueRound, Enqueued, PublishReport, Result, Store, StoreError};
use crate::job::{JobStatus, NewJob};
use serde_json::Value;
use std::time::{Duration, SystemTime};
use tokio_postgres::types::ToSql;

/// How long a due job whose publish failed for now waits before the next try, so it never
/// holds back the jobs behind it.
pub const PUBLISH_RETRY: Duration = Duration::from_secs(5);

/// A subject with messages no pod serves, as the janitors last saw it.
#[derive(Debug, Clone, serde::Serialize, PartialEq)]
pub struct UnservedRow {
    pub subject: String,
    pub queue: String,
    pub messages: i64,
    pub oldest_seconds: f64,
    /// Seconds until its oldest messages are dead-lettered (negative: due now).
    pub dead_letter_in_seconds: f64,
    /// How long ago a janitor looked.
    pub seen_seconds_ago: f64,
}

/// A message that cannot become a job, to keep as a dead one: (its id, its queue, what is
/// kept of its body, the reason, the batch it is a dead member of).
pub type InvalidRow = (String, String, Value, String, Option<String>);

impl Store {
    /// Records undeliverable messages as dead jobs; returns the ids that were inserted (an id
    /// that exists already is left alone).
    pub async fn job_dead_invalid(
        &self,
        worker_id: &str,
        items: &[InvalidRow],
    ) -> Result<Vec<String>> {
        let ids: Vec<&str> = items.iter().map(|i| i.0.as_str()).collect();
        let queues: Vec<&str> = items.iter().map(|i| i.1.as_str()).collect();
        let payloads: Vec<&Value> = items.iter().map(|i| &i.2).collect();
        let reasons: Vec<&str> = items.iter().map(|i| i.3.as_str()).collect();
        let batches: Vec<Option<&str>> = items.iter().map(|i| i.4.as_deref()).collect();
        let client = self.client().await?;
        let st = client.prepare_cached(sql::JOB_DEAD_INVALID).await?;
        let rows = client
            .query(
                &st,
                &[&worker_id, &ids, &queues, &payloads, &reasons, &batches],
            )
            .await?;
        Ok(rows.into_iter().map(|r| r.get(0)).collect())
    }

    pub async fn poison_insert(
        &self,
        worker_id: &str,
        subject: &str,
        stream_seq: Option<i64>,
        reason: &str,
        body: &[u8],
    ) -> Result<()> {
        let client = self.client().await?;
        let st = client.prepare_cached(sql::POISON_INSERT).await?;
        let kept = &body[..body.len().min(64 * 1024)];
        client
            .execute(
                &st,
                &[
                    &worker_id,
                    &subject,
                    &stream_seq,
                    &reason,
                    &kept,
                    &(body.len() as i32),
                ],
            )
            .await?;
        Ok(())
    }

    /// Inserts a job (queued, or scheduled after `delay`). An existing id or idempotency key
    /// returns the existing job with `created: false`.
    pub async fn job_insert(
        &self,
        job: &NewJob,
        max_attempts: i32,
        delay: Duration,
        expires_in: Option<Duration>,
    ) -> Result<Enqueued> {
        let client = self.client().await?;
        let st = client.prepare_cached(sql::JOB_INSERT).await?;
        let expires_in = expires_in.map(ms);
        let (timeout_ms, backoff) = (job.timeout_ms(), job.backoff_json());
        let row = client
            .query_opt(
                &st,
                &[
                    &job.id,
                    &job.queue,
                    &job.payload,
                    &job.priority,
                    &max_attempts,
                    &timeout_ms,
                    &job.idempotency_key,
                    &ms(delay),
                    &backoff,
                    &job.expires_at_ms,
                    &expires_in,
                    &job.key,
                    &job.gate,
                ],
            )
            .await?;
        if let Some(r) = row {
            let status: String = r.get(1);
            return Ok(Enqueued {
                id: r.get(0),
                status: JobStatus::parse(&status).unwrap_or(JobStatus::Queued),
                created: true,
                generation: r.get(2),
                same_payload: true,
            });
        }
        // The id or the (queue, idempotency key) is taken: the job that holds it.
        let existing = client
            .query_opt(
                sql::JOB_ENQUEUE_HOLDER,
                &[&job.id, &job.queue, &job.idempotency_key, &job.payload],
            )
            .await?
            .ok_or_else(|| StoreError::Pool("enqueue conflict but no existing row".into()))?;
        let status: String = existing.get(1);
        Ok(Enqueued {
            id: existing.get(0),
            status: JobStatus::parse(&status).unwrap_or(JobStatus::Queued),
            created: false,
            generation: existing.get(2),
            same_payload: existing.get(3),
        })
    }

    /// Remembers the stream sequence of a job's confirmed publish (see `job_published.sql`).
    pub async fn job_published(&self, id: &str, generation: i32, seq: u64) -> Result<()> {
        let client = self.client().await?;
        let st = client.prepare_cached(sql::JOB_PUBLISHED).await?;
        client
            .execute(&st, &[&id, &generation, &(seq as i64)])
            .await?;
        Ok(())
    }

    /// Publishes due scheduled jobs: locks up to `limit` of them (other pods skip locked
    /// rows), hands them to `publish`, and records what became of each — all in one
    /// transaction, so a crash in between leaves them `scheduled` for the next round (a
    /// message published twice is absorbed by the claim). `publish` must bound its own time:
    /// the rows stay locked meanwhile.
    pub async fn job_publish_due<F, Fut>(&self, limit: i64, publish: F) -> Result<DueRound>
    where
        F: FnOnce(Vec<DueJob>) -> Fut,
        Fut: std::future::Future<Output = PublishReport>,
    {
        let mut client = self.client().await?;
        let lock = client.prepare_cached(sql::JOB_DUE_LOCK).await?;
        let mark = client.prepare_cached(sql::JOB_DUE_PUBLISHED).await?;
        let dead = client.prepare_cached(sql::JOB_DEAD_UNPUBLISHABLE).await?;
        let tx = client.transaction().await?;
        let rows = tx.query(&lock, &[&limit]).await?;
        if rows.is_empty() {
            return Ok(DueRound::default());
        }
        let due: Vec<DueJob> = rows
            .into_iter()
            .map(|r| DueJob {
                id: r.get(0),
                queue: r.get(1),
                payload: r.get(2),
                priority: r.get(3),
                max_attempts: r.get(4),
                timeout_ms: r.get(5),
                generation: r.get(6),
                traceparent: r.get(7),
                attempts: r.get(8),
            })
            .collect();
        let locked = due.len();
        let report = publish(due).await;
        let ids: Vec<&str> = report.published.iter().map(|(id, _)| id.as_str()).collect();
        let seqs: Vec<i64> = report.published.iter().map(|(_, s)| *s as i64).collect();
        let retry = ms(PUBLISH_RETRY);
        let row = tx
            .query_one(
                &mark,
                &[&ids, &seqs, &report.duplicates, &report.failed, &retry],
            )
            .await?;
        let mut round = DueRound {
            locked,
            published: row.get::<_, i64>(0) as usize,
            duplicates: row.get::<_, i64>(1) as usize,
            failed: row.get::<_, i64>(2) as usize,
            dead: Vec::new(),
            first_error: report.first_error.clone(),
        };
        if !report.unpublishable.is_empty() {
            let ids: Vec<&str> = report
                .unpublishable
                .iter()
                .map(|(i, _)| i.as_str())
                .collect();
            let reasons: Vec<&str> = report
                .unpublishable
                .iter()
                .map(|(_, r)| r.as_str())
                .collect();
            round.dead = tx
                .query(&dead, &[&ids, &reasons])
                .await?
                .into_iter()
                .map(|r| (r.get(0), r.get(1), r.get(2)))
                .collect();
        }
        tx.commit().await?;
        Ok(round)
    }

    /// Adopts messages fetched by a worker that never claimed them: rows due now (see
    /// `job_adopt.sql`). Returns the ids adopted.
    pub async fn job_adopt(
        &self,
        batch: &[ClaimInput],
        seqs: &[Option<i64>],
    ) -> Result<Vec<String>> {
        // Members of batches (schema version 34) are judged first: one its batch refuses is
        // left in the stream (the claim keeps it as a dead job that says why).
        let verdicts = self.batch_join(batch).await?;
        let (batch, seqs): (
            std::borrow::Cow<[ClaimInput]>,
            std::borrow::Cow<[Option<i64>]>,
        ) = if batch.iter().any(|i| i.job.batch.is_some()) {
            let (b, s) = batch
                .iter()
                .zip(seqs)
                .zip(&verdicts)
                .filter(|(_, v)| v.refused.is_none())
                .map(|((input, seq), v)| {
                    let mut input = input.clone();
                    if v.joins.is_none() {
                        input.job.batch = None;
                    }
                    (input, *seq)
                })
                .unzip::<_, _, Vec<_>, Vec<_>>();
            (b.into(), s.into())
        } else {
            (batch.into(), seqs.into())
        };
        let (batch, seqs) = (&batch[..], &seqs[..]);
        let cols = Columns::of(batch);
        let expiries: Vec<Option<i64>> = batch.iter().map(|i| i.job.expires_at_ms).collect();
        let mut params: Vec<&(dyn ToSql + Sync)> = cols.params().to_vec();
        params.push(&expiries);
        params.push(cols.keys());
        params.push(&seqs);
        params.push(cols.gates());
        params.push(cols.batches());
        let client = self.client().await?;
        let st = client.prepare_cached(sql::JOB_ADOPT).await?;
        let rows = client.query(&st, &params).await?;
        Ok(rows.into_iter().map(|r| r.get(0)).collect())
    }

    /// Which of these ids have a row.
    pub async fn jobs_existing(&self, ids: &[&str]) -> Result<Vec<String>> {
        let client = self.client().await?;
        let st = client.prepare_cached(sql::JOBS_EXISTING).await?;
        let rows = client.query(&st, &[&ids]).await?;
        Ok(rows.into_iter().map(|r| r.get(0)).collect())
    }

    /// Dead-letters jobs that cannot run now (their queue was not served in time, or they
    /// reused a taken id), keeping each job's id, payload and settings; `reasons[i]` goes with
    /// `batch[i]`. Returns the ids inserted.
    pub async fn job_dead_kept(
        &self,
        worker_id: &str,
        batch: &[ClaimInput],
        reasons: &[String],
    ) -> Result<Vec<String>> {
        let cols = Columns::of(batch);
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![&worker_id];
        params.extend(cols.params());
        params.push(&reasons);
        params.push(cols.keys());
        params.push(cols.batches());
        let client = self.client().await?;
        let st = client.prepare_cached(sql::JOB_DEAD_KEPT).await?;
        let rows = client.query(&st, &params).await?;
        Ok(rows.into_iter().map(|r| r.get(0)).collect())
    }

    /// For messages of an unserved queue whose job id has a row: the ids whose row holds the
    /// same payload (the same job), with whether that row was just dead-lettered (it was
    /// still waiting). See `job_dead_unserved_existing.sql`.
    pub async fn job_dead_unserved_existing(
        &self,
        items: &[(&str, &Value, &str)],
    ) -> Result<Vec<(String, bool)>> {
        let ids: Vec<&str> = items.iter().map(|i| i.0).collect();
        let payloads: Vec<&Value> = items.iter().map(|i| i.1).collect();
        let reasons: Vec<&str> = items.iter().map(|i| i.2).collect();
        let client = self.client().await?;
        let st = client
            .prepare_cached(sql::JOB_DEAD_UNSERVED_EXISTING)
            .await?;
        let rows = client.query(&st, &[&ids, &payloads, &reasons]).await?;
        Ok(rows.into_iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    /// Replaces what is known about unserved subjects with one janitor round's view:
    /// (subject, queue, messages, oldest stored time, dead-letter time).
    pub async fn unserved_record(
        &self,
        rows: &[(String, String, i64, SystemTime, SystemTime)],
    ) -> Result<()> {
        let subjects: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
        let queues: Vec<&str> = rows.iter().map(|r| r.1.as_str()).collect();
        let counts: Vec<i64> = rows.iter().map(|r| r.2).collect();
        let oldest: Vec<SystemTime> = rows.iter().map(|r| r.3).collect();
        let due: Vec<SystemTime> = rows.iter().map(|r| r.4).collect();
        let client = self.client().await?;
        let st = client.prepare_cached(sql::UNSERVED_RECORD).await?;
        client
            .execute(&st, &[&subjects, &queues, &counts, &oldest, &due])
            .await?;
        Ok(())
    }

    /// Subjects with messages no pod serves, as the janitors last saw them.
    pub async fn unserved_list(&self) -> Result<Vec<UnservedRow>> {
        let client = self.client().await?;
        let st = client.prepare_cached(sql::UNSERVED_LIST).await?;
        Ok(client
            .query(&st, &[])
            .await?
            .into_iter()
            .map(|r| UnservedRow {
                subject: r.get(0),
                queue: r.get(1),
                messages: r.get(2),
                oldest_seconds: r.get(3),
                dead_letter_in_seconds: r.get(4),
                seen_seconds_ago: r.get(5),
            })
            .collect())
    }
}
