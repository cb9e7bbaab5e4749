//! The `jobwarden` command: a thin layer that parses arguments, loads the configuration and
//! calls the library. Exit codes (`docs/operations.md` §9): 0 ok, 1 runtime failure, 2 bad
//! configuration or arguments, 70 (`EX_SOFTWARE`) `run` stopped because one of the worker's
//! services failed (a panic or an unexpected end, logged once with its name and cause).

// No function over 100 lines (clippy.toml) unless it says why.
#![warn(clippy::too_many_lines)]

mod bench;
mod bench_history;
mod bench_prune;
mod bench_recovery;
mod bulk;
mod demo;
mod enqueue_many;
mod keys;
mod otlp_sink;
mod prune;
mod queues;
mod testkit;

use anyhow::{anyhow, Context, Result};
use clap::{Parser, Subcommand};
use jobwarden::client::{Client, EnqueueOptions};
use jobwarden::config::Config;
use jobwarden::job::JobStatus;
use jobwarden::store::Store;
use jobwarden::view::JobView;
use jobwarden::worker::{FailPoints, ServiceFailure, EXIT_SERVICE_FAILED, FAILPOINTS_ENV};
use std::path::PathBuf;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(
    name = "jobwarden",
    version,
    about = "A worker sidecar that makes background jobs impossible to lose"
)]
struct Cli {
    /// Configuration file (TOML). Default: ./jobwarden.toml when it exists.
    #[arg(long, short, global = true, env = "JOBWARDEN_CONFIG")]
    config: Option<PathBuf>,
    /// Log as JSON lines (for log collectors).
    #[arg(long, global = true, env = "JOBWARDEN_LOG_JSON")]
    log_json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the worker until SIGTERM/SIGINT.
    Run,
    /// Apply database migrations and exit.
    Migrate,
    /// Configuration commands.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Enqueue a job: write it to PostgreSQL, then publish it.
    Enqueue {
        /// Queue name, e.g. email.
        queue: String,
        /// Payload: a JSON object, e.g. '{"to":"a@example.com"}'.
        payload: String,
        /// 0 runs first, 9 last.
        #[arg(long)]
        priority: Option<i16>,
        /// Run after this delay, e.g. 30s, 5m.
        #[arg(long, value_parser = humantime::parse_duration)]
        delay: Option<Duration>,
        #[arg(long)]
        max_attempts: Option<i32>,
        /// Per-job timeout, e.g. 2m.
        #[arg(long, value_parser = humantime::parse_duration)]
        timeout: Option<Duration>,
        /// Enqueueing twice with the same key returns the first job (the same key with
        /// another payload is an error).
        #[arg(long, allow_hyphen_values = true)]
        idempotency_key: Option<String>,
        /// Job id (default: a new UUIDv7). May begin with '-'.
        #[arg(long, allow_hyphen_values = true)]
        id: Option<String>,
        /// This job's backoff instead of the queue's: KIND:BASE[:MAX], e.g. exponential:1s:10m
        /// (kinds: fixed, linear, exponential).
        #[arg(long, value_parser = parse_backoff)]
        backoff: Option<jobwarden::backoff::Backoff>,
        /// Run only after this job completed (repeat for several: it waits until all did).
        /// A dead parent makes it dead, a cancelled one cancels it.
        #[arg(long = "depends-on", value_name = "JOB_ID", allow_hyphen_values = true)]
        depends_on: Vec<String>,
        /// Jobs to create when this one completes, as JSON: '[{"queue":"pdf","payload":{…},
        /// "then":[…]}]' (fields: queue, payload, id, priority, max_attempts, timeout_ms,
        /// delay_ms, idempotency_key, backoff, then, expires_in, key).
        #[arg(long, value_name = "JSON")]
        then: Option<String>,
        /// Not started by this instant (RFC 3339, e.g. 2026-11-27T03:00:00Z), the job never
        /// runs: it ends cancelled as expired.
        #[arg(long, value_parser = parse_instant, conflicts_with = "expires_in")]
        expires_at: Option<std::time::SystemTime>,
        /// Not started this long after it is enqueued (e.g. 1h), the job never runs.
        #[arg(long, value_parser = humantime::parse_duration)]
        expires_in: Option<Duration>,
        /// What groups the job with others (a customer, a tenant), e.g. customer-42: the
        /// rules of a job id. May begin with '-'.
        #[arg(long, allow_hyphen_values = true)]
        key: Option<String>,
        /// Jobs of this --key that come within this window collapse into the last one, run
        /// once the key has been quiet this long (e.g. 5s).
        #[arg(long, value_parser = humantime::parse_duration)]
        debounce: Option<Duration>,
        /// With --debounce: the job runs at the latest this long after the first one came.
        #[arg(long, value_parser = humantime::parse_duration)]
        debounce_max_wait: Option<Duration>,
        /// At most one job of this --key per window; the others end at once (throttled).
        #[arg(long, value_parser = humantime::parse_duration)]
        throttle: Option<Duration>,
        /// The --idempotency-key is held this long only (e.g. 1h); then a new job may take it.
        #[arg(long, value_parser = humantime::parse_duration)]
        unique_for: Option<Duration>,
    },
    /// Enqueue many jobs at once from JSON lines, one job per line with the fields of SQL
    /// enqueue_many() ({"queue": "email", "payload": {...}, "id": ..., "delay_ms": ...}), in
    /// one transaction: all of them, or none when a line is refused (the error names it).
    EnqueueMany {
        /// A JSON-lines file, or - for standard input.
        #[arg(default_value = "-")]
        file: String,
        /// Print each job's id, one per line, in the order of the lines.
        #[arg(long)]
        ids: bool,
    },
    /// Enqueue a batch from JSON lines (one job per line, as enqueue-many), in one
    /// transaction, with callback jobs that run once when every member has ended; they
    /// receive the batch's counts and failed ids as their parents' results. Prints its id.
    EnqueueBatch {
        /// A JSON-lines file, or - for standard input.
        #[arg(default_value = "-")]
        file: String,
        /// The batch's id (made up when not given).
        #[arg(long, allow_hyphen_values = true)]
        id: Option<String>,
        /// The job that runs once every member has ended, as a JSON job spec
        /// ('{"queue": "reports", "payload": {...}}').
        #[arg(long)]
        on_complete: Option<String>,
        /// The job that runs once every member has completed (none failed).
        #[arg(long)]
        on_success: Option<String>,
    },
    /// A batch's progress: members by status, and once it finished, its callbacks and the
    /// outcome they received.
    Batch {
        #[command(subcommand)]
        command: BatchCommand,
    },
    /// Inspect jobs.
    Jobs {
        #[command(subcommand)]
        command: JobsCommand,
    },
    /// The dead-letter queue: list, retry, purge.
    Dlq {
        #[command(subcommand)]
        command: DlqCommand,
    },
    /// Cron schedules: `cron list` shows each one's last and next fires.
    Cron {
        #[command(subcommand)]
        command: CronCommand,
    },
    /// Pause and resume queues on every worker; list the paused ones.
    Queues {
        #[command(subcommand)]
        command: queues::QueuesCommand,
    },
    /// Keyed queues: per-key overrides (set, unset, list with the busiest keys) and
    /// skipping an ordered key's dead job.
    Keys {
        #[command(subcommand)]
        command: keys::KeysCommand,
    },
    /// Retention: delete finished jobs whose keep is over now (one round, as the workers do
    /// every retention.every), or see with --dry-run what would go.
    Prune(prune::PruneArgs),
    /// Per-queue statistics (the job_stats view).
    Stats {
        #[arg(long)]
        json: bool,
    },
    /// The workers: each one's host, version, heartbeat age and jobs in flight.
    Workers {
        /// Stopped workers too (newest first, at most --limit).
        #[arg(long)]
        all: bool,
        #[arg(long, default_value_t = 100)]
        limit: i64,
        #[arg(long)]
        json: bool,
    },
    /// Benchmark: push no-op jobs through a worker and print throughput and latency.
    Bench(bench::BenchArgs),
    /// Demo: throwaway servers, several workers, a mixed workload, live progress and counts.
    Demo(demo::DemoArgs),
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Print the effective configuration (secrets redacted), or every error.
    Check {
        /// The pod's terminationGracePeriodSeconds, e.g. 120s: warn when worker.shutdown_grace
        /// and the release after it do not fit (default: $JOBWARDEN_POD_TERMINATION_GRACE_SECONDS).
        #[arg(long, value_parser = humantime::parse_duration)]
        termination_grace_period: Option<Duration>,
    },
}

