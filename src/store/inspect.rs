//! Read-only queries for operators: `jobwarden jobs show` and `jobs list`. Timestamps are
//! rendered by PostgreSQL (UTC, ISO 8601) so the output matches what `psql` shows.

use super::sql;
use super::{Result, Store};
use serde::Serialize;
use serde_json::Value;
use std::time::Duration;

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
    /// The chain it belongs to (the id of the chain's first job), if any.
    pub pipeline: Option<String>,
    /// Not started by then, it never runs (ends `cancelled` as expired).
    pub expires_at: Option<String>,
    /// What groups it with other jobs (a customer, a tenant), if it has a key.
    pub key: Option<String>,
    /// An awaiting job's deadline (its handler deferred it; version 31). Kept after the
    /// attempt ends.
    pub await_until: Option<String>,
    /// The batch it is a member of (version 32).
    pub batch: Option<String>,
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

/// A row of `job_get.sql`, `job_list.sql` or `dead_list.sql` (the same columns, in order).
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
        pipeline: r.get(20),
        expires_at: r.get(21),
        key: r.get(22),
        await_until: r.get(23),
        batch: r.get(24),
    }
}

impl Store {
    pub async fn job_get(&self, id: &str) -> Result<Option<JobRow>> {
        let c = self.ops().await?;
        Ok(c.query_opt(sql::JOB_GET, &[&id]).await?.map(job_row))
    }

    pub async fn job_attempts(&self, id: &str) -> Result<Vec<AttemptRow>> {
        let c = self.ops().await?;
        let rows = c.query(sql::JOB_ATTEMPTS, &[&id]).await?;
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

    /// What job `id` waits for, in words (`None`: no such job).
    pub async fn job_explain(&self, id: &str) -> Result<Option<String>> {
        let c = self.ops().await?;
        let Some(r) = c.query_opt(sql::JOB_EXPLAIN, &[&id]).await? else {
            return Ok(None);
        };
        Ok(Some(explain(&Waiting {
            status: r.get(0),
            attempts: r.get(1),
            due_in: Duration::from_millis(r.get::<_, i64>(2).max(0) as u64),
            ahead_higher: r.get(3),
            ahead_same: r.get(4),
            running: r.get(5),
            workers_alive: r.get(6),
            cap: r.get(7),
            rate: r
                .get::<_, Option<i32>>(8)
                .zip(r.get::<_, Option<i64>>(9))
                .map(|(n, ms)| (n, Duration::from_millis(ms.max(0) as u64))),
            cap_held: r.get(10),
            rate_used: r.get(11),
            paused: r
                .get::<_, Option<f64>>(12)
                .zip(r.get::<_, Option<String>>(13)),
            key: r.get::<_, Option<String>>(14).map(|key| KeyWait {
                key,
                parked: r.get(15),
                cap: r.get(16),
                running: r.get(17),
                rate: r
                    .get::<_, Option<i32>>(18)
                    .zip(r.get::<_, Option<i64>>(19))
                    .map(|(n, ms)| (n, Duration::from_millis(ms.max(0) as u64))),
                rate_used: r.get(20),
                ordered: r.get(21),
                ahead: r
                    .get::<_, Option<String>>(22)
                    .zip(r.get::<_, Option<String>>(23)),
                keys_ahead: r.get(24),
                key_before: r.get(25),
                skipped: r
                    .get::<_, Option<String>>(26)
                    .zip(r.get::<_, Option<f64>>(27)),
                dead_blocks: r.get(28),
                later_started: r.get(29),
            }),
        })))
    }

    /// Newest first, filtered by queue, status and/or key.
    pub async fn job_list(
        &self,
        queue: Option<&str>,
        status: Option<&str>,
        key: Option<&str>,
        limit: i64,
    ) -> Result<Vec<JobRow>> {
        let c = self.ops().await?;
        let rows = c
            .query(sql::JOB_LIST, &[&queue, &status, &limit, &key])
            .await?;
        Ok(rows.into_iter().map(job_row).collect())
    }

    /// The dead-letter queue: dead jobs, the most recently dead first (a job enqueued days
    /// ago that used up its retries just now is on top).
    pub async fn dead_list(&self, queue: Option<&str>, limit: i64) -> Result<Vec<JobRow>> {
        let c = self.ops().await?;
        let rows = c.query(sql::DEAD_LIST, &[&queue, &limit]).await?;
        Ok(rows.into_iter().map(job_row).collect())
    }

    /// Count of jobs per (queue, status), for the demo and tests.
    pub async fn job_counts(&self) -> Result<Vec<(String, String, i64)>> {
        let c = self.ops().await?;
        let rows = c.query(sql::JOB_COUNTS, &[]).await?;
        Ok(rows
            .into_iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect())
    }
}

/// What a job that is not running waits for, in numbers (see `job_explain.sql`).
#[derive(Debug, Clone, PartialEq)]
pub struct Waiting {
    pub status: String,
    pub attempts: i32,
    pub due_in: Duration,
    pub ahead_higher: i64,
    pub ahead_same: i64,
    pub running: i64,
    pub workers_alive: i64,
    /// The queue's cluster-wide cap and rate limit (starts per window), if any.
    pub cap: Option<i32>,
    pub rate: Option<(i32, Duration)>,
    /// Grants running under the cap; starts inside the rate limit's window.
    pub cap_held: i64,
    pub rate_used: i64,
    /// When the queue is paused: for how long (seconds) and by whom.
    pub paused: Option<(f64, String)>,
    /// The job's key and what it holds (`None`: the job has no key).
    pub key: Option<KeyWait>,
}

/// What a job's key holds it to (a keyed queue; see `job_explain.sql`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct KeyWait {
    pub key: String,
    /// Parked: waiting in PostgreSQL for a take.
    pub parked: bool,
    /// The key's limit (its override, else the queue's key_concurrency; 1 when ordered) and
    /// its running jobs.
    pub cap: Option<i32>,
    pub running: i64,
    /// The key's rate (its override, else the queue's key_rate_limit) and the starts that
    /// count in its window.
    pub rate: Option<(i32, Duration)>,
    pub rate_used: i64,
    pub ordered: bool,
    /// An ordered key's job that goes first: (id, running | retrying | dead | parked).
    pub ahead: Option<(String, String)>,
    /// Keys whose first job comes before this job's turn; parked jobs of its key before it.
    pub keys_ahead: i64,
    pub key_before: i64,
    /// Skipped in its key's order: by whom, when (seconds since the epoch).
    pub skipped: Option<(String, f64)>,
    /// In an ordered queue, a dead job holds its key (ordered_on_dead = "block").
    pub dead_blocks: bool,
    /// A dead job's key's later jobs (after it in the key's order) that have started (an ordered
    /// key runs them only once it is out of the way).
    pub later_started: i64,
}

