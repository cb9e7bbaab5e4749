//! What jobwarden promises about runs, checked from both sides: the application counts every
//! time its handler was called for a job (every call, not what an idempotent ledger kept),
//! and jobwarden's own record says how often it handed the job out and how each attempt
//! ended. A job reaches its handler again only through a recorded retry or crash:
//!
//! - calls ≤ claims: the handler never ran a job more often than jobwarden handed it out
//!   (each claim bumps the job's `lease`, the fencing token, by one);
//! - every claim before the last has a recorded end in `job_attempts` (retry, dead, released,
//!   restarted, owner_dead, stale, self_fenced…): a claim while the previous attempt still
//!   ran, or after it completed, has none — its late result is only rejected
//!   (`lost_ownership`);
//! - a completed job ran at least once, and nothing ran that jobwarden has no job for.
//!
//! An idempotent fake (a gateway that replays a charge for a key it has seen) hides a job run
//! twice; this does not. Used by the payment examples and tests/ (through tests/common).

// Shared by several examples and tests; each uses part of it.
#![allow(dead_code)]

use std::collections::HashMap;

/// The jobs of `queues` whose runs jobwarden's record does not explain, one line each
/// (empty when every run is explained). `calls` is the number of handler calls per job id,
/// as the application counted them.
pub async fn unexplained_runs(
    db: &tokio_postgres::Client,
    queues: &[&str],
    calls: &HashMap<String, usize>,
) -> Result<Vec<String>, tokio_postgres::Error> {
    let rows = db
        .query(
            "SELECT j.id, j.status, j.lease, \
                    ARRAY(SELECT DISTINCT a.lease FROM job_attempts a \
                          WHERE a.job_id = j.id \
                            AND a.outcome NOT IN ('lost_ownership', 'completion_refused') \
                          ORDER BY a.lease) \
             FROM jobs j WHERE j.queue = ANY($1) ORDER BY j.id",
            &[&queues],
        )
        .await?;
    let mut bad = Vec::new();
    let mut known = std::collections::HashSet::new();
    for r in &rows {
        let (id, status, lease, ended): (String, String, i64, Vec<i64>) =
            (r.get(0), r.get(1), r.get(2), r.get(3));
        let ran = calls.get(&id).copied().unwrap_or(0);
        if ran as i64 > lease {
            bad.push(format!(
                "job {id} reached its handler {ran} times but jobwarden handed it out {lease} \
                 times (lease {lease}): it ran more often than it was claimed"
            ));
        }
        let unended: Vec<i64> = (1..lease).filter(|l| !ended.contains(l)).collect();
        if !unended.is_empty() {
            bad.push(format!(
                "job {id} was claimed {lease} times but attempt(s) with lease {unended:?} have \
                 no recorded end (retry, release or reclaim): it was handed out again while it \
                 ran or after it was done; recorded ends: {ended:?}, handler calls: {ran}"
            ));
        }
        if status == "completed" && ran == 0 {
            bad.push(format!(
                "job {id} is completed but its handler was never called"
            ));
        }
        known.insert(id);
    }
    for (id, n) in calls {
        if !known.contains(id) {
            bad.push(format!(
                "the handler ran {id} {n} time(s) but queues {queues:?} have no such job"
            ));
        }
    }
    bad.sort();
    Ok(bad)
}
