//! One job as an operator reads it: `jobwarden jobs show` prints a [`JobView`], the
//! dashboard's job page renders the same one. Built from the store's rows by a pure function,
//! so both say the same thing in the same words (status, progress, owner, durations).

use super::secs;
use crate::job::JobStatus;
use crate::store::{AttemptRow, JobRow, WorkerRow};
use serde_json::Value;

/// A job, its attempts, what it waits for and who holds it, ready to be shown.
#[derive(Debug, Clone, PartialEq)]
pub struct JobView {
    pub id: String,
    pub queue: String,
    /// The status as stored (what is shown).
    pub status: String,
    /// The status parsed; `None` only for one this build does not know (a newer schema).
    pub state: Option<JobStatus>,
    pub priority: i16,
    /// `2 of 5`.
    pub attempts: String,
    /// What it waits for, in words (`None`: not known).
    pub waiting: Option<String>,
    /// `40% rendering — page 3 of 8`: what the application last reported.
    pub progress: Option<String>,
    /// The worker that holds it, or last held it.
    pub worker: Option<WorkerLine>,
    pub last_error: Option<String>,
    /// UTC, ISO 8601, as PostgreSQL wrote them.
    pub created_at: String,
    pub scheduled_at: String,
    pub started_at: Option<String>,
    pub last_activity_at: Option<String>,
    pub finished_at: Option<String>,
    /// Not started by then, it never runs; `expired` says it ended so.
    pub expires_at: Option<String>,
    /// An awaiting job's deadline: completed or failed from outside by then, or retried.
    pub awaiting_until: Option<String>,
    /// The batch it is a member of, and that batch's progress (`9,900 of 10,000 ended …`)
    /// when it was read.
    pub batch: Option<(String, Option<String>)>,
    pub idempotency_key: Option<String>,
    /// What groups it with other jobs (a customer, a tenant), if it has a key.
    pub key: Option<String>,
    /// The id of the pipeline's first job.
    pub pipeline: Option<String>,
    pub payload: Value,
    pub result: Option<Value>,
    /// Attempts that ended, oldest first.
    pub history: Vec<AttemptView>,
}

/// The worker that holds a job (`owner`) or last held it (`last worker`).
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerLine {
    /// `owner` while the job is processing, `last worker` after.
    pub label: &'static str,
    pub id: String,
    pub lease: i64,
    /// `heartbeat 2.0 s ago · alive`, when the worker's row was read.
    pub heartbeat: Option<String>,
}

impl WorkerLine {
    /// `pod-a-7521-2968c8ff · heartbeat 2.0 s ago · alive (lease 3)`.
    pub fn text(&self) -> String {
        match &self.heartbeat {
            Some(h) => format!("{} · {h} (lease {})", self.id, self.lease),
            None => format!("{} (lease {})", self.id, self.lease),
        }
    }
}

/// One ended attempt of a job.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptView {
    pub attempt: i32,
    pub lease: i64,
    /// `None` for events that were not attempts (`broker_lost`).
    pub worker: Option<String>,
    pub started_at: Option<String>,
    /// How long it ran (`1.2 s`; `–` when not known).
    pub took: String,
    pub outcome: String,
    pub error: Option<String>,
}

impl From<AttemptRow> for AttemptView {
    fn from(a: AttemptRow) -> AttemptView {
        AttemptView {
            attempt: a.attempt,
            lease: a.lease,
            worker: a.worker_id,
            started_at: a.started_at,
            took: secs(a.duration_ms.map(|ms| ms as f64 / 1000.0)),
            outcome: a.outcome,
            error: a.error,
        }
    }
}

impl JobView {
    /// The view of `job`: `attempts` (ended ones, oldest first), what it waits for, and the
    /// row of its worker (`owner`) when that was read.
    pub fn new(
        job: JobRow,
        attempts: Vec<AttemptRow>,
        waiting: Option<String>,
        owner: Option<&WorkerRow>,
    ) -> JobView {
        let state = JobStatus::parse(&job.status);
        let progress = progress_text(&job);
        let worker = job.worker_id.map(|id| WorkerLine {
            label: if matches!(state, Some(JobStatus::Processing | JobStatus::Awaiting)) {
                "owner"
            } else {
                "last worker"
            },
            id,
            lease: job.lease,
            heartbeat: owner.map(|o| {
                format!(
                    "heartbeat {} ago · {}",
                    secs(Some(o.heartbeat_age_seconds)),
                    o.state()
                )
            }),
        });
        JobView {
            id: job.id,
            queue: job.queue,
            status: job.status,
            state,
            priority: job.priority,
            attempts: format!("{} of {}", job.attempts, job.max_attempts),
            waiting,
            progress,
            worker,
            last_error: job.last_error,
            created_at: job.created_at,
            scheduled_at: job.scheduled_at,
            started_at: job.started_at,
            last_activity_at: job.last_activity_at,
            finished_at: job.completed_at,
            expires_at: job.expires_at,
            awaiting_until: job
                .await_until
                .filter(|_| state == Some(JobStatus::Awaiting)),
            batch: job.batch.map(|b| (b, None)),
            idempotency_key: job.idempotency_key,
            key: job.key,
            pipeline: job.pipeline,
            payload: job.payload,
            result: job.result,
            history: attempts.into_iter().map(AttemptView::from).collect(),
        }
    }