/// Why a parked job waits: what of its key holds it, else its turn.
fn key_reason(k: &KeyWait) -> String {
    let key = &k.key;
    if let Some((id, status)) = &k.ahead {
        return format!("waiting: key {key} is ordered and job {id} is ahead of it ({status})");
    }
    if let Some(cap) = k.cap.filter(|c| k.running >= i64::from(*c)) {
        return format!("waiting: key {key} has {} running (limit {cap})", k.running);
    }
    if let Some((n, win)) = k.rate.filter(|(n, _)| k.rate_used >= i64::from(*n)) {
        let win = crate::config::fmt_dur(win);
        return format!(
            "waiting: key {key} started {} jobs in the last {win} (limit {n}/{win})",
            k.rate_used
        );
    }
    let mut s = format!("waiting: its turn ({} keys ahead", k.keys_ahead);
    if k.key_before > 0 {
        s.push_str(&format!(", {} jobs of key {key} before it", k.key_before));
    }
    s.push(')');
    s
}

/// What a dead job means to its key's order.
fn dead_key_note(k: &KeyWait) -> Option<String> {
    let key = &k.key;
    if let Some((by, at)) = &k.skipped {
        let at = chrono::DateTime::from_timestamp(*at as i64, 0)
            .map(|t| t.format("%Y-%m-%d %H:%M:%SZ").to_string())
            .unwrap_or_default();
        return Some(format!(
            "skipped in the order of key {key} by {by} at {at}: its later jobs run on \
             ({} of them started)",
            k.later_started
        ));
    }
    if !k.ordered {
        return None;
    }
    Some(if k.dead_blocks {
        format!(
            "holds the later jobs of ordered key {key}: retry it (`jobwarden dlq retry <id>`) \
             or skip it (`jobwarden keys skip <id>`)"
        )
    } else {
        format!(
            "key {key} went on without it (ordered_on_dead = \"skip\"): {} of its later jobs \
             started",
            k.later_started
        )
    })
}

