//! The text tables the CLI prints (`jobwarden workers`, `stats`, `jobs pipeline`): aligned
//! columns for a terminal, one line per row.

use super::ago;
use super::{cut, RESULT_SHOWN};
use crate::store::{Pause, PipelineJob, QueueStats, UnservedRow, WorkerRow};

/// The `jobwarden workers` table.
pub fn format_workers(rows: &[WorkerRow]) -> String {
    if rows.is_empty() {
        return "no worker is running (jobwarden workers --all lists stopped ones)\n".into();
    }
    let mut out = format!(
        "{:<36} {:<20} {:>7} {:<9} {:>6} {:>10} {:>9}  {}\n",
        "worker", "host", "pid", "version", "up", "heartbeat", "in flight", "state"
    );
    for r in rows {
        out.push_str(&format!(
            "{:<36} {:<20} {:>7} {:<9} {:>6} {:>10} {:>9}  {}\n",
            r.id,
            r.hostname,
            r.pid,
            r.version,
            ago(r.up_seconds),
            format!("{} ago", ago(r.heartbeat_age_seconds)),
            r.in_flight,
            r.state()
        ));
    }
    out
}

/// The `jobwarden stats` table.
pub fn format_stats(rows: &[QueueStats]) -> String {
    let mut out = format!(
        "{:<12} {:>7} {:>9} {:>10} {:>8} {:>13} {:>8} {:>13} {:>8} {:>8} {:>7}\n",
        "queue",
        "queued",
        "scheduled",
        "processing",
        "awaiting",
        "completed 24h",
        "dead 24h",
        "oldest queued",
        "p50 run",
        "p95 run",
        "retries"
    );
    let secs = |s: Option<f64>| s.map(|v| format!("{v:.3}s")).unwrap_or_else(|| "-".into());
    for r in rows {
        out.push_str(&format!(
            "{:<12} {:>7} {:>9} {:>10} {:>8} {:>13} {:>8} {:>13} {:>8} {:>8} {:>6.1}%\n",
            r.queue,
            r.queued,
            r.scheduled,
            r.processing,
            r.awaiting,
            r.completed_24h,
            r.dead_24h,
            r.oldest_queued_seconds
                .map(|v| format!("{v:.0}s"))
                .unwrap_or_else(|| "-".into()),
            secs(r.p50_run_seconds),
            secs(r.p95_run_seconds),
            r.retry_rate * 100.0
        ));
    }
    out
}

/// The paused queues (`jobwarden queues list`, and `stats` when any is paused): one line
/// each, since when, by whom and why.
pub fn format_paused(rows: &[Pause]) -> String {
    if rows.is_empty() {
        return "no queue is paused\n".into();
    }
    let mut out = String::from("paused queues (nothing new starts until resumed):\n");
    for p in rows {
        out.push_str(&format!(
            "  {:<12} paused {} ago by {}{}\n",
            p.queue,
            ago(p.for_seconds),
            p.by,
            p.reason
                .as_deref()
                .map(|r| format!(": {r}"))
                .unwrap_or_default()
        ));
    }
    out
}

/// The "waiting for a worker" part of `jobwarden stats`: subjects no pod serves yet.
pub fn format_unserved(rows: &[UnservedRow]) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let mut out = String::from("\nwaiting for a worker (no consumer serves these subjects):\n");
    out.push_str(&format!(
        "{:<24} {:<12} {:>8} {:>10} {:>18}\n",
        "subject", "queue", "messages", "oldest", "dead-lettered in"
    ));
    for r in rows {
        let due = if r.dead_letter_in_seconds <= 0.0 {
            "now".to_string()
        } else {
            format!("{:.0}s", r.dead_letter_in_seconds)
        };
        out.push_str(&format!(
            "{:<24} {:<12} {:>8} {:>9.0}s {:>18}\n",
            r.subject, r.queue, r.messages, r.oldest_seconds, due
        ));
    }
    if let Some(r) = rows.first() {
        out.push_str(&format!(
            "(as a janitor saw them {:.0}s ago)\n",
            r.seen_seconds_ago
        ));
    }
    out
}

/// A pipeline as a table: one line per job, with its parents and its result (what the jobs
/// after it receive; cut at [`RESULT_SHOWN`] characters, `jobs show` has all of it).
pub fn format_pipeline(jobs: &[PipelineJob]) -> String {
    let mut out = format!(
        "{:<40} {:<12} {:<11} {:>8}  {}\n",
        "JOB", "QUEUE", "STATUS", "ATTEMPTS", "AFTER / RESULT / LAST ERROR"
    );
    for j in jobs {
        let mut notes = Vec::new();
        if !j.parents.is_empty() {
            notes.push(format!("after {}", j.parents.join(", ")));
        }
        if j.pending_then > 0 {
            notes.push(format!("then {} more when it completes", j.pending_then));
        }
        if let Some(r) = &j.result {
            notes.push(format!("result {}", cut(&r.to_string(), RESULT_SHOWN)));
        }
        if let Some(e) = &j.last_error {
            notes.push(e.clone());
        }
        out.push_str(&format!(
            "{:<40} {:<12} {:<11} {:>8}  {}\n",
            j.id,
            j.queue,
            j.status,
            format!("{}/{}", j.attempts, j.max_attempts),
            notes.join("; ")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(beat: f64) -> WorkerRow {
        WorkerRow {
            id: "pod-a-7521-2968c8ff".into(),
            hostname: "pod-a".into(),
            pid: 7521,
            version: "0.1.0".into(),
            up_seconds: 1020.0,
            heartbeat_age_seconds: beat,
            dead_after_ms: 15_000,
            stopped_seconds_ago: None,
            stop_reason: None,
            in_flight: 3,
        }
    }

    #[test]
    fn the_workers_table_has_one_aligned_line_per_worker() {
        let out = format_workers(&[row(1.0)]);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 2, "{out}");
        assert!(lines[0].starts_with("worker "), "{out}");
        assert!(lines[1].starts_with("pod-a-7521-2968c8ff "), "{out}");
        assert!(lines[1].contains(" 17m "), "{out}");
        assert!(lines[1].contains("1s ago"), "{out}");
        assert!(lines[1].ends_with("3  alive"), "{out}");
        assert_eq!(lines[0].find("state"), lines[1].find("alive"), "{out}");
        assert!(format_workers(&[]).starts_with("no worker is running"));
        println!("{out}");
    }
}
