//! `jobwarden bench`: pushes no-op jobs through a real worker against real servers and prints
//! throughput, publish-to-handler-start latency percentiles, peak RSS and recovery times
//! (`bench_recovery`).
//!
//! Each run uses its own schema, stream and subject prefix (dropped afterwards), so it can
//! point at a shared PostgreSQL and nats-server. Phases, for the in-process Rust handler and
//! then the HTTP handler (a local no-op app):
//! 1. throughput: publish N jobs first, start the worker, time from the first job's start to
//!    the last completion (as graphile-worker's and pg-boss's benchmarks time theirs);
//! 2. latency, once per `--rate`: with the worker idle and waiting, publish jobs at a steady
//!    rate; each payload carries its publish time, the handler records `start - publish`.
//!
//! The throughput phase also reports what each job cost PostgreSQL ([`PgCost`]): WAL bytes,
//! transactions, rows inserted and updated (and how many updates were HOT) per table, read
//! from the server's own counters around the phase. Then a `jobwarden run` process drains N
//! jobs through the HTTP handler and its own peak RSS is read (the worker alone, as
//! deployed); `--backlog 1000000` also drains a backlog that size, sampling its RSS.

use anyhow::{Context, Result};
use jobwarden::broker::Broker;
use jobwarden::config::{Config, HandlerConfig, QueueConfig};
use jobwarden::handler::{from_fn, Handler};
use jobwarden::store::Store;
use jobwarden::worker::{Stats, Worker};
use serde_json::json;
use std::path::Path;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio_util::sync::CancellationToken;

#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// Jobs in the throughput phase.
    #[arg(long, default_value_t = 50_000)]
    pub jobs: usize,
    /// Jobs in the latency phase.
    #[arg(long, default_value_t = 2_000)]
    pub latency_jobs: usize,
    /// Publish rates of the latency phases (jobs per second), comma-separated: one phase
    /// each, of `--latency-jobs` jobs or one second of traffic, whichever is more.
    #[arg(long, value_delimiter = ',', default_values_t = [500, 5000])]
    pub rate: Vec<u64>,
    /// Handler slots of the bench queue.
    #[arg(long, default_value_t = 512)]
    pub concurrency: usize,
    /// Skip the HTTP handler phases.
    #[arg(long)]
    pub no_http: bool,
    /// Skip the recovery phase (kill -9 of worker processes; about 30 s).
    #[arg(long)]
    pub no_recovery: bool,
    /// Start throwaway nats-server and PostgreSQL instead of the configured ones.
    #[arg(long)]
    pub throwaway: bool,
    /// A cluster-wide cap on the bench queue (to measure what flow control costs).
    #[arg(long)]
    pub global_concurrency: Option<u32>,
    /// A cluster-wide rate limit on the bench queue, e.g. 1000000/1s.
    #[arg(long)]
    pub rate_limit: Option<jobwarden::config::RateLimit>,
    /// Give the bench jobs this many distinct keys (job i has key i mod N, read from its
    /// payload by the queue's key_from), to measure a keyed queue with --key-concurrency or
    /// --fair-by-key.
    #[arg(long)]
    pub keys: Option<usize>,
    /// A per-key limit on the bench queue (makes it keyed).
    #[arg(long)]
    pub key_concurrency: Option<u32>,
    /// Fair turns across the keys (makes the queue keyed).
    #[arg(long)]
    pub fair_by_key: bool,
    /// Skip the worker-alone phase (a `jobwarden run` process with the HTTP handler, whose
    /// own peak RSS is measured).
    #[arg(long)]
    pub no_process: bool,
    /// Also drain a backlog of this many jobs (e.g. 1000000) through a `jobwarden run`
    /// process, sampling its RSS as the backlog goes down.
    #[arg(long)]
    pub backlog: Option<usize>,
    /// Also enqueue this many jobs in one SQL transaction (`enqueue_many()`, as `jobwarden
    /// enqueue-many` does) and drain them through a `jobwarden run` process; then the same
    /// number again as one batch (`enqueue_batch()`, with an on_complete callback): enqueue
    /// time and drain throughput of each, to compare.
    #[arg(long)]
    pub enqueue_many: Option<usize>,
    /// Publish each throughput and latency phase's jobs as the members of one batch (the
    /// envelope's `"batch": {"id", "size"}`), to compare what a batch member costs with a
    /// plain job.
    #[arg(long)]
    pub batch: bool,
    /// Only time the operator's answers (stats, the dashboard's overview, queue depths, the
    /// dead-letter list) on a table holding this many finished jobs (e.g. 10000000).
    #[arg(long)]
    pub history: Option<usize>,
    /// Only the retention phase: seed this many finished jobs older than their keep, then
    /// run a stream at the first --rate with retention on (pruning them) and off, and print
    /// publish→start p50/p99 of both and how long the prune took.
    #[arg(long)]
    pub prune: Option<u64>,
    /// Trace every phase's jobs with OpenTelemetry at this sampling ratio (e.g. 0.1), sent
    /// to an OTLP/HTTP sink in this process that counts and discards them: what tracing
    /// costs, against a run without the flag.
    #[arg(long)]
    pub trace_ratio: Option<f64>,
}