/// Says in words what a job waits for.
pub fn explain(w: &Waiting) -> String {
    let due = crate::config::fmt_dur(w.due_in);
    match w.status.as_str() {
        "scheduled" if w.due_in.is_zero() => {
            "due now: the scheduler publishes it within scheduler_every".to_string()
        }
        "scheduled" if w.attempts == 0 => format!("waits for its run_at: due in {due}"),
        "scheduled" => format!(
            "waits out its retry backoff after attempt {} failed: due in {due}",
            w.attempts
        ),
        "queued" if w.paused.is_some() => {
            let (for_seconds, by) = w.paused.clone().unwrap_or_default();
            format!(
                "waits for its queue to be resumed: paused {} ago by {by} (`jobwarden queues \
                 resume <queue>`); {} of its queue running, {} worker(s) alive",
                crate::config::fmt_dur(Duration::from_secs(for_seconds.max(0.0) as u64)),
                w.running,
                w.workers_alive
            )
        }
        "queued" if w.key.as_ref().is_some_and(|k| k.parked) => {
            let k = w.key.as_ref().expect("a key");
            format!(
                "{}; {} of its queue running, {} worker(s) alive",
                key_reason(k),
                w.running,
                w.workers_alive
            )
        }
        "dead" => match w.key.as_ref().and_then(dead_key_note) {
            Some(note) => format!("dead: waits for nothing; {note}"),
            None => "dead: waits for nothing".to_string(),
        },
        "queued" => {
            let mut s = if let Some(cap) = w.cap.filter(|c| w.cap_held >= i64::from(*c)) {
                format!(
                    "waits for the queue's cluster-wide cap: {} of {cap} running \
                     (global_concurrency)",
                    w.cap_held
                )
            } else if let Some((n, win)) = w.rate.filter(|(n, _)| w.rate_used >= i64::from(*n)) {
                format!(
                    "waits for a token of its queue's rate limit ({n}/{}: {} started in the \
                     last {})",
                    crate::config::fmt_dur(win),
                    w.rate_used,
                    crate::config::fmt_dur(win)
                )
            } else if w.ahead_higher > 0 {
                format!(
                    "waits for a slot behind {} queued job(s) of higher priority and {} older \
                     one(s) of its own priority",
                    w.ahead_higher, w.ahead_same
                )
            } else if w.ahead_same > 0 {
                format!(
                    "waits for a slot behind {} older queued job(s) of its priority",
                    w.ahead_same
                )
            } else {
                "next in line: waits for a free slot".to_string()
            };
            s.push_str(&format!(
                "; {} of its queue running, {} worker(s) alive",
                w.running, w.workers_alive
            ));
            if w.workers_alive == 0 {
                s.push_str(" — no worker is running: start `jobwarden run`");
            }
            s
        }
        "processing" => "running (see worker and last activity)".to_string(),
        "completed" | "cancelled" => format!("{}: waits for nothing", w.status),
        other => format!("status {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(status: &str) -> Waiting {
        Waiting {
            status: status.into(),
            attempts: 0,
            due_in: Duration::ZERO,
            ahead_higher: 0,
            ahead_same: 0,
            running: 2,
            workers_alive: 1,
            cap: None,
            rate: None,
            cap_held: 0,
            rate_used: 0,
            paused: None,
            key: None,
        }
    }

    #[test]
    fn each_wait_is_said_in_words() {
        let mut s = w("scheduled");
        s.due_in = Duration::from_secs(90);
        assert_eq!(explain(&s), "waits for its run_at: due in 1m 30s");
        s.attempts = 2;
        assert!(explain(&s).starts_with("waits out its retry backoff after attempt 2"));
        let mut q = w("queued");
        q.ahead_higher = 3;
        q.ahead_same = 4;
        assert!(explain(&q).contains("behind 3 queued job(s) of higher priority and 4 older"));
        q.workers_alive = 0;
        assert!(explain(&q).contains("no worker is running"));
        assert!(explain(&w("completed")).contains("waits for nothing"));
        let mut p = w("queued");
        p.paused = Some((125.0, "cli:alice@ops".into()));
        assert!(
            explain(&p).starts_with(
                "waits for its queue to be resumed: paused 2m 5s ago by cli:alice@ops"
            ),
            "{}",
            explain(&p)
        );
        let mut later = w("scheduled");
        later.paused = p.paused.clone();
        later.due_in = Duration::from_secs(90);
        assert_eq!(explain(&later), "waits for its run_at: due in 1m 30s");
        let mut capped = w("queued");
        capped.cap = Some(3);
        capped.cap_held = 3;
        assert!(explain(&capped).starts_with("waits for the queue's cluster-wide cap: 3 of 3"));
        let mut limited = w("queued");
        limited.rate = Some((20, Duration::from_secs(10)));
        limited.rate_used = 20;
        assert!(
            explain(&limited).starts_with("waits for a token of its queue's rate limit (20/10s"),
            "{}",
            explain(&limited)
        );
    }

    #[test]
    fn a_parked_jobs_wait_is_said_by_what_of_its_key_holds_it() {
        let mut q = w("queued");
        let k = KeyWait {
            key: "customer-42".into(),
            parked: true,
            cap: Some(2),
            running: 2,
            rate: Some((5, Duration::from_secs(1))),
            rate_used: 5,
            keys_ahead: 3,
            ..KeyWait::default()
        };
        q.key = Some(k.clone());
        assert!(
            explain(&q).starts_with(
                "waiting: key customer-42 has 2 running (limit 2); 2 of its queue running"
            ),
            "{}",
            explain(&q)
        );
        q.key = Some(KeyWait {
            running: 1,
            ..k.clone()
        });
        assert!(
            explain(&q)
                .starts_with("waiting: key customer-42 started 5 jobs in the last 1s (limit 5/1s)"),
            "{}",
            explain(&q)
        );
        q.key = Some(KeyWait {
            running: 1,
            rate_used: 4,
            key_before: 2,
            ..k.clone()
        });
        assert!(
            explain(&q).starts_with(
                "waiting: its turn (3 keys ahead, 2 jobs of key customer-42 before it)"
            ),
            "{}",
            explain(&q)
        );
        q.key = Some(KeyWait {
            ahead: Some(("j1".into(), "retrying".into())),
            ..k.clone()
        });
        assert!(explain(&q).starts_with(
            "waiting: key customer-42 is ordered and job j1 is ahead of it (retrying)"
        ));
        // Not parked (a keyed job queued the usual way): the queue's own reasons.
        q.key = Some(KeyWait {
            parked: false,
            ..k.clone()
        });
        assert!(explain(&q).starts_with("next in line"), "{}", explain(&q));
        let mut d = w("dead");
        d.key = Some(KeyWait {
            ordered: true,
            dead_blocks: true,
            ..k.clone()
        });
        assert!(explain(&d).contains("holds the later jobs of ordered key customer-42"));
        d.key = Some(KeyWait {
            ordered: true,
            later_started: 4,
            ..k.clone()
        });
        assert!(explain(&d).contains(
            "key customer-42 went on without it (ordered_on_dead = \"skip\"): 4 of its later jobs"
        ));
        d.key = Some(KeyWait {
            skipped: Some(("cli:alice@ops".into(), 0.0)),
            later_started: 1,
            ..k
        });
        assert!(
            explain(&d).contains(
                "skipped in the order of key customer-42 by cli:alice@ops at 1970-01-01 00:00:00Z"
            ),
            "{}",
            explain(&d)
        );
        assert_eq!(explain(&w("dead")), "dead: waits for nothing");
    }

    /// `job_row` reads the columns of three statements by position: they must list the same.
    #[test]
    fn the_statements_job_row_reads_list_the_same_columns() {
        let columns = |sql: &str| {
            let from = sql.find("SELECT ").expect("a SELECT");
            let to = sql.find("FROM jobs").expect("FROM jobs");
            sql[from..to]
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        };
        let get = columns(crate::store::sql::JOB_GET);
        assert!(
            get.ends_with("pipeline, to_char(expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'), key, to_char(await_until AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'), batch"),
            "{get}"
        );
        assert_eq!(columns(crate::store::sql::JOB_LIST), get);
        assert_eq!(columns(crate::store::sql::DEAD_LIST), get);
    }
}
