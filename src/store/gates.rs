//! Debounce, throttle and unique_for (schema version 23): what a worker declares of its
//! queues' settings, for the jobs that do not come through its claim (`queue_gates`).

use super::{sql, Result, Store};
use crate::contract::Gate;

impl Store {
    /// Declares, as `worker_id`, each queue's debounce, throttle and unique_for (a queue with
    /// none as none): SQL `enqueue()`, the CLI, the Rust client, cron and `then` apply them.
    pub async fn queue_gates_declare(
        &self,
        worker_id: &str,
        queues: &[(String, Gate)],
    ) -> Result<()> {
        let names: Vec<&str> = queues.iter().map(|(q, _)| q.as_str()).collect();
        let col =
            |f: fn(&Gate) -> Option<i64>| queues.iter().map(|(_, g)| f(g)).collect::<Vec<_>>();
        let (d, m) = (col(|g| g.debounce_ms), col(|g| g.max_wait_ms));
        let (t, u) = (col(|g| g.throttle_ms), col(|g| g.unique_for_ms));
        let c = self.client().await?;
        let st = c.prepare_cached(sql::QUEUE_GATES_DECLARE).await?;
        c.execute(&st, &[&worker_id, &names, &d, &m, &t, &u])
            .await?;
        Ok(())
    }
}
