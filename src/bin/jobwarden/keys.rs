//! `jobwarden keys`: a keyed queue's per-key overrides (set, unset, list with the busiest
//! keys) and skipping an ordered key's dead head. The queue must be a keyed queue of the
//! configuration: what the workers run is read from it, as `config check` shows it.

use super::queues::who;
use super::BadArgs;
use anyhow::Result;
use clap::Subcommand;
use jobwarden::config::{Config, KeyRules, RateLimit};
use jobwarden::store::{BusyKey, KeyLimit, Store};

#[derive(Subcommand)]
pub enum KeysCommand {
    /// Set a key's own limits in a keyed queue (the values given; the others are kept):
    /// e.g. `keys set webhooks customer-42 --concurrency 1 --rate 5/1s`.
    Set {
        queue: String,
        /// The key (the rules of a job id). May begin with '-'.
        #[arg(allow_hyphen_values = true)]
        key: String,
        /// Jobs of this key running at once across every worker (instead of key_concurrency).
        #[arg(long)]
        concurrency: Option<i64>,
        /// Starts of this key's jobs per window across every worker, e.g. 5/1s (instead of
        /// key_rate_limit).
        #[arg(long)]
        rate: Option<String>,
        /// Its share of the fair turns (fair_by_key): 2 gets two turns for another key's one.
        #[arg(long)]
        weight: Option<f32>,
    },
    /// Drop a key's own limits: the queue's settings apply to it again.
    Unset {
        queue: String,
        #[arg(allow_hyphen_values = true)]
        key: String,
    },
    /// The overrides, and the busiest keys of each keyed queue (backlog and running).
    List {
        #[arg(long)]
        queue: Option<String>,
        /// How many of the busiest keys per queue.
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(i64).range(1..=1000))]
        top: i64,
        #[arg(long)]
        json: bool,
    },
    /// Let an ordered key's dead job go: the key's later jobs run on (the job stays dead,
    /// recorded as skipped with who and when; `dlq retry` still runs it, as the key's last).
    Skip {
        #[arg(allow_hyphen_values = true)]
        id: String,
    },
}

pub async fn run(config: &Config, command: KeysCommand) -> Result<()> {
    let store = Store::connect(&config.database).await?;
    match command {
        KeysCommand::Set {
            queue,
            key,
            concurrency,
            rate,
            weight,
        } => {
            let rules = keyed_queue(config, &queue)?;
            checked_key(&key)?;
            let values = checked_values(&queue, rules, concurrency, rate.as_deref(), weight)?;
            let set = store
                .key_limit_set(&queue, &key, values, &who())
                .await
                .map_err(refused)?;
            println!(
                "key {key} of queue {queue}: {} (set by {}); every worker applies it at its next take",
                limits_text(&set),
                set.set_by
            );
        }
        KeysCommand::Unset { queue, key } => {
            keyed_queue(config, &queue)?;
            checked_key(&key)?;
            if store.key_limit_unset(&queue, &key).await.map_err(refused)? {
                println!(
                    "key {key} of queue {queue}: overrides dropped, the queue's settings apply"
                );
            } else {
                return Err(BadArgs(format!(
                    "key {key:?} of queue {queue} has no overrides; nothing changed (`jobwarden keys list --queue {queue}` shows them)"
                ))
                .into());
            }
        }
        KeysCommand::List { queue, top, json } => {
            if let Some(q) = &queue {
                keyed_queue(config, q)?;
            }
            let limits = store.key_limits(queue.as_deref()).await?;
            let busiest = store.key_busiest(queue.as_deref(), top).await?;
            if json {
                let v = serde_json::json!({ "overrides": limits, "busiest": busiest });
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                print!("{}", format_overrides(&limits));
                print!("{}", format_busiest(&busiest));
            }
        }
        KeysCommand::Skip { id } => {
            let key = store.key_job_skip(&id, &who()).await.map_err(refused)?;
            println!(
                "job {id} skipped in the order of key {key}: the key's later jobs run on; it stays dead (`jobwarden dlq retry {id}` runs it as the key's last job)"
            );
        }
    }
    Ok(())
}

/// The key rules of `queue`, or why it takes no per-key overrides.
fn keyed_queue(config: &Config, queue: &str) -> Result<KeyRules> {
    jobwarden::job::validate_queue_name(queue).map_err(|e| BadArgs(format!("QUEUE: {e}")))?;
    let Some(q) = config.queues.get(queue) else {
        let names: Vec<&str> = config.queues.keys().map(String::as_str).collect();
        return Err(BadArgs(format!(
            "queue {queue:?} is not in the configuration (queues: {}); check the name, or pass the workers' configuration with --config",
            if names.is_empty() { "none".to_string() } else { names.join(", ") }
        ))
        .into());
    };
    q.key_rules().ok_or_else(|| {
        BadArgs(format!(
            "queue {queue} is not keyed, so per-key limits do not apply to it: set key_concurrency, key_rate_limit, fair_by_key or ordered_by_key in [queues.{queue}] first"
        ))
        .into()
    })
}

