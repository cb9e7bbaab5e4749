//! Completion from outside (schema version 31): the schema's token key, `complete()` and
//! `fail()` with their refusals recorded, and the deadline sweep.

use super::{sql, Result, Store, StoreError};
use crate::completion::{CompletionKey, Ended, Refusal, Refused};
use serde_json::Value;
use std::time::Duration;

/// What a completion or failure from outside answers: how it ended, or why it was refused
/// (the refusal is recorded when it names an existing job).
pub type EndResult = std::result::Result<Ended, Refused>;

/// An awaiting job whose deadline passed, as the sweep ended it.
#[derive(Debug, Clone)]
pub struct Expired {
    pub id: String,
    pub queue: String,
    /// `scheduled` (retried) or `dead`.
    pub status: String,
}

impl Store {
    /// The schema's completion key (`completion_key`, version 31).
    pub async fn completion_key(&self) -> Result<CompletionKey> {
        let c = self.client().await?;
        let st = c.prepare_cached(sql::COMPLETION_KEY).await?;
        let row = c.query_one(&st, &[]).await?;
        let (ipad, opad): (Vec<u8>, Vec<u8>) = (row.get(0), row.get(1));
        CompletionKey::from_pads(&ipad, &opad)
            .ok_or_else(|| StoreError::Pool("completion_key: pads are not 64 bytes".into()))
    }

    /// `complete(id, token, result)`; `who` is recorded with a refusal (the API's worker, the
    /// CLI's user).
    pub async fn complete_job(
        &self,
        id: &str,
        token: &str,
        result: Option<&Value>,
        who: &str,
    ) -> Result<EndResult> {
        let c = self.client().await?;
        let st = c.prepare_cached(sql::JOB_COMPLETE).await?;
        let answer = c.query_one(&st, &[&id, &token, &result]).await;
        self.ended(&c, answer, id, token, who).await
    }

    /// `fail(id, token, error, permanent, retry_after_ms)`.
    pub async fn fail_job(
        &self,
        id: &str,
        token: &str,
        error: &str,
        permanent: bool,
        retry_after: Option<Duration>,
        who: &str,
    ) -> Result<EndResult> {
        let c = self.client().await?;
        let st = c.prepare_cached(sql::JOB_FAIL).await?;
        let ms = retry_after.map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let answer = c
            .query_one(&st, &[&id, &token, &error, &permanent, &ms])
            .await;
        self.ended(&c, answer, id, token, who).await
    }

    /// Reads the answer of `complete()` or `fail()`: its outcome, or the refusal (recorded
    /// when it names an existing job: its own transaction rolled back).
    async fn ended(
        &self,
        c: &deadpool_postgres::Object,
        answer: std::result::Result<tokio_postgres::Row, tokio_postgres::Error>,
        id: &str,
        token: &str,
        who: &str,
    ) -> Result<EndResult> {
        let e = match answer {
            Ok(row) => {
                let text: String = row.get(0);
                return Ended::parse(&text)
                    .map(Ok)
                    .ok_or_else(|| StoreError::Pool(format!("unexpected answer {text:?}")));
            }
            Err(e) => e,
        };
        let Some(refusal) = e
            .as_db_error()
            .and_then(|db| Refusal::from_sqlstate(db.code().code()))
        else {
            return Err(e.into());
        };
        let db = e.as_db_error().expect("a database error");
        let mut message = db.message().to_string();
        if let Some(h) = db.hint() {
            message.push_str("; ");
            message.push_str(h);
        }
        if refusal.recorded() {
            let st = c.prepare_cached(sql::COMPLETION_REFUSED).await?;
            c.execute(&st, &[&id, &token, &who, &message]).await?;
            tracing::warn!(job.id = %id, %who, "completion refused: {message}");
        }
        Ok(Err(Refused { refusal, message }))
    }

    /// Ends up to `limit` awaiting jobs whose deadline passed (retried or dead by policy).
    pub async fn job_await_expire(&self, limit: i32) -> Result<Vec<Expired>> {
        let c = self.raw().await?;
        let st = c.prepare_cached(sql::JOB_AWAIT_EXPIRE).await?;
        Ok(c.query(&st, &[&limit])
            .await?
            .into_iter()
            .map(|r| Expired {
                id: r.get(0),
                queue: r.get(1),
                status: r.get(2),
            })
            .collect())
    }
}