#[derive(Subcommand)]
enum DlqCommand {
    /// Dead jobs, the most recently dead first.
    List {
        #[arg(long)]
        queue: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: i64,
        #[arg(long)]
        json: bool,
    },
    /// Retry a dead job (fresh attempts, same id, history kept), or every dead job of a queue.
    Retry {
        /// The dead job's id.
        #[arg(allow_hyphen_values = true)]
        id: Option<String>,
        #[arg(long)]
        queue: Option<String>,
        /// With --queue: every dead job of that queue.
        #[arg(long)]
        all: bool,
    },
    /// Delete dead jobs older than an age, e.g. 30d.
    Purge {
        #[arg(long, value_parser = parse_age)]
        older_than: Duration,
    },
}

fn parse_then(text: &str) -> Result<Vec<jobwarden::client::Then>, String> {
    let example = "give a JSON array of jobs, e.g. '[{\"queue\":\"email\",\"payload\":{\"to\":\"a@example.com\"}}]'";
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("{e}: {example}"))?;
    // The job contract names what is wrong, in the words every other door uses.
    let mut spec = serde_json::Map::new();
    spec.insert("payload".into(), serde_json::json!({}));
    spec.insert("then".into(), value);
    let checked = jobwarden::contract::check_spec(&spec, jobwarden::contract::Door::Message, None)
        .map_err(|e| e.to_string())?;
    serde_json::from_value(checked.then.unwrap_or_default()).map_err(|e| format!("{e}: {example}"))
}

