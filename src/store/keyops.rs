//! Operating a keyed queue (schema version 22): the per-key overrides operators set
//! (`key_limits`, through `set_key_limit()`), the busiest keys (`jobwarden keys list`,
//! `stats`, the dashboard), skipping an ordered key's dead head (`skip_key_job()`), and the
//! key rules a worker declares for `jobs show`.

use super::sql;
use super::{Result, Store};
use crate::config::{KeyRules, RateLimit};
use serde::Serialize;
use std::time::Duration;

/// The overrides of one key of a queue (`key_limits`); `None`: the queue's setting.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KeyLimit {
    pub queue: String,
    pub key: String,
    pub concurrency: Option<i32>,
    /// Starts per window, written as the configuration writes it ("5/1s").
    pub rate: Option<String>,
    pub weight: Option<f32>,
    pub set_by: String,
    /// Seconds since the Unix epoch.
    pub set_at: f64,
}

/// One of a keyed queue's busiest keys: its parked jobs (its backlog) and running ones.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BusyKey {
    pub queue: String,
    /// `""` for the jobs without a key.
    pub key: String,
    pub parked: i64,
    pub running: i64,
}

/// How many busiest keys per queue `stats` and the dashboard show.
pub const BUSIEST_KEYS: i64 = 10;

fn key_limit(r: &tokio_postgres::Row) -> KeyLimit {
    let rate = r
        .get::<_, Option<i32>>(3)
        .zip(r.get::<_, Option<i64>>(4))
        .map(|(n, ms)| {
            RateLimit {
                starts: n.max(0) as u32,
                window: Duration::from_millis(ms.max(0) as u64),
            }
            .to_string()
        });
    KeyLimit {
        queue: r.get(0),
        key: r.get(1),
        concurrency: r.get(2),
        rate,
        weight: r.get(5),
        set_by: r.get(6),
        set_at: r.get(7),
    }
}

impl Store {
    /// Sets a key's overrides (the values given; the others are kept). Refused, in the
    /// function's words (`StoreError::rejected_data`), for a bad value.
    pub async fn key_limit_set(
        &self,
        queue: &str,
        key: &str,
        (concurrency, rate, weight): (Option<i32>, Option<&str>, Option<f32>),
        by: &str,
    ) -> Result<KeyLimit> {
        let c = self.ops().await?;
        let st = c.prepare_cached(sql::KEY_LIMIT_SET).await?;
        let r = c
            .query_one(&st, &[&queue, &key, &concurrency, &rate, &weight, &by])
            .await?;
        Ok(key_limit(&r))
    }

    /// Drops a key's overrides; whether it had some.
    pub async fn key_limit_unset(&self, queue: &str, key: &str) -> Result<bool> {
        let c = self.ops().await?;
        let st = c.prepare_cached(sql::KEY_LIMIT_UNSET).await?;
        Ok(c.query_one(&st, &[&queue, &key]).await?.get(0))
    }

    /// The overrides, of one queue or all.
    pub async fn key_limits(&self, queue: Option<&str>) -> Result<Vec<KeyLimit>> {
        let c = self.ops().await?;
        let st = c.prepare_cached(sql::KEY_LIMITS_LIST).await?;
        Ok(c.query(&st, &[&queue])
            .await?
            .iter()
            .map(key_limit)
            .collect())
    }

    /// The busiest keys of each keyed queue (or of `queue`): at most `per_queue` each, the
    /// longest backlog first.
    pub async fn key_busiest(&self, queue: Option<&str>, per_queue: i64) -> Result<Vec<BusyKey>> {
        let c = self.ops().await?;
        let st = c.prepare_cached(sql::KEY_BUSIEST).await?;
        Ok(c.query(&st, &[&queue, &per_queue])
            .await?
            .iter()
            .map(|r| BusyKey {
                queue: r.get(0),
                key: r.get(1),
                parked: r.get(2),
                running: r.get(3),
            })
            .collect())
    }

    /// Lets an ordered key's dead job go (its key's later jobs run on), recorded with `by`;
    /// returns its key. Refused, in the function's words, for a job that holds no key.
    pub async fn key_job_skip(&self, id: &str, by: &str) -> Result<String> {
        let c = self.ops().await?;
        let st = c.prepare_cached(sql::KEY_JOB_SKIP).await?;
        Ok(c.query_one(&st, &[&id, &by]).await?.get(0))
    }

    /// Records the key rules this worker runs `queue` with (read by `jobs show`).
    pub async fn key_rules_declare(&self, queue: &str, rules: KeyRules) -> Result<()> {
        let cap = rules.concurrency.map(|c| c.min(i32::MAX as u32) as i32);
        let rate_n = rules.rate.map(|r| r.starts.min(i32::MAX as u32) as i32);
        let rate_ms = rules.rate.map(|r| super::jobs::ms(r.window));
        let c = self.client().await?;
        let st = c.prepare_cached(sql::KEY_RULES_DECLARE).await?;
        c.execute(
            &st,
            &[
                &queue,
                &cap,
                &rate_n,
                &rate_ms,
                &rules.ordered,
                &rules.dead_blocks,
                &rules.fair,
            ],
        )
        .await?;
        Ok(())
    }
}
