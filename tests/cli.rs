//! The `jobwarden` binary: bad configuration, bad arguments and unreachable servers get clear
//! messages and the right exit codes; enqueue and inspect work against real servers.

mod common;

use common::{test_database_url, text, TestEnv};
use std::io::Read;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

fn jobwarden(args: &[&str], envs: &[(&str, &str)]) -> Output {
    common::run_cli(args, envs)
}

fn write_config(body: &str) -> tempfile_path::TempPath {
    tempfile_path::TempPath::with(body)
}

/// A tiny temp-file helper (no extra crate): removed on drop.
mod tempfile_path {
    pub struct TempPath(pub std::path::PathBuf);
    impl TempPath {
        pub fn with(body: &str) -> TempPath {
            let p = std::env::temp_dir().join(format!(
                "jobwarden-test-{}-{:08x}.toml",
                std::process::id(),
                rand::random::<u32>()
            ));
            std::fs::write(&p, body).unwrap();
            TempPath(p)
        }
        pub fn as_str(&self) -> &str {
            self.0.to_str().unwrap()
        }
    }
    impl Drop for TempPath {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

#[test]
fn config_check_lists_every_error_and_exits_2() {
    let cfg = write_config(
        r#"
        [nats]
        ack_wait = "1m"
        [queues.email]
        concurrency = 0
        handler = { kind = "http", url = "ftp://x" }
        [queues.pdf]
        handler = { kind = "exec", command = [] }
        "#,
    );
    let out = jobwarden(&["--config", cfg.as_str(), "config", "check"], &[]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(2), "{t}");
    assert!(t.contains("nats.ack_wait (1m) must be greater than worker.stale_after (5m) + worker.sweep_every (30s)"), "{t}");
    assert!(t.contains("queues.email.concurrency (0)"), "{t}");
    assert!(t.contains("must start with http://"), "{t}");
    assert!(t.contains("queues.pdf.handler.command is empty"), "{t}");
}

#[test]
fn config_check_prints_the_effective_config_with_secrets_redacted() {
    let cfg = write_config(
        r#"
        [database]
        url = "postgres://app:s3cret@db.internal:5432/jobs"
        [queues.email]
        handler = { kind = "http", url = "http://127.0.0.1:8080/jobs" }
        "#,
    );
    let out = jobwarden(
        &["--config", cfg.as_str(), "config", "check"],
        &[("JOBWARDEN_QUEUES__EMAIL__CONCURRENCY", "7")],
    );
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    assert!(!t.contains("s3cret"), "{t}");
    assert!(
        t.contains("postgres://app:****@db.internal:5432/jobs"),
        "{t}"
    );
    assert!(t.contains("concurrency = 7"), "env override applied: {t}");
}

/// `cron list --next` is bounded: a huge count is an argument error, not minutes of work and
/// gigabytes of memory.
#[test]
fn cron_list_refuses_a_count_of_next_fires_out_of_range() {
    for n in ["100000000", "0"] {
        let out = jobwarden(&["cron", "list", "--next", n], &[]);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert!(text(&out).contains("1..=100"), "{}", text(&out));
    }
}

#[test]
fn bad_arguments_and_files_exit_2_with_the_fix() {
    let out = jobwarden(
        &["--config", "/nonexistent/jobwarden.toml", "config", "check"],
        &[],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains("does not exist"), "{}", text(&out));
    let out = jobwarden(&["enqueue", "email"], &[]);
    assert_eq!(out.status.code(), Some(2), "clap rejects a missing payload");
    let out = jobwarden(&["enqueue", "email", "{}", "--delay", "soon"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains("--delay"), "{}", text(&out));
    let out = jobwarden(&["frobnicate"], &[]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn unreachable_postgres_is_named_in_the_error() {
    let out = jobwarden(
        &["migrate"],
        &[(
            "JOBWARDEN_DATABASE__URL",
            "postgres://postgres@127.0.0.1:1/nowhere",
        )],
    );
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(
        t.contains("PostgreSQL at 127.0.0.1:1/nowhere is unreachable"),
        "{t}"
    );
}

#[test]
fn a_database_that_refuses_the_connection_is_named_with_its_reason() {
    let url = test_database_url();
    let base = url.rsplit_once('/').map(|(b, _)| b).unwrap_or(&url);
    let out = jobwarden(
        &["jobs", "list"],
        &[(
            "JOBWARDEN_DATABASE__URL",
            &format!("{base}/no_such_database_jw"),
        )],
    );
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(
        t.contains("database \"no_such_database_jw\" does not exist"),
        "the server's reason is hidden: {t}"
    );
}

#[test]
fn run_keeps_retrying_unreachable_servers_and_stops_on_sigterm() {
    let cfg = write_config(
        r#"
        [database]
        url = "postgres://postgres@127.0.0.1:1/nowhere"
        [worker]
        api_listen = "127.0.0.1:0"
        ops_listen = "127.0.0.1:0"
        [queues.email]
        handler = { kind = "http", url = "http://127.0.0.1:8080/jobs" }
        "#,
    );
    let mut child = Command::new(env!("CARGO_BIN_EXE_jobwarden"))
        .args(["--config", cfg.as_str(), "run"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        child.try_wait().unwrap().is_none(),
        "run must not exit while retrying"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(
        err.contains("PostgreSQL not available") && err.contains("127.0.0.1:1/nowhere"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[tokio::test]
async fn enqueue_then_show_and_list() {
    let env = TestEnv::new("[queues.email]\nhandler = { kind = \"rust\", name = \"h\" }\n").await;
    let envs = [
        ("JOBWARDEN_DATABASE__URL", test_database_url()),
        (
            "JOBWARDEN_DATABASE__SCHEMA",
            env.config.database.schema.clone(),
        ),
        ("JOBWARDEN_NATS__URL", env.nats.url()),
    ];
    let envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let out = jobwarden(
        &[
            "enqueue",
            "email",
            r#"{"to":"a@example.com"}"#,
            "--id",
            "cli-1",
            "--priority",
            "2",
        ],
        &envs,
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("cli-1 queued"), "{}", text(&out));
    let out = jobwarden(
        &[
            "enqueue",
            "email",
            r#"{"to":"a@example.com"}"#,
            "--id",
            "cli-1",
        ],
        &envs,
    );
    assert!(text(&out).contains("already enqueued"), "{}", text(&out));
    let out = jobwarden(&["enqueue", "email", "not json"], &envs);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out).contains("payload is not valid JSON"),
        "{}",
        text(&out)
    );
    // A timeout no worker would accept (messages carry at most 7 days) is refused before
    // anything is stored, rather than stored and then rejected as an invalid message.
    let out = jobwarden(
        &[
            "enqueue",
            "email",
            "{}",
            "--id",
            "cli-8d",
            "--timeout",
            "8d",
        ],
        &envs,
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains(
            "--timeout: field `timeout_ms` is invalid: 691200000 is not a whole number from 1 to 604800000"
        ),
        "{}",
        text(&out)
    );
    assert_eq!(env.status_of("cli-8d").await, None, "nothing stored");

    // The message reached the stream: a worker runs it.
    let worker = env
        .worker(&[("h", jobwarden::handler::from_fn(|_j| async { Ok(None) }))])
        .await;
    assert!(env.wait_status("cli-1", "completed", 10).await);
    worker.shutdown().await;

    let out = jobwarden(&["jobs", "show", "cli-1"], &envs);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    assert!(t.contains("status:        completed"), "{t}");
    assert!(t.contains("priority:      2"), "{t}");
    assert!(t.contains("#1 "), "attempt listed: {t}");
    let out = jobwarden(&["jobs", "list", "--status", "completed", "--json"], &envs);
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rows[0]["id"], "cli-1");
    let out = jobwarden(&["jobs", "show", "missing"], &envs);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out).contains("no job with id \"missing\""),
        "{}",
        text(&out)
    );
    let out = jobwarden(&["jobs", "list", "--status", "running"], &envs);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains("use one of queued"), "{}", text(&out));
}

/// The number in a line of the demo's output: the first whole number after `after`.
fn number_after(out: &str, after: &str) -> Option<u64> {
    let rest = &out[out.find(after)? + after.len()..];
    let digits: String = rest
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits.parse().ok()
}

/// `jobwarden demo`, as the README runs it (throwaway servers, three workers, one killed with
/// `kill -9` and restarted): it finishes, every published job ends, and what it says about the
/// crash agrees with the attempts table it prints — the jobs it says were taken back at the
/// restart are the `restarted` attempts.
#[test]
fn the_demo_runs_its_crash_and_reports_it_as_the_attempts_table_records_it() {
    let out = jobwarden(&["demo"], &[("RUST_LOG", "error")]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    assert!(t.contains("CRASH: kill -9 demo-1"), "{t}");
    assert!(t.contains("all 600 jobs reached a final state"), "{t}");
    // The per-queue table: completed and dead add up to every job published.
    let table = &t[t.find("final counts per queue:").expect("the table")..];
    let ended: u64 = ["email", "webhooks", "pdf", "images"]
        .iter()
        .map(|q| {
            let line = table
                .lines()
                .find(|l| l.trim_start().starts_with(q))
                .unwrap_or_else(|| panic!("a row for {q}: {t}"));
            let n: Vec<u64> = line
                .split_whitespace()
                .skip(1)
                .map(|c| c.parse().expect("a count"))
                .collect();
            assert_eq!(n[..3], [0, 0, 0], "{q} has jobs left: {line}");
            n[3] + n[4]
        })
        .sum();
    assert_eq!(ended, 600, "{t}");
    let summary = t
        .lines()
        .find(|l| l.contains(" jobs demo-1 "))
        .unwrap_or_else(|| panic!("the crash's summary: {t}"));
    let said = number_after(summary, "the ").expect("a count in the crash's summary");
    let outcomes = &t[t.find("why attempts ended").expect("the outcomes")..];
    let restarted = number_after(outcomes, "restarted").unwrap_or(0);
    assert!(
        restarted >= 1,
        "the killed worker's jobs were taken back: {t}"
    );
    assert_eq!(
        said, restarted,
        "the summary's count of jobs taken back at the restart is the attempts table's: {t}"
    );
}