/// An instant as RFC 3339 (`2026-11-27T03:00:00Z`, `2026-11-27T04:00:00+01:00`).
fn parse_instant(text: &str) -> Result<std::time::SystemTime, String> {
    chrono::DateTime::parse_from_rfc3339(text)
        .map(std::time::SystemTime::from)
        .map_err(|e| {
            format!("{text:?} is not an RFC 3339 instant ({e}); write e.g. 2026-11-27T03:00:00Z")
        })
}

fn parse_backoff(s: &str) -> Result<jobwarden::backoff::Backoff, String> {
    use jobwarden::backoff::{Backoff, BackoffKind};
    let usage =
        "write it as KIND:BASE[:MAX], e.g. exponential:1s:10m (kinds: fixed, linear, exponential)";
    let mut parts = s.split(':');
    let kind = match parts.next() {
        Some("fixed") => BackoffKind::Fixed,
        Some("linear") => BackoffKind::Linear,
        Some("exponential") => BackoffKind::Exponential,
        other => {
            return Err(format!(
                "unknown backoff kind {:?}; {usage}",
                other.unwrap_or("")
            ))
        }
    };
    let dur = |p: Option<&str>, what: &str| -> Result<Option<Duration>, String> {
        p.map(|v| humantime::parse_duration(v).map_err(|e| format!("{what} {v:?}: {e}; {usage}")))
            .transpose()
    };
    let base = dur(parts.next(), "base")?.ok_or_else(|| format!("missing base delay; {usage}"))?;
    let mut b = Backoff {
        kind,
        base,
        ..Backoff::default()
    };
    if let Some(max) = dur(parts.next(), "max")? {
        b.max = max;
    }
    b.validate().map_err(|e| format!("{e}; {usage}"))?;
    Ok(b)
}

fn parse_age(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s)
        .map_err(|e| format!("{s:?} is not an age ({e}); write it like 30d, 12h or 90m"))
}

#[derive(Subcommand)]
enum CronCommand {
    /// Every schedule of the configuration: expression, time zone, queue, missed-fire
    /// policy, when it last fired (from the database) and its next fires.
    List {
        /// How many next fires to show (1 to 100).
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=100))]
        next: u16,
    },
}