pub fn now_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_micros() as i64
}

/// Peak resident set size of this process (VmHWM), in MiB.
pub fn peak_rss_mib() -> f64 {
    proc_status_mib("self", "VmHWM:")
}

/// A memory figure of `/proc/<pid>/status` (`VmHWM:` peak, `VmRSS:` now), in MiB.
fn proc_status_mib(pid: &str, key: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}

/// What the handlers saw: each job's publish→start latency, and when the first job started
/// (throughput is timed from there to the last completion, as the peers' benchmarks do, so
/// the worker's start-up is not in it).
#[derive(Default)]
struct Probe {
    latencies: Mutex<Vec<u64>>,
    first_start_us: AtomicI64,
}

impl Probe {
    /// A job started; `published_us` is the publish time its payload carries.
    fn started(&self, published_us: Option<i64>) {
        let now = now_micros();
        let _ = self
            .first_start_us
            .compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed);
        if let Some(t) = published_us {
            self.latencies.lock().unwrap().push((now - t).max(0) as u64);
        }
    }

    fn reset(&self) {
        self.latencies.lock().unwrap().clear();
        self.first_start_us.store(0, Ordering::Relaxed);
    }

    /// Time from the first start until now.
    fn since_first_start(&self) -> Duration {
        let first = self.first_start_us.load(Ordering::Relaxed);
        Duration::from_micros((now_micros() - first).max(0) as u64)
    }

    fn sorted_latencies(&self) -> Vec<u64> {
        let mut l = self.latencies.lock().unwrap().clone();
        l.sort_unstable();
        l
    }
}

/// p-th percentile (0–100) of sorted samples.
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