    /// A dead job can be retried.
    pub fn can_retry(&self) -> bool {
        self.state == Some(JobStatus::Dead)
    }

    /// A job that has not ended can be cancelled.
    pub fn can_cancel(&self) -> bool {
        self.state.is_some_and(|s| !s.is_terminal())
    }

    /// How its expiry is named: `expired at` when the job ended so (never started), else
    /// `expires at` (a job that started before it keeps it, unused).
    pub fn expiry_label(&self) -> &'static str {
        let expired = self.state == Some(JobStatus::Cancelled)
            && self
                .last_error
                .as_deref()
                .is_some_and(|e| e.starts_with("expired:"));
        if expired {
            "expired at"
        } else {
            "expires at"
        }
    }

    /// The times known, in the order they happen, with their labels.
    pub fn times(&self) -> Vec<(&'static str, &str)> {
        [
            ("created", Some(self.created_at.as_str())),
            ("scheduled for", Some(self.scheduled_at.as_str())),
            ("started", self.started_at.as_deref()),
            ("last activity", self.last_activity_at.as_deref()),
            ("finished", self.finished_at.as_deref()),
            (self.expiry_label(), self.expires_at.as_deref()),
            ("awaiting until", self.awaiting_until.as_deref()),
        ]
        .into_iter()
        .filter_map(|(k, v)| Some((k, v?)))
        .collect()
    }
}

/// `40% rendering — page 3 of 8`, from whichever of the three the application reported.
fn progress_text(job: &JobRow) -> Option<String> {
    if job.stage.is_none() && job.progress.is_none() && job.message.is_none() {
        return None;
    }
    let mut out = job
        .progress
        .map(|p| format!("{:.0}% ", p * 100.0))
        .unwrap_or_default();
    out.push_str(job.stage.as_deref().unwrap_or(""));
    if let Some(m) = &job.message {
        out.push_str(" — ");
        out.push_str(m);
    }
    Some(out)
}

/// JSON indented for reading (a payload, a result).
pub fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_default()
}