#[derive(Subcommand)]
enum BatchCommand {
    /// One batch: its members by status, when it finished, its callbacks and outcome.
    Show {
        #[arg(allow_hyphen_values = true)]
        id: String,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum JobsCommand {
    /// Cancel a job that has not finished: a queued one never runs, a running one is stopped;
    /// jobs that depend on it are cancelled too.
    Cancel {
        #[arg(allow_hyphen_values = true)]
        id: String,
        /// Every unfinished job of the job's pipeline.
        #[arg(long)]
        pipeline: bool,
    },
    /// Complete an awaiting job (its handler deferred it) with its attempt's token, as a
    /// webhook or an operator would: `--result` is stored as the job's result.
    Complete {
        #[arg(allow_hyphen_values = true)]
        id: String,
        /// The attempt's completion token (`<lease>.<32 hex digits>`).
        #[arg(long)]
        token: String,
        /// The job's result, as JSON (`-` reads it from stdin).
        #[arg(long, allow_hyphen_values = true)]
        result: Option<String>,
    },
    /// Fail an awaiting job (its handler deferred it) with its attempt's token: retried after
    /// its backoff, or dead with --permanent or no attempts left.
    Fail {
        #[arg(allow_hyphen_values = true)]
        id: String,
        /// The attempt's completion token (`<lease>.<32 hex digits>`).
        #[arg(long)]
        token: String,
        /// Why it failed (kept as the job's last error).
        #[arg(long, allow_hyphen_values = true)]
        error: Option<String>,
        /// It can never succeed: dead-letter it now.
        #[arg(long)]
        permanent: bool,
        /// Run it again after this long (30s, 5m) instead of its backoff.
        #[arg(long, value_parser = humantime::parse_duration)]
        retry_after: Option<std::time::Duration>,
    },
    /// A pipeline (the jobs chained with `then` and `depends_on`): each job's state and
    /// parents.
    Pipeline {
        /// Any job of the pipeline.
        #[arg(allow_hyphen_values = true)]
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// Retry a dead job (fresh attempts, same id, history kept).
    Retry {
        #[arg(allow_hyphen_values = true)]
        id: String,
    },
    /// Show one job with its attempts.
    Show {
        #[arg(allow_hyphen_values = true)]
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// Cancel, retry or discard every job matching a filter: counts first (nothing changes
    /// without --yes), then acts in batches on at most the jobs counted, recorded in
    /// bulk_actions with who ran it.
    Bulk(bulk::BulkArgs),
    /// List jobs, newest first.
    List {
        #[arg(long)]
        queue: Option<String>,
        #[arg(long)]
        status: Option<String>,
        /// Only the jobs of this key (e.g. customer-42).
        #[arg(long, allow_hyphen_values = true)]
        key: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: i64,
        #[arg(long)]
        json: bool,
    },
}

/// The command's allocator: jemalloc, with one arena (each thread still has its own cache, so
/// threads rarely meet on a lock) and freed memory handed back to the system after a second.
/// Measured against glibc's malloc with one arena (what this was before), alternating runs of
/// `jobwarden bench` on one machine: the worker's CPU per job in the Rust phase 8.7–13.5 →
/// 7.4–8.5 µs; a 1,000,000-job backlog through `jobwarden run` (512 HTTP slots) 22,911 →
/// 29,005 jobs/s, its RSS 20.4–24.0 → 22.3–24.9 MiB, flat from the first job to the last.
/// `_RJEM_MALLOC_CONF` in the environment overrides these settings (jemalloc's `MALLOC_CONF`
/// syntax).
#[cfg(target_os = "linux")]
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc reads its settings from this symbol at start-up (a pointer to a C string).
#[cfg(target_os = "linux")]
#[allow(non_upper_case_globals)]
#[unsafe(export_name = "_rjem_malloc_conf")]
pub static malloc_conf: &[u8; 47] = b"narenas:1,dirty_decay_ms:1000,muzzy_decay_ms:0\0";

fn main() {
    let cli = Cli::parse();
    init_tracing(cli.log_json);
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    let code = match rt.block_on(real_main(cli)) {
        Ok(()) => 0,
        // Logged once already, with its cause, when it happened.
        Err(e) if e.downcast_ref::<ServiceFailure>().is_some() => EXIT_SERVICE_FAILED,
        Err(e) => {
            let bad_input = e
                .downcast_ref::<jobwarden::config::ConfigErrors>()
                .is_some()
                || e.downcast_ref::<BadArgs>().is_some();
            // Its last words too are scrubbed of the configuration's secrets.
            eprintln!("error: {}", jobwarden::redact::known(&format!("{e:#}")));
            if bad_input {
                2
            } else {
                1
            }
        }
    };
    std::process::exit(code);
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct BadArgs(String);

/// Prints what `jobs complete` or `jobs fail` came to; a refusal is an error (exit 2 for an
/// unknown job or a malformed argument, else 1), with PostgreSQL's message and hint.
fn ended_from_outside(id: &str, answer: jobwarden::store::EndResult) -> Result<()> {
    use jobwarden::completion::Refusal;
    match answer {
        Ok(how) => {
            println!("{id}: {}", how.as_str());
            Ok(())
        }
        Err(r) if matches!(r.refusal, Refusal::UnknownJob | Refusal::Invalid) => {
            Err(BadArgs(r.message).into())
        }
        Err(r) if r.refusal.recorded() => Err(anyhow!(
            "{} (refused; recorded in the job's attempts)",
            r.message
        )),
        Err(r) => Err(anyhow!("{} (refused)", r.message)),
    }
}

fn config_path(cli: &Cli) -> Option<PathBuf> {
    cli.config.clone().or_else(|| {
        let p = PathBuf::from("jobwarden.toml");
        p.exists().then_some(p)
    })
}

// Long on purpose: one match arm per subcommand, each a call or a few lines.
#[allow(clippy::too_many_lines)]
async fn real_main(cli: Cli) -> Result<()> {
    let path = config_path(&cli);
    match cli.command {
        Command::Run => {
            let config = Config::load(path.as_deref())?;
            run(config).await
        }
        Command::Migrate => {
            let config = Config::load_connections(path.as_deref())?;
            let store = Store::connect(&config.database).await?;
            let n = store.migrate().await?;
            println!(
                "schema {} at {}: {n} migration(s) applied, now at version {}",
                store.schema(),
                store.target(),
                store.schema_version().await?
            );
            Ok(())
        }
        Command::Config {
            command: ConfigCommand::Check {
                termination_grace_period,
            },
        } => {
            let config = Config::load(path.as_deref())?;
            print!("{}", config.to_redacted_toml());
            let warning = match termination_grace_period {
                Some(grace) => config.termination_grace_warning(grace),
                None => config.termination_grace_warning_from_env(),
            };
            if let Some(w) = warning {
                eprintln!("warning: {w}");
            }
            eprintln!("configuration is valid");
            Ok(())
        }
        Command::Enqueue {
            queue,
            payload,
            priority,
            delay,
            max_attempts,
            timeout,
            idempotency_key,
            id,
            backoff,
            depends_on,
            then,
            expires_at,
            expires_in,
            key,
            debounce,
            debounce_max_wait,
            throttle,
            unique_for,
        } => {
            let config = Config::load_connections(path.as_deref())?;
            let payload: serde_json::Value = serde_json::from_str(&payload).map_err(|e| {
                BadArgs(format!(
                    "payload is not valid JSON ({e}); pass an object like '{{\"to\":\"a@example.com\"}}'"
                ))
            })?;
            let store = Store::connect(&config.database).await?;
            let broker = jobwarden::broker::Broker::connect(&config.nats).await?;
            let default_attempts = config
                .queues
                .get(&queue)
                .map(|q| q.max_attempts as i32)
                .unwrap_or(jobwarden::config::DEFAULT_MAX_ATTEMPTS as i32);
            let client = Client::new(store, broker)
                .with_default_max_attempts(default_attempts)
                .with_max_payload_bytes(config.worker.max_payload_bytes);
            let opts = EnqueueOptions {
                id,
                priority,
                delay,
                max_attempts,
                timeout,
                idempotency_key,
                backoff,
                depends_on,
                then: match then {
                    Some(text) => parse_then(&text).map_err(|e| BadArgs(format!("--then: {e}")))?,
                    None => Vec::new(),
                },
                expires_at,
                expires_in,
                key,
                debounce,
                debounce_max_wait,
                throttle,
                unique_for,
            };
            let enq = client
                .enqueue(&queue, payload, opts)
                .await
                .map_err(|e| match e {
                    jobwarden::client::ClientError::Invalid(m) => anyhow!(BadArgs(m)),
                    // The contract's words, led by the argument that gave the field.
                    jobwarden::client::ClientError::Refused(r) => {
                        let top = r.field().split(['.', '[']).next().unwrap_or_default();
                        let arg = match top {
                            "queue" => "QUEUE".to_string(),
                            "payload" => "PAYLOAD".to_string(),
                            "timeout_ms" => "--timeout".to_string(),
                            "delay_ms" => "--delay".to_string(),
                            other => format!("--{}", other.replace('_', "-")),
                        };
                        anyhow!(BadArgs(format!("{arg}: {r}")))
                    }
                    other => anyhow!(other),
                })?;
            if enq.created {
                println!("{} {}", enq.id, enq.status);
            } else {
                println!("{} {} (already enqueued)", enq.id, enq.status);
            }
            Ok(())
        }
        Command::EnqueueMany { file, ids } => {
            let config = Config::load_connections(path.as_deref())?;
            let store = Store::connect(&config.database).await?;
            let broker = jobwarden::broker::Broker::connect(&config.nats).await?;
            enqueue_many::run(&Client::new(store, broker), &file, ids).await
        }
        Command::EnqueueBatch {
            file,
            id,
            on_complete,
            on_success,
        } => {
            let config = Config::load_connections(path.as_deref())?;
            let store = Store::connect(&config.database).await?;
            let broker = jobwarden::broker::Broker::connect(&config.nats).await?;
            let client = Client::new(store, broker);
            enqueue_many::run_batch(&client, &file, id, on_complete, on_success).await
        }
        Command::Batch {
            command: BatchCommand::Show { id, json },
        } => {
            let config = Config::load_connections(path.as_deref())?;
            let store = Store::connect(&config.database).await?;
            let Some(p) = store.batch_progress(&id).await? else {
                return Err(BadArgs(format!(
                    "no batch with id {id:?} in schema {}",
                    store.schema()
                ))
                .into());
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&p)?);
            } else {
                println!("batch {id}: {}", p.summary());
                if let Some(o) = &p.outcome {
                    println!("outcome: {o}");
                }
            }
            Ok(())
        }
        Command::Cron {
            command: CronCommand::List { next },
        } => {
            let config = Config::load_connections(path.as_deref())?;
            cron_list(&config, next.into()).await
        }
        Command::Jobs { command } => {
            let config = Config::load_connections(path.as_deref())?;
            let store = Store::connect(&config.database).await?;
            jobs(&store, command).await
        }
        Command::Dlq { command } => {
            let config = Config::load_connections(path.as_deref())?;
            let store = Store::connect(&config.database).await?;
            dlq(&store, command).await
        }
        Command::Queues { command } => {
            let config = Config::load_connections(path.as_deref())?;
            let store = Store::connect(&config.database).await?;
            queues::run(&store, command).await
        }
        Command::Keys { command } => {
            let config = Config::load_connections(path.as_deref())?;
            keys::run(&config, command).await
        }
        Command::Prune(args) => {
            let config = Config::load_connections(path.as_deref())?;
            prune::run(args, config).await
        }
        Command::Stats { json } => {
            let config = Config::load_connections(path.as_deref())?;
            let store = Store::connect(&config.database).await?;
            stats(&store, json).await
        }
        Command::Workers { all, limit, json } => {
            let config = Config::load_connections(path.as_deref())?;
            let store = Store::connect(&config.database).await?;
            let rows = store.workers(all, limit).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                print!("{}", jobwarden::view::format_workers(&rows));
            }
            Ok(())
        }
        Command::Bench(args) => bench::run(args, path.as_deref()).await,
        Command::Demo(args) => demo::run(args).await,
    }
}

async fn run(config: Config) -> Result<()> {
    // A test hook: failures injected on purpose (see FailPoints).
    let points: FailPoints = match std::env::var(FAILPOINTS_ENV) {
        Ok(spec) => spec.parse().map_err(BadArgs)?,
        Err(_) => FailPoints::default(),
    };
    if !points.is_empty() {
        tracing::warn!(failpoints = ?points, "{FAILPOINTS_ENV} is set: this worker will fail on purpose (a test hook; never set it in production)");
    }
    // A panic in any task — also one a library spawned (the NATS client's connection, an
    // HTTP connection) — stops the worker; one inside a job's handler fails that job.
    jobwarden::worker::report_unsupervised_panics();
    let cancel = CancellationToken::new();
    let start = jobwarden::Worker::new(config)
        .failpoints(points)
        .start(cancel.clone());
    // A signal during start-up (e.g. while waiting for an unreachable server) stops it.
    let worker = tokio::select! {
        w = start => w?,
        _ = shutdown_signal() => { cancel.cancel(); return Ok(()); }
    };
    worker.run_until(shutdown_signal()).await?;
    Ok(())
}

/// Resolves on the first SIGTERM or SIGINT; a second one exits at once.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    tracing::info!("shutdown requested; a second signal exits at once");
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        eprintln!("second signal: exiting now");
        std::process::exit(130);
    });
}