// Long on purpose: the benchmark's phases in the order they run, each a few lines, so the order reads top to bottom.
#[allow(clippy::too_many_lines)]
pub async fn run(args: BenchArgs, config_path: Option<&Path>) -> Result<()> {
    let mut base = Config::load_connections(config_path)?;
    let _servers = if args.throwaway {
        let nats = crate::testkit::NatsServer::start()?;
        let pg = crate::testkit::PgCluster::start()?;
        base.nats.url = nats.url();
        base.database.url = pg.url();
        Some((nats, pg))
    } else {
        None
    };
    if let Some(n) = args.prune {
        return crate::bench_prune::run(&base, &args, n).await;
    }
    let sink = match args.trace_ratio {
        Some(ratio) => {
            let sink = crate::otlp_sink::OtlpSink::start().await?;
            base.telemetry.otlp_endpoint = Some(sink.url.clone());
            base.telemetry.sample_ratio = Some(ratio);
            base.telemetry
                .resolve()
                .map_err(|e| anyhow::anyhow!(e.join("; ")))?;
            println!(
                "tracing: OpenTelemetry on, {ratio} of jobs traced, to an OTLP sink at {}",
                sink.url
            );
            Some(sink)
        }
        None => None,
    };
    println!(
        "jobwarden bench: {} cores, PostgreSQL {}, NATS {}",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        jobwarden::redact::url(&base.database.url),
        jobwarden::redact::url(&base.nats.url)
    );
    if let Some(n) = args.history {
        return crate::bench_history::run(&base, n).await;
    }
    let mut kinds = vec!["rust"];
    if !args.no_http {
        kinds.push("http");
    }
    let mut app_url = None;
    for kind in kinds {
        let probe = Arc::new(Probe::default());
        let app = if kind == "http" {
            Some(NoopApp::start(probe.clone()).await?)
        } else {
            None
        };
        let handler = app
            .as_ref()
            .map(|a| HandlerConfig::Http { url: a.url.clone() });
        let through = phase(
            &base,
            &args,
            handler.clone(),
            Phase::Throughput(args.jobs),
            probe.clone(),
        )
        .await?;
        let mut lat = Vec::new();
        for &rate in &args.rate {
            let n = args.latency_jobs.max(rate as usize);
            let r = phase(
                &base,
                &args,
                handler.clone(),
                Phase::Latency(rate, n),
                probe.clone(),
            )
            .await?;
            lat.push((rate, r));
        }
        let latency = |rate: u64, r: &PhaseResult| {
            format!(
                "publish→start latency p50 {:.2} ms, p95 {:.2} ms, p99 {:.2} ms, max {:.2} ms ({} jobs at {rate}/s)",
                percentile(&r.latencies_us, 50.0) as f64 / 1000.0,
                percentile(&r.latencies_us, 95.0) as f64 / 1000.0,
                percentile(&r.latencies_us, 99.0) as f64 / 1000.0,
                r.latencies_us.last().copied().unwrap_or(0) as f64 / 1000.0,
                r.jobs,
            )
        };
        let first = lat
            .first()
            .map(|(rate, r)| format!(" | {}", latency(*rate, r)))
            .unwrap_or_default();
        println!(
            "{kind:>4} handler: {:>8.0} jobs/s ({} jobs in {:.2}s, first start to last completion){first}",
            through.jobs as f64 / through.elapsed.as_secs_f64(),
            through.jobs,
            through.elapsed.as_secs_f64(),
        );
        // Not "<kind> handler:": scripts read the throughput from that line.
        for (rate, r) in lat.iter().skip(1) {
            println!("{kind:>4} latency at {rate}/s: {}", latency(*rate, r));
        }
        if let Some(cost) = &through.cost {
            // The CPU this process spent from the worker's start to the last completion,
            // per job: a figure that moves less with the machine's load than jobs/s do
            // (PostgreSQL's and nats-server's own CPU is not in it).
            let who = if kind == "http" {
                "worker and no-op app"
            } else {
                "worker"
            };
            let machine = through
                .machine
                .map(|m| format!("; {}", m.per_job(through.jobs)))
                .unwrap_or_default();
            println!(
                "{kind:>4} costs {}; CPU per job: this process ({who}) {:.1} µs{machine}; {} claimed ahead of a free slot; {:.1} jobs per pull request, {:.1} per settle statement",
                cost.per_job(through.jobs),
                through.cpu.as_secs_f64() * 1e6 / through.jobs.max(1) as f64,
                through.ahead,
                through.jobs as f64 / through.pulls.max(1) as f64,
                through.jobs as f64 / through.settles.max(1) as f64
            );
        }
        if let Some(a) = app {
            app_url = Some(a);
        }
    }
    println!(
        "peak RSS (worker + bench publisher, one process): {:.1} MiB",
        peak_rss_mib()
    );
    if let Some(sink) = &sink {
        println!("{}", sink.summary());
    }
    let app = match app_url {
        Some(a) => Some(a),
        None if !args.no_process || args.backlog.is_some() || args.enqueue_many.is_some() => {
            Some(NoopApp::start(Arc::new(Probe::default())).await?)
        }
        None => None,
    };
    if let Some(app) = &app {
        if !args.no_process {
            worker_process(&base, &app.url, args.jobs, args.concurrency, false).await?;
        }
        if let Some(n) = args.backlog {
            worker_process(&base, &app.url, n, args.concurrency, true).await?;
        }
        if let Some(n) = args.enqueue_many {
            sql_drain(&base, &app.url, n, args.concurrency, false).await?;
            sql_drain(&base, &app.url, n, args.concurrency, true).await?;
        }
    }
    if !args.no_recovery {
        crate::bench_recovery::run(&base).await?;
    }
    Ok(())
}

#[derive(PartialEq, Clone, Copy)]
enum Phase {
    /// This many jobs published first, then one worker drains them.
    Throughput(usize),
    /// (rate, jobs): published at a steady rate to an idle, waiting worker.
    Latency(u64, usize),
}

struct PhaseResult {
    jobs: usize,
    elapsed: Duration,
    latencies_us: Vec<u64>,
    cost: Option<PgCost>,
    /// CPU time (user + system) this process spent on the phase's jobs.
    cpu: Duration,
    /// The whole machine's CPU over the same span, when `/proc` can be read.
    machine: Option<MachineCpu>,
    /// Jobs claimed ahead of a free slot (the worker's `claimed_ahead`).
    ahead: u64,
    /// Pull requests the worker sent.
    pulls: u64,
    /// Settle statements (groups) the worker's completer sent.
    settles: u64,
}

/// CPU time the whole machine and its local servers used over a span, from `/proc` (Linux):
/// every core's busy time (`/proc/stat`) and the user + system time of the processes named
/// `postgres` and `nats-server` (per process, so backends that start meanwhile count too;
/// one that exits before the span ends loses its share). When the servers run elsewhere
/// their figures are zero and left out.
#[derive(Debug, Clone, Copy, PartialEq)]
struct MachineCpu {
    busy: Duration,
    postgres: Duration,
    nats: Duration,
}

/// A reading of `/proc` that [`MachineCpu::since`] compares a later one with.
struct MachineMark {
    busy_ticks: u64,
    procs: std::collections::HashMap<(u32, u64), (&'static str, u64)>,
}

/// Clock ticks per second of `/proc`'s CPU times.
fn clock_ticks() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as u64
    } else {
        100
    }
}

