//! Cron fires (`cron_state`, migration V6): one transaction per schedule and tick.

use super::{Result, Store};
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
        tx.execute(
            "INSERT INTO cron_state (name, last_fire_at) VALUES ($1, now()) \
             ON CONFLICT (name) DO NOTHING",
            &[&s.name],
        )
        .await?;
        let Some(row) = tx
            .query_opt(
                "SELECT (extract(epoch FROM last_fire_at) * 1000)::int8, \
                        (extract(epoch FROM now()) * 1000)::int8 \
                 FROM cron_state WHERE name = $1 FOR UPDATE SKIP LOCKED",
                &[&s.name],
            )
            .await?
        else {
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
                    "SELECT enqueue($1, $2, $3::int2::int4, \
                     run_at => to_timestamp($4::float8 / 1000), id => $5)",
                    &[
                        &c.queue,
                        &c.payload,
                        &c.priority,
                        &(at.timestamp_millis() as f64),
                        &id,
                    ],
                )
                .await?
                .get(0);
            ids.push(got);
        }
        tx.execute(
            "UPDATE cron_state SET last_fire_at = to_timestamp($2::float8 / 1000), \
             updated_at = now() WHERE name = $1",
            &[&s.name, &(newest.timestamp_millis() as f64)],
        )
        .await?;
        tx.commit().await?;
        Ok(ids)
    }

    /// When each schedule last fired (for `jobwarden cron list`).
    pub async fn cron_last_fires(&self) -> Result<Vec<(String, DateTime<Utc>)>> {
        let c = self.client().await?;
        let rows = c
            .query(
                "SELECT name, (extract(epoch FROM last_fire_at) * 1000)::int8 FROM cron_state",
                &[],
            )
            .await?;
        Ok(rows.iter().map(|r| (r.get(0), at_ms(r.get(1)))).collect())
    }
}