async fn retry_one(store: &Store, id: &str) -> Result<()> {
    let retried = store.job_retry_dead(Some(&[id.to_string()]), None).await?;
    if retried.is_empty() {
        return Err(match store.job_get(id).await? {
            None => BadArgs(format!(
                "no job with id {id:?} in schema {}",
                store.schema()
            )),
            Some(j) => BadArgs(format!(
                "job {id} is {}, not dead: only dead jobs can be retried",
                j.status
            )),
        }
        .into());
    }
    println!("{id} scheduled for a fresh run (its history is kept)");
    Ok(())
}

async fn dlq(store: &Store, command: DlqCommand) -> Result<()> {
    match command {
        DlqCommand::List { queue, limit, json } => {
            let rows = store.dead_list(queue.as_deref(), limit).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
                return Ok(());
            }
            println!("{:<38} {:<10} {:>8} {:<24} last error", "id", "queue", "attempts", "died");
            for j in rows {
                println!(
                    "{:<38} {:<10} {:>8} {:<24} {}",
                    j.id,
                    j.queue,
                    format!("{}/{}", j.attempts, j.max_attempts),
                    j.completed_at.as_deref().unwrap_or("-"),
                    j.last_error.as_deref().unwrap_or("")
                );
            }
            Ok(())
        }
        DlqCommand::Retry { id: Some(id), queue: None, all: false } => retry_one(store, &id).await,
        DlqCommand::Retry { id: None, queue: Some(q), all: true } => {
            let n = store.job_retry_dead(None, Some(&q)).await?.len();
            println!("{n} dead job(s) of queue {q} scheduled for a fresh run");
            Ok(())
        }
        DlqCommand::Retry { .. } => Err(BadArgs(
            "give either a job id (dlq retry <id>) or a queue with --all (dlq retry --queue email --all)".into(),
        )
        .into()),
        DlqCommand::Purge { older_than } => {
            let n = store.job_purge_dead(older_than).await?;
            println!(
                "deleted {n} dead job(s) that died more than {} ago",
                humantime::format_duration(older_than)
            );
            Ok(())
        }
    }
}