impl MachineMark {
    fn now() -> Option<MachineMark> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let busy_ticks = busy_ticks(stat.lines().next()?)?;
        let mut procs = std::collections::HashMap::new();
        for e in std::fs::read_dir("/proc").ok()?.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else {
                continue;
            };
            let Ok(s) = std::fs::read_to_string(e.path().join("stat")) else {
                continue;
            };
            if let Some((name, start, ticks)) = server_ticks(&s) {
                procs.insert((pid, start), (name, ticks));
            }
        }
        Some(MachineMark { busy_ticks, procs })
    }
}

impl MachineCpu {
    fn since(start: &MachineMark) -> Option<MachineCpu> {
        let end = MachineMark::now()?;
        let tick = Duration::from_secs(1) / clock_ticks() as u32;
        let (mut postgres, mut nats) = (0u64, 0u64);
        for (key, (name, ticks)) in &end.procs {
            let before = start.procs.get(key).map_or(0, |(_, t)| *t);
            let d = ticks.saturating_sub(before);
            if *name == "postgres" {
                postgres += d;
            } else {
                nats += d;
            }
        }
        Some(MachineCpu {
            busy: tick * end.busy_ticks.saturating_sub(start.busy_ticks) as u32,
            postgres: tick * postgres as u32,
            nats: tick * nats as u32,
        })
    }

    /// "the machine, every process, 50.1 µs (of which postgres 24.0, nats-server 9.5)",
    /// per job.
    fn per_job(&self, jobs: usize) -> String {
        let us = |d: Duration| d.as_secs_f64() * 1e6 / jobs.max(1) as f64;
        let mut servers = Vec::new();
        if !self.postgres.is_zero() {
            servers.push(format!("postgres {:.1}", us(self.postgres)));
        }
        if !self.nats.is_zero() {
            servers.push(format!("nats-server {:.1}", us(self.nats)));
        }
        let servers = if servers.is_empty() {
            String::new()
        } else {
            format!(" (of which {})", servers.join(", "))
        };
        format!(
            "the machine, every process, {:.1} µs{servers}",
            us(self.busy)
        )
    }
}

/// The busy ticks of `/proc/stat`'s `cpu` line: every column but idle and iowait.
fn busy_ticks(cpu_line: &str) -> Option<u64> {
    let mut f = cpu_line.split_whitespace();
    if f.next()? != "cpu" {
        return None;
    }
    let v: Vec<u64> = f.map(|x| x.parse().unwrap_or(0)).collect();
    if v.len() < 5 {
        return None;
    }
    // guest and guest_nice (columns 9 and 10) are already counted in user and nice.
    let all: u64 = v.iter().take(8).sum();
    Some(all - v[3] - v[4])
}

/// For a `postgres` or `nats-server` process's `/proc/<pid>/stat`: its name, start time and
/// user + system ticks.
fn server_ticks(stat: &str) -> Option<(&'static str, u64, u64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let name = match &stat[open + 1..close] {
        "postgres" => "postgres",
        "nats-server" => "nats-server",
        _ => return None,
    };
    // After the name: state is field 3; utime 14, stime 15, starttime 22 (1-based).
    let f: Vec<&str> = stat[close + 1..].split_whitespace().collect();
    let num = |i: usize| f.get(i - 3).and_then(|x| x.parse::<u64>().ok());
    Some((name, num(22)?, num(14)? + num(15)?))
}

/// CPU time (user + system) this process has used so far.
fn process_cpu() -> Duration {
    let mut u = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct it is given; RUSAGE_SELF cannot fail.
    let u = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, u.as_mut_ptr());
        u.assume_init()
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// What a phase cost PostgreSQL, from its own counters (`pg_current_wal_lsn()`,
/// `pg_stat_database`, `pg_stat_user_tables` of the phase's schema). The database counters
/// include anything else running on that database meanwhile.
#[derive(Debug, Default, Clone)]
pub struct PgCost {
    pub wal_bytes: i64,
    pub commits: i64,
    /// Per table of the schema: (table, inserted, updated, HOT-updated, deleted).
    pub tables: Vec<(String, i64, i64, i64, i64)>,
}

impl PgCost {
    async fn before(store: &Store) -> Result<(String, i64)> {
        let c = store.raw().await?;
        let r = c
            .query_one(
                "SELECT pg_current_wal_lsn()::text, xact_commit FROM pg_stat_database \
                 WHERE datname = current_database()",
                &[],
            )
            .await?;
        Ok((r.get(0), r.get(1)))
    }

