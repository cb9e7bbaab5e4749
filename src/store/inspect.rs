//! Read-only queries for operators: `jobwarden jobs show` and `jobs list`. Timestamps are
//! rendered by PostgreSQL (UTC, ISO 8601) so the output matches what `psql` shows.

use super::{Result, Store};
use serde::Serialize;
use serde_json::Value;

/// A job as `jobs show` prints it.
#[derive(Debug, Clone, Serialize)]
pub struct JobRow {
    pub id: String,
    pub queue: String,
    pub status: String,
    pub priority: i16,
    pub attempts: i32,
    pub max_attempts: i32,
    pub worker_id: Option<String>,
    pub lease: i64,
    pub stage: Option<String>,
    pub progress: Option<f32>,
    pub message: Option<String>,
    pub last_error: Option<String>,
    pub payload: Value,
    pub result: Option<Value>,
    pub idempotency_key: Option<String>,
    pub created_at: String,
    pub scheduled_at: String,
    pub started_at: Option<String>,
    pub last_activity_at: Option<String>,
    pub completed_at: Option<String>,
}

/// One attempt of a job.
#[derive(Debug, Clone, Serialize)]
pub struct AttemptRow {
    pub attempt: i32,
    pub lease: i64,
    /// None for events that were not attempts (`broker_lost`).
    pub worker_id: Option<String>,
    pub started_at: Option<String>,
    pub duration_ms: Option<i64>,
    pub outcome: String,
    pub error: Option<String>,
}

const TS: &str = "YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"";

/// The columns `job_row` reads, in order.
const JOB_COLUMNS: &str = "id, queue, status, priority, attempts, max_attempts, worker_id, lease,
    stage, progress, message, last_error, payload, result, idempotency_key,
    to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),
    to_char(scheduled_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),
    to_char(started_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),
    to_char(last_activity_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),
    to_char(completed_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')";

fn job_row(r: tokio_postgres::Row) -> JobRow {
    JobRow {
        id: r.get(0),
        queue: r.get(1),
        status: r.get(2),
        priority: r.get(3),
        attempts: r.get(4),
        max_attempts: r.get(5),
        worker_id: r.get(6),
        lease: r.get(7),
        stage: r.get(8),
        progress: r.get(9),
        message: r.get(10),
        last_error: r.get(11),
        payload: r.get(12),
        result: r.get(13),
        idempotency_key: r.get(14),
        created_at: r.get(15),
        scheduled_at: r.get(16),
        started_at: r.get(17),
        last_activity_at: r.get(18),
        completed_at: r.get(19),
    }
}

impl Store {
    pub async fn job_get(&self, id: &str) -> Result<Option<JobRow>> {
        let c = self.raw().await?;
        let sql = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = $1");
        Ok(c.query_opt(&sql, &[&id]).await?.map(job_row))
    }

    pub async fn job_attempts(&self, id: &str) -> Result<Vec<AttemptRow>> {
        let c = self.raw().await?;
        let sql = format!(
            "SELECT attempt, lease, worker_id, to_char(started_at AT TIME ZONE 'UTC', '{TS}'),
                    (extract(epoch FROM finished_at - started_at) * 1000)::int8, outcome, error
             FROM job_attempts WHERE job_id = $1 ORDER BY finished_at, id"
        );
        let rows = c.query(&sql, &[&id]).await?;
        Ok(rows
            .into_iter()
            .map(|r| AttemptRow {
                attempt: r.get(0),
                lease: r.get(1),
                worker_id: r.get(2),
                started_at: r.get(3),
                duration_ms: r.get(4),
                outcome: r.get(5),
                error: r.get(6),
            })
            .collect())
    }

    /// Newest first, filtered by queue and/or status.
    pub async fn job_list(
        &self,
        queue: Option<&str>,
        status: Option<&str>,
        limit: i64,
    ) -> Result<Vec<JobRow>> {
        let c = self.raw().await?;
        let sql = format!(
            "SELECT {JOB_COLUMNS} FROM jobs
             WHERE ($1::text IS NULL OR queue = $1) AND ($2::text IS NULL OR status = $2)
             ORDER BY created_at DESC, id LIMIT $3"
        );
        let rows = c.query(&sql, &[&queue, &status, &limit]).await?;
        Ok(rows.into_iter().map(job_row).collect())
    }

    /// Count of jobs per (queue, status), for the demo and tests.
    pub async fn job_counts(&self) -> Result<Vec<(String, String, i64)>> {
        let c = self.raw().await?;
        let rows = c
            .query(
                "SELECT queue, status, count(*) FROM jobs GROUP BY 1, 2 ORDER BY 1, 2",
                &[],
            )
            .await?;
        Ok(rows
            .into_iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect())
    }
}