async fn stats(store: &Store, json: bool) -> Result<()> {
    let rows = store.job_stats().await?;
    let unserved = store.unserved_list().await?;
    let paused = store.paused_queues().await?;
    let busiest = store
        .key_busiest(None, jobwarden::store::BUSIEST_KEYS)
        .await?;
    if json {
        let out = serde_json::json!({ "queues": rows, "unserved": unserved, "paused": paused, "busiest_keys": busiest });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    print!("{}", jobwarden::view::format_stats(&rows));
    print!("{}", jobwarden::view::format_unserved(&unserved));
    if !paused.is_empty() {
        print!("\n{}", jobwarden::view::format_paused(&paused));
    }
    if !busiest.is_empty() {
        print!("{}", keys::format_busiest(&busiest));
    }
    Ok(())
}

// Long on purpose: one match arm per `jobs` subcommand.
#[allow(clippy::too_many_lines)]
async fn jobs(store: &Store, command: JobsCommand) -> Result<()> {
    match command {
        JobsCommand::Retry { id } => retry_one(store, &id).await,
        JobsCommand::Complete { id, token, result } => {
            let result = match result.as_deref() {
                None => None,
                Some(text) => {
                    let text = if text == "-" {
                        std::io::read_to_string(std::io::stdin())?
                    } else {
                        text.to_string()
                    };
                    Some(
                        serde_json::from_str::<serde_json::Value>(&text).map_err(|e| {
                            BadArgs(format!(
                                "--result is not JSON ({e}); quote a string: --result '\"done\"'"
                            ))
                        })?,
                    )
                }
            };
            let answer = store
                .complete_job(&id, &token, result.as_ref(), &queues::who())
                .await?;
            ended_from_outside(&id, answer)
        }
        JobsCommand::Fail {
            id,
            token,
            error,
            permanent,
            retry_after,
        } => {
            let answer = store
                .fail_job(
                    &id,
                    &token,
                    error.as_deref().unwrap_or(""),
                    permanent,
                    retry_after,
                    &queues::who(),
                )
                .await?;
            ended_from_outside(&id, answer)
        }
        JobsCommand::Bulk(args) => bulk::run(store, args).await,
        JobsCommand::Cancel { id, pipeline: true } => {
            let cancelled = store.pipeline_cancel(&id).await?;
            if cancelled.is_empty() && store.job_get(&id).await?.is_none() {
                return Err(BadArgs(format!(
                    "no job with id {id:?} in schema {}",
                    store.schema()
                ))
                .into());
            }
            println!(
                "{} unfinished jobs of the pipeline of {id} cancelled{}",
                cancelled.len(),
                if cancelled.is_empty() {
                    String::new()
                } else {
                    format!(": {}", cancelled.join(", "))
                }
            );
            Ok(())
        }
        JobsCommand::Pipeline { id, json } => {
            let jobs = store.pipeline_jobs(&id).await?;
            if jobs.is_empty() {
                return Err(BadArgs(format!(
                    "no job with id {id:?} in schema {}",
                    store.schema()
                ))
                .into());
            }
            if json {
                println!("{}", serde_json::to_string_pretty(&jobs)?);
            } else {
                print!("{}", jobwarden::view::format_pipeline(&jobs));
            }
            Ok(())
        }
        JobsCommand::Cancel {
            id,
            pipeline: false,
        } => match store.job_cancel(&id).await? {
            Some(was) => {
                println!(
                    "{id} cancelled (it was {was}{})",
                    if was.as_str() == "processing" {
                        "; its worker stops it at its next lease check"
                    } else {
                        ""
                    }
                );
                Ok(())
            }
            None => Err(match store.job_get(&id).await? {
                None => BadArgs(format!(
                    "no job with id {id:?} in schema {}",
                    store.schema()
                )),
                Some(j) => BadArgs(format!(
                    "job {id} is {}: a finished job cannot be cancelled",
                    j.status
                )),
            }
            .into()),
        },
        JobsCommand::Show { id, json } => {
            let job = store.job_get(&id).await?.ok_or_else(|| {
                BadArgs(format!(
                    "no job with id {id:?} in schema {}",
                    store.schema()
                ))
            })?;
            let attempts = store.job_attempts(&id).await?;
            let waiting = store.job_explain(&id).await?.unwrap_or_default();
            if json {
                let v =
                    serde_json::json!({"job": job, "attempts": attempts, "waiting_for": waiting});
                println!("{}", serde_json::to_string_pretty(&v)?);
                return Ok(());
            }
            let owner = match &job.worker_id {
                Some(w) => store.worker(w).await?,
                None => None,
            };
            let mut view = JobView::new(job, attempts, Some(waiting), owner.as_ref());
            if let Some((b, progress)) = view.batch.as_mut() {
                *progress = store.batch_progress(b).await?.map(|p| p.summary());
            }
            print!("{}", jobwarden::view::format_job(&view));
            Ok(())
        }
        JobsCommand::List {
            queue,
            status,
            key,
            limit,
            json,
        } => {
            if let Some(s) = &status {
                if JobStatus::parse(s).is_none() {
                    return Err(BadArgs(format!(
                        "--status {s:?} is not a status; use one of queued, scheduled, processing, completed, dead, cancelled"
                    ))
                    .into());
                }
            }
            let rows = store
                .job_list(queue.as_deref(), status.as_deref(), key.as_deref(), limit)
                .await
                .context("listing jobs")?;
            if json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
                return Ok(());
            }
            println!(
                "{:<38} {:<10} {:<11} {:>8} {:<24} error",
                "id", "queue", "status", "attempts", "created"
            );
            for j in rows {
                println!(
                    "{:<38} {:<10} {:<11} {:>8} {:<24} {}",
                    j.id,
                    j.queue,
                    j.status,
                    format!("{}/{}", j.attempts, j.max_attempts),
                    j.created_at,
                    j.last_error
                        .as_deref()
                        .unwrap_or("")
                        .chars()
                        .take(60)
                        .collect::<String>()
                );
            }
            Ok(())
        }
    }
}