    /// After the phase's connections closed (each flushes its counters as it ends).
    async fn after(store: &Store, before: (String, i64)) -> Result<PgCost> {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let c = store.raw().await?;
        c.batch_execute("SELECT pg_stat_clear_snapshot()").await?;
        let r = c
            .query_one(
                "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::text::pg_lsn)::int8, \
                 xact_commit FROM pg_stat_database WHERE datname = current_database()",
                &[&before.0],
            )
            .await?;
        let tables = c
            .query(
                "SELECT relname::text, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del \
                 FROM pg_stat_user_tables WHERE schemaname = current_schema() \
                   AND n_tup_ins + n_tup_upd + n_tup_del > 0 ORDER BY relname",
                &[],
            )
            .await?
            .into_iter()
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
            .collect();
        Ok(PgCost {
            wal_bytes: r.get(0),
            commits: r.get::<_, i64>(1) - before.1,
            tables,
        })
    }

    /// One line: "per job: 1.9 kB WAL, 0.05 commits; jobs +1.00 ins 1.00 upd (0 % HOT); …".
    pub fn per_job(&self, jobs: usize) -> String {
        let n = jobs.max(1) as f64;
        let mut parts = vec![format!(
            "{:.0} B WAL, {:.3} commits",
            self.wal_bytes as f64 / n,
            self.commits as f64 / n
        )];
        for (t, ins, upd, hot, del) in &self.tables {
            // Migrations and the worker's own row: not per-job costs.
            if ((ins + upd + del) as f64) < n / 100.0 {
                continue;
            }
            let mut p = format!("{t}: {:.2} ins", *ins as f64 / n);
            if *upd > 0 {
                p.push_str(&format!(
                    " {:.2} upd ({:.0} % HOT)",
                    *upd as f64 / n,
                    100.0 * *hot as f64 / *upd as f64
                ));
            }
            if *del > 0 {
                p.push_str(&format!(" {:.2} del", *del as f64 / n));
            }
            parts.push(p);
        }
        format!("per job: {}", parts.join("; "))
    }
}

async fn phase(
    base: &Config,
    args: &BenchArgs,
    http: Option<HandlerConfig>,
    phase: Phase,
    probe: Arc<Probe>,
) -> Result<PhaseResult> {
    probe.reset();
    let queue = QueueConfig {
        concurrency: args.concurrency,
        handler: Some(http.unwrap_or(HandlerConfig::Rust {
            name: "noop".into(),
        })),
        global_concurrency: args.global_concurrency,
        rate_limit: args.rate_limit,
        key_concurrency: args.key_concurrency,
        fair_by_key: args.fair_by_key,
        key_from: args
            .keys
            .map(|_| "payload:/k".parse().expect("a key_from the bench writes")),
        ..QueueConfig::default()
    };
    let (mut config, store, broker) = provisioned(base, "bench", "bench", queue).await?;
    config.worker.hostname = Some("bench".into());
    let p = probe.clone();
    let noop: Arc<dyn Handler> = from_fn(move |job| {
        p.started(job.payload.get("t").and_then(|t| t.as_i64()));
        async { Ok(None) }
    });
    let (n, rate) = match phase {
        Phase::Throughput(n) => (n, None),
        Phase::Latency(rate, n) => (n, Some(rate)),
    };
    let subject = broker.subject("bench");

    let cancel = CancellationToken::new();
    let result = if rate.is_none() {
        publish_keyed(&broker, &subject, n, None, args.keys, args.batch).await?;
        let counters = PgCost::before(&store).await?;
        let machine = MachineMark::now();
        let cpu = process_cpu();
        let worker = Worker::new(config.clone())
            .rust_handler("noop", noop)
            .start(cancel.clone())
            .await?;
        wait_completed(&worker.stats, n as u64, Duration::from_secs(600)).await?;
        let cpu = process_cpu() - cpu;
        let machine = machine.as_ref().and_then(MachineCpu::since);
        let elapsed = probe.since_first_start();
        let ahead = worker.stats.claimed_ahead.load(Ordering::Relaxed);
        let pulls = worker.stats.pulls.load(Ordering::Relaxed);
        let settles = worker.stats.settle_groups.load(Ordering::Relaxed);
        worker.shutdown().await;
        PhaseResult {
            jobs: n,
            elapsed,
            latencies_us: vec![],
            cost: PgCost::after(&store, counters).await.ok(),
            cpu,
            machine,
            ahead,
            pulls,
            settles,
        }
    } else {
        let worker = Worker::new(config.clone())
            .rust_handler("noop", noop)
            .start(cancel.clone())
            .await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let started = Instant::now();
        publish_keyed(&broker, &subject, n, rate, args.keys, args.batch).await?;
        wait_completed(&worker.stats, n as u64, Duration::from_secs(600)).await?;
        let elapsed = started.elapsed();
        worker.shutdown().await;
        PhaseResult {
            jobs: n,
            elapsed,
            latencies_us: probe.sorted_latencies(),
            cost: None,
            cpu: Duration::ZERO,
            machine: None,
            ahead: 0,
            pulls: 0,
            settles: 0,
        }
    };
    let _ = broker.js.delete_stream(&config.nats.stream).await;
    store.drop_schema().await?;
    Ok(result)
}

