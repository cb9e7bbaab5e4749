//! The keyed-queue statements as the tests drive them by hand (the `work` queue): park a
//! group, take from it, complete what was taken, count what runs per key.

use super::TestEnv;
use jobwarden::config::KeyRules;
use jobwarden::job::NewJob;
use jobwarden::store::{ClaimInput, Store};
use serde_json::json;
use std::collections::HashMap;
use std::time::Duration;

/// The stale_after the tests' takes declare.
pub const STALE: Duration = Duration::from_secs(60);

/// A new job of queue `work` with `key` (also in its payload, as `k`).
pub fn keyed_input(id: &str, key: Option<&str>) -> ClaimInput {
    let mut job = NewJob::plain(id.into(), "work".into(), json!({ "k": key }));
    job.key = key.map(str::to_string);
    ClaimInput {
        job,
        max_attempts: 3,
        traceparent: None,
    }
}

/// Parks `inputs` (stream sequences from `seq0` on) as `worker`.
pub async fn park(store: &Store, worker: &str, rules: KeyRules, seq0: i64, inputs: &[ClaimInput]) {
    let seqs: Vec<i64> = (0..inputs.len() as i64).map(|i| seq0 + i).collect();
    let answer = store
        .job_intake(worker, None, rules, &seqs, inputs)
        .await
        .unwrap();
    assert!(answer.alive && !answer.paused);
}

/// Takes up to `want` parked jobs of `work` as `worker`: their ids.
pub async fn take(store: &Store, worker: &str, want: usize, rules: KeyRules) -> Vec<String> {
    store
        .job_take("work", worker, want, (STALE, None), rules, None)
        .await
        .unwrap()
        .jobs
        .into_iter()
        .map(|t| t.id)
        .collect()
}

/// Ends `ids` completed.
pub async fn complete(env: &TestEnv, ids: &[String]) {
    let c = env.store.raw().await.unwrap();
    c.execute(
        "UPDATE jobs SET status = 'completed', completed_at = now() WHERE id = ANY($1)",
        &[&ids],
    )
    .await
    .unwrap();
}

/// Running jobs per key, as the database has them ('' for none).
pub async fn running_per_key(env: &TestEnv) -> HashMap<String, i64> {
    let c = env.store.raw().await.unwrap();
    c.query(
        "SELECT key, count(*) FROM jobs WHERE status = 'processing' GROUP BY key",
        &[],
    )
    .await
    .unwrap()
    .into_iter()
    .map(|r| (r.get::<_, Option<String>>(0).unwrap_or_default(), r.get(1)))
    .collect()
}