fn init_tracing(json: bool) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        EnvFilter::new("info,tokio_postgres=warn,refinery_core=warn,async_nats=warn")
    });
    // Every line is scrubbed of the secrets the configuration holds (redact::remember):
    // whatever a library logs at debug level, a password does not reach the log.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(jobwarden::redact::Scrubbed(std::io::stderr));
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// `jobwarden cron list`.
async fn cron_list(config: &Config, next: usize) -> anyhow::Result<()> {
    if config.cron.is_empty() {
        println!("no cron schedules: add a [cron.<name>] section (see docs/configuration.md)");
        return Ok(());
    }
    // The last fires come from the database; without it the next fires still show.
    let last: std::collections::HashMap<String, String> = match Store::connect(&config.database)
        .await
    {
        Ok(store) => match store.cron_last_fires().await {
            Ok(rows) => rows
                .into_iter()
                .map(|(n, at)| (n, at.format("%Y-%m-%d %H:%M:%SZ").to_string()))
                .collect(),
            Err(e) => {
                eprintln!("last fires unknown ({e}); run `jobwarden migrate` if the schema is new");
                Default::default()
            }
        },
        Err(e) => {
            eprintln!("last fires unknown: {e}");
            Default::default()
        }
    };
    let now = chrono::Utc::now();
    println!(
        "{:<20} {:<18} {:<16} {:<12} {:<9} {:<21} next fires (UTC)",
        "schedule", "expression", "timezone", "queue", "missed", "last fire"
    );
    for (name, c) in &config.cron {
        let s = jobwarden::cron::Schedule::new(name, c).map_err(|e| anyhow!(e.join("; ")))?;
        let fires: Vec<String> = s
            .next_fires(now, next)
            .iter()
            .map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string())
            .collect();
        let missed = match c.missed {
            jobwarden::cron::Missed::Skip => "skip",
            jobwarden::cron::Missed::RunOnce => "run_once",
        };
        println!(
            "{:<20} {:<18} {:<16} {:<12} {:<9} {:<21} {}",
            name,
            c.schedule,
            c.timezone,
            c.queue,
            missed,
            last.get(name).map(String::as_str).unwrap_or("never"),
            fires.join(", ")
        );
    }
    Ok(())
}
