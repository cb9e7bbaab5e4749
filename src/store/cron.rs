//! Cron fires (`cron_state`, migration V6): one transaction per schedule and tick.

use super::{sql, Result, Store};
use crate::cron::{self, Schedule};
use chrono::{DateTime, TimeZone, Utc};

/// Most fires on time enqueued in one tick (missed fires are never enumerated: the policy
/// runs the latest once or skips it).
const FIRES_PER_TICK: usize = 1000;

fn at_ms(ms: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(ms).single().unwrap_or_default()
}

impl Store {
    /// Enqueues the fires of `s` due since its last tick (by the database clock), unless
    /// another worker is doing it right now. Returns the ids of the jobs enqueued.
    pub async fn cron_tick(&self, s: &Schedule) -> Result<Vec<String>> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        // First sight of a schedule: it fires from now on (nothing before it existed).
        tx.execute(sql::CRON_FIRST_SIGHT, &[&s.name]).await?;
        let Some(row) = tx.query_opt(sql::CRON_LOCK, &[&s.name]).await? else {
            return Ok(Vec::new()); // another worker holds it this moment
        };
        let (last, now) = (at_ms(row.get(0)), at_ms(row.get(1)));
        let due = s.due(last, now, FIRES_PER_TICK);
        let Some(newest) = due.newest else {
            // Nothing due; the first sight's row must stay.
            tx.commit().await?;
            return Ok(Vec::new());
        };
        let mut ids = Vec::new();
        let c = &s.config;
        for at in due.fires {
            let id = cron::fire_id(&s.name, at);
            let got: String = tx
                .query_one(
                    sql::CRON_ENQUEUE,
                    &[
                        &c.queue,
                        &c.payload,
                        &c.priority.get(),
                        &(at.timestamp_millis() as f64),
                        &id,
                        &c.expires_in
                            .map(|e| e.as_millis().min(i64::MAX as u128) as i64),
                        &c.key,
                    ],
                )
                .await?
                .get(0);
            ids.push(got);
        }
        tx.execute(
            sql::CRON_FIRED,
            &[&s.name, &(newest.timestamp_millis() as f64)],
        )
        .await?;
        tx.commit().await?;
        Ok(ids)
    }

    /// When each schedule last fired (for `jobwarden cron list`).
    pub async fn cron_last_fires(&self) -> Result<Vec<(String, DateTime<Utc>)>> {
        let c = self.client().await?;
        let rows = c.query(sql::CRON_LAST_FIRES, &[]).await?;
        Ok(rows.iter().map(|r| (r.get(0), at_ms(r.get(1)))).collect())
    }
}