/// A bench run's own configuration (schema, stream and subject prefix named `prefix-…`,
/// local API and ops ports picked free) with one queue `queue`, and its store and broker with
/// the schema migrated and the stream and queue's consumer provisioned — so messages
/// published before a worker starts are kept.
pub async fn provisioned(
    base: &Config,
    prefix: &str,
    queue: &str,
    policy: QueueConfig,
) -> Result<(Config, Store, Broker)> {
    let name = crate::testkit::unique_name(prefix);
    let mut config = base.clone();
    config.database.schema = name.clone();
    config.nats.stream = name.to_uppercase();
    config.nats.subject_prefix = name;
    config.worker.api_listen = "127.0.0.1:0".parse().expect("an address");
    config.worker.ops_listen = "127.0.0.1:0".parse().expect("an address");
    config.queues.insert(queue.into(), policy);
    config.validate()?;
    let store = Store::connect(&config.database).await?;
    store.migrate().await?;
    let broker = Broker::connect(&config.nats).await?;
    broker.provision_stream().await?;
    broker
        .provision_consumer(&jobwarden::broker::Lane::bare(queue))
        .await?;
    Ok((config, store, broker))
}

/// Publishes `n` plain-object jobs carrying their publish time; paced at `rate`/s if given
/// (publish acks are awaited while there is time before the next one is due, so the pace
/// holds at high rates).
pub async fn publish(broker: &Broker, subject: &str, n: usize, rate: Option<u64>) -> Result<()> {
    publish_keyed(broker, subject, n, rate, None, false).await
}

/// [`publish`], each job's payload carrying key `i mod keys` as `"k"` (when `keys` is given),
/// every job a member of one batch of `n` (when `batch`).
pub async fn publish_keyed(
    broker: &Broker,
    subject: &str,
    n: usize,
    rate: Option<u64>,
    keys: Option<usize>,
    batch: bool,
) -> Result<()> {
    let batch_id = format!("bench-{:016x}", rand::random::<u64>());
    let started = Instant::now();
    let mut acks: Vec<async_nats::jetstream::context::PublishAckFuture> = Vec::with_capacity(1024);
    for i in 0..n {
        if let Some(r) = rate {
            let due = started + Duration::from_secs_f64(i as f64 / r as f64);
            if due > Instant::now() {
                for a in acks.drain(..) {
                    a.await.context("publish ack")?;
                }
                tokio::time::sleep_until(due.into()).await;
            }
        }
        let payload = match keys {
            Some(k) => json!({"t": now_micros(), "i": i, "k": i % k.max(1)}),
            None => json!({"t": now_micros(), "i": i}),
        };
        let body = if batch {
            serde_json::to_vec(&json!({"payload": payload, "batch": {"id": batch_id, "size": n}}))?
        } else {
            serde_json::to_vec(&payload)?
        };
        acks.push(
            broker
                .js
                .publish(subject.to_string(), body.into())
                .await
                .context("publish")?,
        );
        if acks.len() >= 1000 {
            for a in acks.drain(..) {
                a.await.context("publish ack")?;
            }
        }
    }
    for a in acks {
        a.await.context("publish ack")?;
    }
    Ok(())
}

/// A `jobwarden run` process on `config` (written to a temp file, its secrets redacted; the
/// real URLs of the servers go in its environment).
struct WorkerProcess {
    child: std::process::Child,
    path: std::path::PathBuf,
}

impl WorkerProcess {
    fn start(base: &Config, config: &Config) -> Result<WorkerProcess> {
        let path = std::env::temp_dir().join(format!("{}.toml", config.database.schema));
        std::fs::write(&path, config.to_redacted_toml())?;
        let child = std::process::Command::new(std::env::current_exe()?)
            .args(["--config", path.to_str().expect("utf-8"), "run"])
            .env("JOBWARDEN_DATABASE__URL", &base.database.url)
            .env("JOBWARDEN_NATS__URL", &base.nats.url)
            .env("JOBWARDEN_WORKER__HOSTNAME", "bench-process")
            .env("RUST_LOG", "error")
            .stdin(std::process::Stdio::null())
            .spawn()
            .context("starting a worker process")?;
        Ok(WorkerProcess { child, path })
    }

