//! `jobwarden jobs bulk cancel|retry|discard`: every job matching a filter, in batches, after
//! the count is shown. Without `--yes` it only counts (nothing changes); with it, it takes at
//! most the jobs counted, and the action is recorded in `bulk_actions` with who ran it.

use super::BadArgs;
use anyhow::Result;
use clap::{Args, ValueEnum};
use jobwarden::job::JobStatus;
use jobwarden::store::{parse_when, BulkAction, BulkFilter, Store};
use std::time::SystemTime;

#[derive(Clone, Copy, ValueEnum)]
pub enum Action {
    /// Unfinished jobs never run (running ones are stopped); their dependents are cancelled.
    Cancel,
    /// Dead jobs get fresh attempts (same id, history kept).
    Retry,
    /// Dead or cancelled jobs are deleted.
    Discard,
}

#[derive(Args)]
pub struct BulkArgs {
    #[arg(value_enum)]
    action: Action,
    /// The jobs' status (cancel: waiting, queued, scheduled or processing; retry: dead;
    /// discard: dead or cancelled).
    #[arg(long)]
    status: String,
    #[arg(long)]
    queue: Option<String>,
    /// Enqueued at or after: an instant (2026-11-27T14:00:00Z) or a duration before now
    /// (90m, 2h, 1d).
    #[arg(long)]
    since: Option<String>,
    /// Enqueued before: an instant or a duration before now.
    #[arg(long)]
    until: Option<String>,
    /// Text in the job's id or last error.
    #[arg(long)]
    text: Option<String>,
    /// Act (without it, only count what would change).
    #[arg(long)]
    yes: bool,
    #[arg(long)]
    json: bool,
}

pub async fn run(store: &Store, args: BulkArgs) -> Result<()> {
    let action = match args.action {
        Action::Cancel => BulkAction::Cancel,
        Action::Retry => BulkAction::Retry,
        Action::Discard => BulkAction::Discard,
    };
    let filter = filter(&args, action)?;
    let matched = store.bulk_count(&filter).await?;
    if matched == 0 {
        return Err(BadArgs(format!(
            "no job matches {}: nothing to {}; nothing changed",
            filter.describe(),
            action.as_str()
        ))
        .into());
    }
    if !args.yes {
        if args.json {
            println!(
                "{}",
                serde_json::json!({"action": action, "filter": filter, "matched": matched, "done": false})
            );
        } else {
            println!(
                "{matched} jobs match {}; run again with --yes to {} them (nothing changed)",
                filter.describe(),
                action.as_str()
            );
        }
        return Ok(());
    }
    let report = store
        .bulk_run(action, &filter, &super::queues::who(), matched)
        .await?;
    if args.json {
        println!(
            "{}",
            serde_json::json!({"action": action, "filter": filter, "matched": report.matched,
                               "changed": report.changed, "bulk_action": report.id, "done": true})
        );
    } else {
        println!(
            "bulk action {}: {} of {} jobs matching {} ({}: see bulk_actions)",
            report.id,
            report.changed,
            report.matched,
            filter.describe(),
            match action {
                BulkAction::Cancel => "cancelled",
                BulkAction::Retry => "retried",
                BulkAction::Discard => "discarded",
            }
        );
    }
    Ok(())
}

/// The filter the arguments name, or what is wrong with them.
fn filter(args: &BulkArgs, action: BulkAction) -> Result<BulkFilter> {
    let status = JobStatus::parse(&args.status).ok_or_else(|| {
        let all: Vec<&str> = JobStatus::ALL.iter().map(|s| s.as_str()).collect();
        BadArgs(format!(
            "--status {:?} is not a job status (one of {}); nothing changed",
            args.status,
            all.join(", ")
        ))
    })?;
    action
        .check(status)
        .map_err(|e| BadArgs(format!("{e}; nothing changed")))?;
    let now = SystemTime::now();
    let when = |flag: &str, v: &Option<String>| -> Result<Option<f64>> {
        v.as_deref()
            .map(|t| {
                parse_when(t, now)
                    .map_err(|e| BadArgs(format!("--{flag} {e}; nothing changed")).into())
            })
            .transpose()
    };
    let since = when("since", &args.since)?;
    let until = when("until", &args.until)?;
    if let (Some(s), Some(u)) = (since, until) {
        if s >= u {
            return Err(BadArgs(
                "--since is not before --until: no job can match; nothing changed".into(),
            )
            .into());
        }
    }
    Ok(BulkFilter {
        status,
        queue: args.queue.clone(),
        since,
        until,
        text: args.text.clone().filter(|t| !t.is_empty()),
    })
}
