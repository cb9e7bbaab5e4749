//! `jobwarden queues`: pause and resume a queue on every worker, list the paused ones.

use super::BadArgs;
use anyhow::Result;
use clap::Subcommand;
use jobwarden::store::Store;

#[derive(Subcommand)]
pub enum QueuesCommand {
    /// Pause a queue on every worker: nothing new starts (running jobs finish), its messages
    /// wait in the stream, no attempt is spent. Also `SELECT pause_queue('email', 'me')`.
    Pause {
        queue: String,
        /// Why, shown by `queues list`, `stats` and the dashboard.
        #[arg(long)]
        reason: Option<String>,
        /// Pause even when no running worker serves the queue (before its workers start).
        #[arg(long)]
        force: bool,
    },
    /// Resume a paused queue: its jobs start again on every worker within a second.
    Resume { queue: String },
    /// The paused queues: since when, by whom and why.
    List {
        #[arg(long)]
        json: bool,
    },
}

pub async fn run(store: &Store, command: QueuesCommand) -> Result<()> {
    match command {
        QueuesCommand::Pause {
            queue,
            reason,
            force,
        } => {
            checked_name(&queue)?;
            let by = who();
            store
                .pause_queue(&queue, &by, reason.as_deref(), force)
                .await
                .map_err(refused)?;
            println!("queue {queue} paused by {by}: nothing new starts on any worker until `jobwarden queues resume {queue}`");
        }
        QueuesCommand::Resume { queue } => {
            checked_name(&queue)?;
            match store.resume_queue(&queue).await? {
                Some(since) => println!(
                    "queue {queue} resumed (paused for {})",
                    jobwarden::view::ago(epoch_now() - since)
                ),
                None => {
                    let paused = store.paused_queues().await?;
                    let names: Vec<&str> = paused.iter().map(|p| p.queue.as_str()).collect();
                    return Err(BadArgs(format!(
                        "queue {queue:?} is not paused (paused: {}); nothing changed",
                        if names.is_empty() {
                            "none".to_string()
                        } else {
                            names.join(", ")
                        }
                    ))
                    .into());
                }
            }
        }
        QueuesCommand::List { json } => {
            let paused = store.paused_queues().await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&paused)?);
            } else {
                print!("{}", jobwarden::view::format_paused(&paused));
            }
        }
    }
    Ok(())
}

/// A queue name the contract accepts, or the contract's words.
fn checked_name(queue: &str) -> Result<()> {
    jobwarden::job::validate_queue_name(queue).map_err(|e| BadArgs(e.to_string()).into())
}

/// The pause's refusal in the database's own words (no running worker serves the queue),
/// as bad input; anything else as it is.
fn refused(e: jobwarden::store::StoreError) -> anyhow::Error {
    match e.rejected_data() {
        Some(reason) => BadArgs(reason.trim_start_matches("jobwarden: ").to_string()).into(),
        None => e.into(),
    }
}

/// Who acts from this command line (a pause, a bulk action): `cli:<user>@<host>`.
pub fn who() -> String {
    let user = std::env::var("USER")
        .ok()
        .filter(|u| !u.is_empty())
        .or_else(|| {
            nix::unistd::User::from_uid(nix::unistd::getuid())
                .ok()
                .flatten()
                .map(|u| u.name)
        })
        .unwrap_or_else(|| "unknown".into());
    let host = hostname::get()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default();
    format!("cli:{user}@{host}")
}

fn epoch_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default()
}