    /// SIGTERM, then waits for it to exit.
    fn stop(mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Enqueues `n` jobs through SQL in one transaction (as plain members of `enqueue_many()`, or
/// as one batch), then drains them through a `jobwarden run` process (the HTTP handler, to
/// the no-op app at `url`): prints the enqueue time and the drain's throughput, counted from
/// the process's start until every job has completed (and, for the batch, its callback ran).
async fn sql_drain(
    base: &Config,
    url: &str,
    n: usize,
    concurrency: usize,
    batch: bool,
) -> Result<()> {
    use jobwarden::client::{Batch, BulkJob, Client};
    let policy = QueueConfig {
        concurrency,
        handler: Some(HandlerConfig::Http { url: url.into() }),
        ..QueueConfig::default()
    };
    let (config, store, broker) = provisioned(base, "benchs", "bench", policy).await?;
    let client = Client::new(store.clone(), broker.clone());
    let jobs: Vec<BulkJob> = (0..n)
        .map(|i| BulkJob::new("bench", json!({ "i": i }), Default::default()))
        .collect();
    let enqueued = Instant::now();
    {
        let mut conn = store.raw().await?;
        let tx = conn.transaction().await?;
        if batch {
            for chunk in jobs.chunks(jobwarden::contract::MAX_ENQUEUE_MANY) {
                let b = Batch {
                    id: None,
                    jobs: chunk.to_vec(),
                    on_complete: Some(BulkJob::new(
                        "bench",
                        json!({"callback": true}),
                        Default::default(),
                    )),
                    on_success: None,
                };
                client.enqueue_batch_in(&*tx, &b).await?;
            }
        } else {
            for chunk in jobs.chunks(10_000) {
                client.enqueue_many_in(&*tx, chunk).await?;
            }
        }
        tx.commit().await?;
    }
    let enqueue_took = enqueued.elapsed();
    // The callback(s) of the batch are jobs too.
    let total = if batch {
        n + n.div_ceil(jobwarden::contract::MAX_ENQUEUE_MANY)
    } else {
        n
    };
    let mut process = WorkerProcess::start(base, &config)?;
    let child = &mut process.child;
    let started = Instant::now();
    let db = store.raw().await?;
    let result = loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if let Ok(Some(status)) = child.try_wait() {
            break Err(anyhow::anyhow!("the worker process exited: {status}"));
        }
        let done: i64 = db
            .query_one("SELECT count(*) FROM jobs WHERE status = 'completed'", &[])
            .await?
            .get(0);
        if done as usize >= total {
            break Ok(started.elapsed());
        }
        if started.elapsed() > Duration::from_secs(3600) {
            break Err(anyhow::anyhow!(
                "{done} of {total} jobs done within an hour"
            ));
        }
    };
    process.stop();
    drop(db);
    let _ = broker.js.delete_stream(&config.nats.stream).await;
    store.drop_schema().await?;
    let took = result?;
    println!(
        "{n} jobs enqueued through SQL {} in one transaction in {:.2}s ({:.0} jobs/s); drained \
         through `jobwarden run` (http handler, {concurrency} slots) in {:.2}s: {:.0} jobs/s",
        if batch {
            "as one batch (enqueue_batch, an on_complete callback)"
        } else {
            "(enqueue_many)"
        },
        enqueue_took.as_secs_f64(),
        n as f64 / enqueue_took.as_secs_f64(),
        took.as_secs_f64(),
        total as f64 / took.as_secs_f64(),
    );
    Ok(())
}

/// Runs `n` jobs through a `jobwarden run` process (the HTTP handler, to the local no-op app
/// at `url`) and prints its throughput and its own peak RSS — the worker alone, as deployed.
/// With `sample`, the jobs wait as a backlog first and the process's RSS is read every 250 ms
/// as it drains them (is memory flat under a large backlog?).
async fn worker_process(
    base: &Config,
    url: &str,
    n: usize,
    concurrency: usize,
    sample: bool,
) -> Result<()> {
    let policy = QueueConfig {
        concurrency,
        handler: Some(HandlerConfig::Http { url: url.into() }),
        ..QueueConfig::default()
    };
    let (config, store, broker) = provisioned(base, "benchp", "bench", policy).await?;
    let subject = broker.subject("bench");
    let published = Instant::now();
    publish(&broker, &subject, n, None).await?;
    let publish_took = published.elapsed();
    let mut process = WorkerProcess::start(base, &config)?;
    let child = &mut process.child;
    let pid = child.id().to_string();
    let mut stream = broker.stream().await?;
    let started = Instant::now();
    // (jobs done, RSS MiB) samples.
    let mut samples: Vec<(u64, f64)> = Vec::new();
    let result = loop {
        tokio::time::sleep(Duration::from_millis(if sample { 250 } else { 20 })).await;
        if let Ok(Some(status)) = child.try_wait() {
            break Err(anyhow::anyhow!("the worker process exited: {status}"));
        }
        // Work-queue retention: a message is gone once acked, and it is acked only after
        // its job's completion committed.
        let Ok(info) = stream.info().await else {
            continue;
        };
        let left = info.state.messages;
        let done = (n as u64).saturating_sub(left);
        if sample {
            samples.push((done, proc_status_mib(&pid, "VmRSS:")));
        }
        if left == 0 {
            break Ok(started.elapsed());
        }
        if started.elapsed() > Duration::from_secs(3600) {
            break Err(anyhow::anyhow!("{done} of {n} jobs done within an hour"));
        }
    };
    let peak = proc_status_mib(&pid, "VmHWM:");
    process.stop();
    let _ = broker.js.delete_stream(&config.nats.stream).await;
    store.drop_schema().await?;
    let took = result?;
    if sample {
        let at = |share: f64| {
            samples
                .iter()
                .find(|(d, _)| *d as f64 >= share * n as f64)
                .map(|(_, r)| format!("{r:.1}"))
                .unwrap_or_else(|| "-".into())
        };
        println!(
            "backlog of {n} jobs (published in {:.1}s) through `jobwarden run`, http handler, {concurrency} slots: {:.0} jobs/s; worker RSS at 1 % / 25 % / 50 % / 75 % / 99 % done: {} / {} / {} / {} / {} MiB, max {peak:.1} MiB",
            publish_took.as_secs_f64(),
            n as f64 / took.as_secs_f64(),
            at(0.01),
            at(0.25),
            at(0.5),
            at(0.75),
            at(0.99),
        );
    } else {
        println!(
            "worker alone (`jobwarden run` process, http handler, {concurrency} slots, {n} jobs): max RSS {peak:.1} MiB, {:.0} jobs/s including its start-up",
            n as f64 / took.as_secs_f64(),
        );
    }
    Ok(())
}

pub async fn wait_completed(stats: &Stats, n: u64, limit: Duration) -> Result<()> {
    let started = Instant::now();
    while Stats::get(&stats.completed) < n {
        if started.elapsed() > limit {
            anyhow::bail!(
                "only {} of {n} jobs completed within {limit:?}",
                Stats::get(&stats.completed)
            );
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(())
}

/// A local no-op application for the HTTP handler: records the job's publish-to-start latency
/// and answers 200.
struct NoopApp {
    url: String,
    _task: tokio::task::JoinHandle<()>,
}

impl NoopApp {
    async fn start(probe: Arc<Probe>) -> Result<NoopApp> {
        let app = axum::Router::new().route(
            "/jobs",
            axum::routing::post(move |body: axum::body::Bytes| {
                let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                probe.started(v["payload"]["t"].as_i64());
                async { axum::http::StatusCode::OK }
            }),
        );
        let (url, task) = serve_local(app).await?;
        Ok(NoopApp { url, _task: task })
    }
}

/// Serves a local application (with a `POST /jobs` route) on a free loopback port; returns
/// the handler URL and the server task.
///
/// Its listen backlog is 1,024, as application servers set theirs (gunicorn and uvicorn
/// 2,048, Go the system's maximum): with Rust's and tokio's default of 128, a worker that
/// opens hundreds of connections at once overflows it, and every dropped SYN costs its
/// request a one-second retransmit (seen in the bench as `ListenOverflows` in `nstat`).
pub async fn serve_local(app: axum::Router) -> Result<(String, tokio::task::JoinHandle<()>)> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind((std::net::Ipv4Addr::LOCALHOST, 0).into())?;
    let listener = socket.listen(1024)?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((format!("http://{addr}/jobs"), task))
}

#[cfg(test)]
mod tests {
    #[test]
    fn percentiles() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(super::percentile(&v, 50.0), 51);
        assert_eq!(super::percentile(&v, 99.0), 99);
        assert_eq!(super::percentile(&v, 100.0), 100);
        assert_eq!(super::percentile(&[], 50.0), 0);
    }

    #[test]
    fn machine_cpu_is_read_from_procs_own_lines() {
        // user nice system idle iowait irq softirq steal guest guest_nice
        let line = "cpu  100 5 50 1000 20 3 2 0 40 0";
        assert_eq!(super::busy_ticks(line), Some(160));
        assert_eq!(super::busy_ticks("cpu0 1 2 3 4 5"), None);
        // A backend's name is `postgres`; the command line (`postgres: user db ...`) is not
        // in stat. A name with a space and a parenthesis is split at the last one.
        let pg =
            "4242 (postgres) S 4000 4242 4242 0 -1 4194560 90 0 0 0 123 45 0 0 20 0 1 0 777 0 0";
        assert_eq!(super::server_ticks(pg), Some(("postgres", 777, 168)));
        let nats = "17 (nats-server) S 1 17 17 0 -1 0 0 0 0 0 7 3 0 0 20 0 9 0 55 0 0";
        assert_eq!(super::server_ticks(nats), Some(("nats-server", 55, 10)));
        let other = "18 (odd) name) S 1 17 17 0 -1 0 0 0 0 0 7 3 0 0 20 0 9 0 55 0 0";
        assert_eq!(super::server_ticks(other), None);
    }
}