fn checked_key(key: &str) -> Result<()> {
    jobwarden::contract::check_job_key(key).map_err(|e| BadArgs(format!("KEY {key:?} {e}")).into())
}

/// The values of `keys set`, checked against the queue's rules.
fn checked_values<'a>(
    queue: &str,
    rules: KeyRules,
    concurrency: Option<i64>,
    rate: Option<&'a str>,
    weight: Option<f32>,
) -> Result<(Option<i32>, Option<&'a str>, Option<f32>)> {
    let bad = |m: String| -> anyhow::Error { BadArgs(m).into() };
    if concurrency.is_none() && rate.is_none() && weight.is_none() {
        return Err(bad(
            "give at least one of --concurrency, --rate or --weight, e.g. `jobwarden keys set webhooks customer-42 --concurrency 1`".into(),
        ));
    }
    if let Some(n) = concurrency {
        if !(1..=1_000_000).contains(&n) {
            return Err(bad(format!(
                "--concurrency {n}: a key runs 1 to 1000000 jobs at once; give at least 1 (to stop a key, pause its queue or cancel its jobs; `jobwarden keys unset` drops the override)"
            )));
        }
        if rules.ordered && n > 1 {
            return Err(bad(format!(
                "--concurrency {n}: queue {queue} is ordered_by_key, so a key runs one job at a time; drop --concurrency"
            )));
        }
    }
    if let Some(r) = rate {
        r.parse::<RateLimit>()
            .map_err(|e| bad(format!("--rate {e}")))?;
    }
    if let Some(w) = weight {
        if !(w > 0.0 && w <= 1000.0) {
            return Err(bad(format!(
                "--weight {w}: a key's share of the fair turns is above 0 and at most 1000 (1 is every key's default)"
            )));
        }
        if !rules.fair {
            return Err(bad(format!(
                "--weight {w}: queue {queue} has no fair turns, so weights do not apply; set fair_by_key = true in [queues.{queue}], or drop --weight"
            )));
        }
    }
    Ok((concurrency.map(|n| n as i32), rate, weight))
}

/// The database's refusal in its own words, as bad input; anything else as it is.
fn refused(e: jobwarden::store::StoreError) -> anyhow::Error {
    match e.rejected_data() {
        Some(reason) => BadArgs(reason.trim_start_matches("jobwarden: ").to_string()).into(),
        None => e.into(),
    }
}

fn limits_text(l: &KeyLimit) -> String {
    let mut parts = Vec::new();
    if let Some(c) = l.concurrency {
        parts.push(format!("concurrency {c}"));
    }
    if let Some(r) = &l.rate {
        parts.push(format!("rate {r}"));
    }
    if let Some(w) = l.weight {
        parts.push(format!("weight {w}"));
    }
    parts.join(", ")
}

fn format_overrides(limits: &[KeyLimit]) -> String {
    if limits.is_empty() {
        return "no per-key overrides (`jobwarden keys set <queue> <key> --concurrency N`)\n"
            .into();
    }
    let mut out = format!(
        "{:<12} {:<24} {:>11} {:<10} {:>6} set by\n",
        "queue", "key", "concurrency", "rate", "weight"
    );
    for l in limits {
        out.push_str(&format!(
            "{:<12} {:<24} {:>11} {:<10} {:>6} {}\n",
            l.queue,
            l.key,
            l.concurrency.map_or("-".into(), |c| c.to_string()),
            l.rate.as_deref().unwrap_or("-"),
            l.weight.map_or("-".into(), |w| w.to_string()),
            l.set_by
        ));
    }
    out
}

/// The busiest keys table (also printed by `stats`).
pub fn format_busiest(rows: &[BusyKey]) -> String {
    if rows.is_empty() {
        return "\nno keyed queue has parked or running keyed jobs\n".into();
    }
    let mut out = format!(
        "\nbusiest keys\n{:<12} {:<24} {:>8} {:>8}\n",
        "queue", "key", "parked", "running"
    );
    for b in rows {
        out.push_str(&format!(
            "{:<12} {:<24} {:>8} {:>8}\n",
            b.queue,
            if b.key.is_empty() { "(no key)" } else { &b.key },
            b.parked,
            b.running
        ));
    }
    out
}
