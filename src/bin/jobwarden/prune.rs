//! `jobwarden prune`: one retention round now (the same code as the workers' pruner), or
//! with `--dry-run` what it would delete, per queue and status, and nothing deleted.

use super::BadArgs;
use anyhow::Result;
use clap::Args;
use jobwarden::config::Config;
use jobwarden::store::Store;
use jobwarden::worker::pruner::Pruner;
use tokio_util::sync::CancellationToken;

#[derive(Args)]
pub struct PruneArgs {
    /// Print what would be deleted now, per queue and status, and the age of the oldest
    /// finished job kept; delete nothing.
    #[arg(long)]
    dry_run: bool,
    /// Prune even though retention.enabled = false, by the other [retention] settings.
    #[arg(long)]
    even_if_disabled: bool,
    /// Print as JSON.
    #[arg(long)]
    json: bool,
}

pub async fn run(args: PruneArgs, config: Config) -> Result<()> {
    let policy = match config.retention_policy() {
        Some(p) => p,
        None if args.even_if_disabled => {
            let mut on = config.clone();
            on.retention.enabled = true;
            on.retention_policy().expect("retention is on")
        }
        None => {
            println!(
                "retention is off (retention.enabled = false): nothing pruned; \
                 pass --even-if-disabled to prune by the other [retention] settings once"
            );
            return Ok(());
        }
    };
    let store = Store::connect(&config.database).await?;
    let pruner = Pruner::new(store, policy);
    let busy = || {
        BadArgs(
            "another worker's retention round holds the lock right now; nothing done, try again \
             in a moment"
                .into(),
        )
    };
    if args.dry_run {
        let rows = pruner.preview().await?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&rows)?);
            return Ok(());
        }
        println!(
            "{:<24} {:<10} {:>12} {:>12}  OLDEST KEPT",
            "QUEUE", "STATUS", "WOULD GO", "KEPT"
        );
        for r in &rows {
            println!(
                "{:<24} {:<10} {:>12} {:>12}  {}",
                r.queue,
                r.status,
                r.going,
                r.kept,
                r.oldest_kept_secs.map_or("-".to_string(), |s| format!(
                    "{} old",
                    jobwarden::view::ago(s)
                ))
            );
        }
        let going: i64 = rows.iter().map(|r| r.going).sum();
        println!("dry run: {going} jobs would be deleted now; nothing was deleted");
        return Ok(());
    }
    let cancel = CancellationToken::new();
    let stop = cancel.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        stop.cancel();
    });
    let r = pruner.run_once(&cancel, &mut |_, _, _| {}).await?;
    if r.skipped {
        return Err(busy().into());
    }
    if args.json {
        let jobs: Vec<_> = r
            .jobs
            .iter()
            .map(|((q, s), n)| serde_json::json!({"queue": q, "status": s, "deleted": n}))
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "jobs": jobs, "poison_messages": r.poison, "workers": r.workers,
                "flow_grants": r.flow_grants, "orphan_attempts": r.orphan_attempts,
                "seconds": r.took.as_secs_f64(), "stopped_early": r.cancelled,
            }))?
        );
        return Ok(());
    }
    for ((q, s), n) in &r.jobs {
        println!("{q:<24} {s:<10} {n:>12} deleted");
    }
    println!(
        "pruned {} jobs, {} poison messages, {} stopped workers, {} flow grants, {} orphan \
         attempt rows in {:.1}s{}",
        r.jobs_total(),
        r.poison,
        r.workers,
        r.flow_grants,
        r.orphan_attempts,
        r.took.as_secs_f64(),
        if r.cancelled { " (interrupted)" } else { "" }
    );
    Ok(())
}