/// The `jobwarden jobs show` text: one job, its progress, owner, times and attempts (the
/// dashboard's job page shows the same [`JobView`]).
pub fn format_job(v: &JobView) -> String {
    let dash = |s: Option<&str>| s.unwrap_or("-").to_string();
    let mut lines = vec![("id", v.id.clone()), ("queue", v.queue.clone())];
    if let Some(k) = &v.key {
        lines.push(("key", k.clone()));
    }
    lines.extend([
        ("status", v.status.clone()),
        ("waiting for", v.waiting.clone().unwrap_or_default()),
        ("priority", v.priority.to_string()),
        ("attempts", v.attempts.clone()),
        (
            "worker",
            dash(v.worker.as_ref().map(|w| w.text()).as_deref()),
        ),
    ]);
    if let Some(p) = &v.progress {
        lines.push(("progress", p.clone()));
    }
    if let Some(e) = &v.last_error {
        lines.push(("last error", e.clone()));
    }
    lines.extend([
        ("created", v.created_at.clone()),
        ("scheduled", v.scheduled_at.clone()),
        ("started", dash(v.started_at.as_deref())),
        ("last activity", dash(v.last_activity_at.as_deref())),
        ("completed", dash(v.finished_at.as_deref())),
    ]);
    if let Some(e) = &v.expires_at {
        lines.push((v.expiry_label(), e.clone()));
    }
    if let Some(d) = &v.awaiting_until {
        lines.push(("awaiting until", d.clone()));
    }
    if let Some((b, progress)) = &v.batch {
        let text = match progress {
            Some(p) => format!("{b}: {p}"),
            None => b.clone(),
        };
        lines.push(("batch", text));
    }
    lines.push(("payload", v.payload.to_string()));
    if let Some(r) = &v.result {
        lines.push(("result", r.to_string()));
    }
    let mut out: String = lines
        .iter()
        .map(|(k, val)| format!("{:<15}{val}\n", format!("{k}:")))
        .collect();
    out.push_str("attempts:\n");
    if v.history.is_empty() {
        out.push_str("  (none finished yet)\n");
    }
    for a in &v.history {
        out.push_str(&format!(
            "  #{} {} {} {} {} {}\n",
            a.attempt,
            dash(a.started_at.as_deref()),
            dash(a.worker.as_deref()),
            a.took,
            a.outcome,
            a.error.as_deref().unwrap_or("")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(status: &str) -> JobRow {
        JobRow {
            id: "report-7".into(),
            queue: "work".into(),
            status: status.into(),
            priority: 5,
            attempts: 2,
            max_attempts: 5,
            worker_id: Some("pod-a-1-0000".into()),
            lease: 3,
            stage: Some("rendering".into()),
            progress: Some(0.4),
            message: Some("page 3 of 8".into()),
            last_error: None,
            payload: serde_json::json!({"report": 7}),
            result: None,
            idempotency_key: None,
            created_at: "2026-11-26T10:00:00.000Z".into(),
            scheduled_at: "2026-11-26T10:00:00.000Z".into(),
            started_at: Some("2026-11-26T10:00:01.000Z".into()),
            last_activity_at: None,
            completed_at: None,
            pipeline: None,
            expires_at: None,
            key: None,
            await_until: None,
            batch: None,
        }
    }

    #[test]
    fn a_running_job_names_its_owner_and_progress() {
        let v = JobView::new(job("processing"), Vec::new(), None, None);
        assert_eq!(v.state, Some(JobStatus::Processing));
        assert_eq!(v.attempts, "2 of 5");
        assert_eq!(v.progress.as_deref(), Some("40% rendering — page 3 of 8"));
        let w = v.worker.as_ref().unwrap();
        assert_eq!(w.label, "owner");
        assert_eq!(w.text(), "pod-a-1-0000 (lease 3)");
        assert!(v.can_cancel() && !v.can_retry());
        let times: Vec<&str> = v.times().iter().map(|(k, _)| *k).collect();
        assert_eq!(times, ["created", "scheduled for", "started"]);
    }

    #[test]
    fn only_a_dead_job_is_retried_and_an_ended_one_is_not_cancelled() {
        let dead = JobView::new(job("dead"), Vec::new(), None, None);
        assert!(dead.can_retry() && !dead.can_cancel());
        assert_eq!(dead.worker.unwrap().label, "last worker");
        for s in ["waiting", "queued", "scheduled"] {
            assert!(
                JobView::new(job(s), Vec::new(), None, None).can_cancel(),
                "{s}"
            );
        }
        for s in ["completed", "cancelled", "no-such-status"] {
            assert!(
                !JobView::new(job(s), Vec::new(), None, None).can_cancel(),
                "{s}"
            );
        }
    }

    #[test]
    fn an_attempt_says_how_long_it_ran() {
        let a = AttemptRow {
            attempt: 1,
            lease: 1,
            worker_id: None,
            started_at: None,
            duration_ms: Some(1234),
            outcome: "retry".into(),
            error: Some("550".into()),
        };
        assert_eq!(AttemptView::from(a.clone()).took, "1.2 s");
        let unknown = AttemptRow {
            duration_ms: None,
            ..a
        };
        assert_eq!(AttemptView::from(unknown).took, "–");
    }

    #[test]
    fn jobs_show_prints_the_view_in_aligned_lines() {
        let mut row = job("dead");
        row.last_error = Some("550 mailbox unavailable".into());
        row.key = Some("customer-42".into());
        let attempt = AttemptRow {
            attempt: 1,
            lease: 3,
            worker_id: Some("pod-a-1-0000".into()),
            started_at: Some("2026-11-26T10:00:01.000Z".into()),
            duration_ms: Some(35),
            outcome: "dead".into(),
            error: Some("550 mailbox unavailable".into()),
        };
        let v = JobView::new(
            row,
            vec![attempt],
            Some("dead: waits for nothing".into()),
            None,
        );
        let out = format_job(&v);
        for line in [
            "key:           customer-42",
            "status:        dead",
            "waiting for:   dead: waits for nothing",
            "attempts:      2 of 5",
            "worker:        pod-a-1-0000 (lease 3)",
            "progress:      40% rendering — page 3 of 8",
            "last error:    550 mailbox unavailable",
            "last activity: -",
            "payload:       {\"report\":7}",
            "  #1 2026-11-26T10:00:01.000Z pod-a-1-0000 35 ms dead 550 mailbox unavailable",
        ] {
            assert!(
                out.lines().any(|l| l == line),
                "no line {line:?} in:\n{out}"
            );
        }
    }
}
