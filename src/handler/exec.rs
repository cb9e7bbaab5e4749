//! The `exec` handler: run a command per job.
//!
//! The payload goes to stdin as JSON, job details go in the environment (`JOB_ID`,
//! `JOB_ATTEMPT`…, and `JOB_PARENTS`: the results of the jobs it follows, as JSON), progress
//! comes back as JSON lines on stdout
//! (`{"progress":0.4,"stage":"clone"}`), and a `{"result":…}` line sets the job's result.
//! Exit 0 succeeds, [`EXIT_PERMANENT`] (65, `EX_DATAERR`) fails for good,
//! [`EXIT_DEFERRED`] (202) after a `{"defer":"10m"}` line defers the job (it awaits a
//! completion from outside with `JOB_COMPLETION_TOKEN`), anything else is retried. The command runs in its own process group so that on timeout or cancellation
//! the whole tree can be stopped: SIGTERM, [`KILL_GRACE`], then SIGKILL.

use super::{Handler, HandlerResult, JobContext, JobError, Progress};
use async_trait::async_trait;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde_json::Value;
use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

/// Exit code meaning "this job can never succeed" (`EX_DATAERR` from sysexits.h).
pub const EXIT_PERMANENT: i32 = 65;
/// Exit code meaning "accepted, the outcome will be reported from outside" (HTTP's `202`):
/// the command printed `{"defer": "<deadline>"}` on stdout, and the job awaits a completion
/// or failure with its `JOB_COMPLETION_TOKEN` until then (see [`crate::completion`]).
pub const EXIT_DEFERRED: i32 = 202;
/// Time between SIGTERM and SIGKILL when a command must stop.
pub const KILL_GRACE: Duration = Duration::from_secs(5);
/// How much of stderr is kept for the error message.
const STDERR_TAIL: usize = 4096;
/// Longest stdout line looked at (a `{"result":…}` line can be big); longer lines are cut
/// into pieces that parse as nothing, so stray binary output cannot eat memory.
const MAX_LINE: u64 = 4 << 20;
/// After the command exits, how long the rest of its stdout and stderr may take to arrive.
const DRAIN_GRACE: Duration = Duration::from_millis(500);

/// Runs `program args…` for each job.
pub struct ExecHandler {
    program: String,
    args: Vec<String>,
    env: BTreeMap<String, String>,
    /// The values of `env` whose names say they are secrets: scrubbed from what the command
    /// prints before it becomes an attempt's error (stored, logged, shown on the dashboard).
    secrets: crate::redact::Secrets,
    /// [`KILL_GRACE`], shortened by tests.
    grace: Duration,
}

impl ExecHandler {
    pub fn new(command: &[String], env: &BTreeMap<String, String>) -> ExecHandler {
        let (program, args) = match command.split_first() {
            Some((p, a)) => (p.clone(), a.to_vec()),
            None => (String::new(), Vec::new()), // fails at spawn, with the usual hint
        };
        let env = env.clone();
        let mut secrets = crate::redact::Secrets::default();
        for (name, value) in &env {
            if crate::redact::is_secret_name(name) {
                secrets.add(value);
            }
        }
        ExecHandler {
            program,
            args,
            env,
            secrets,
            grace: KILL_GRACE,
        }
    }

    fn command(&self, job: &JobContext) -> Command {
        let mut cmd = Command::new(&self.program);
        // The sidecar's own settings (database and NATS credentials) are not the job's.
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("JOBWARDEN_") && key != "JOBWARDEN_API" {
                cmd.env_remove(key);
            }
        }
        cmd.args(&self.args)
            .envs(&self.env)
            .env("JOB_ID", &job.id)
            .env("JOB_QUEUE", &job.queue)
            .env("JOB_ATTEMPT", job.attempt.to_string())
            .env("JOB_WORKER", &job.worker_id)
            .env("JOB_MAX_ATTEMPTS", job.max_attempts.to_string())
            .env("JOBWARDEN_API", &job.api_base)
            .env("JOB_PROGRESS_URL", job.progress_url())
            .env("JOB_COMPLETION_TOKEN", job.completion_token())
            .process_group(0) // its own group, id = its pid
            .kill_on_drop(true)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(tp) = &job.traceparent {
            cmd.env("TRACEPARENT", tp);
        }
        // The results of the jobs it follows, as JSON (at most 64 KiB of results: well
        // within the 128 KiB an environment variable may hold).
        match &job.parents {
            Some(p) => cmd.env("JOB_PARENTS", p.to_string()),
            None => cmd.env_remove("JOB_PARENTS"),
        };
        cmd
    }

    /// SIGTERM to the group, up to `grace` for all of it to exit, then SIGKILL; the child is
    /// always reaped. The leader is not reaped before the first signal, so `pgid` still
    /// names our group.
    async fn terminate(&self, child: &mut Child, pgid: Pid, grace: Duration) {
        let _ = killpg(pgid, Signal::SIGTERM);
        let all_gone = async {
            let _ = child.wait().await;
            while group_running(pgid) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        let _ = tokio::time::timeout(grace, all_gone).await;
        let _ = killpg(pgid, Signal::SIGKILL);
        let _ = child.wait().await;
    }
}

/// SIGKILLs what is left of the group when dropped: after a normal exit (background
/// processes must not outlive their job), and when the handler's future is dropped
/// mid-run (`kill_on_drop` only reaches the leader). Once the leader is reaped its pid
/// could in theory be reused, but not as a group id while any member lives, and an empty
/// group gives ESRCH.
struct GroupGuard(Pid);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        let _ = killpg(self.0, Signal::SIGKILL);
    }
}

#[async_trait]
impl Handler for ExecHandler {
    /// The command's process group is terminated at `job.timeout` (plus up to [`KILL_GRACE`]).
    fn enforces_timeout(&self) -> bool {
        true
    }

    async fn handle(&self, job: &JobContext) -> HandlerResult {
        if job.cancel.is_cancelled() {
            return Err(JobError::retry("cancelled"));
        }
        let mut child = self.command(job).spawn().map_err(|e| {
            // Retry, not permanent: operators fix a wrong `handler.command`, and the jobs
            // that arrived meanwhile must still run then.
            JobError::retry(format!(
                "cannot run {:?}: {e}; not found or not executable, check handler.command",
                self.program
            ))
        })?;
        let pgid = Pid::from_raw(child.id().expect("an unreaped child has a pid") as i32);
        let guard = GroupGuard(pgid);

        // One task per pipe, so that none of them can fill up and block the command.
        let payload = serde_json::to_vec(&job.payload).unwrap_or_default();
        let mut stdin = child.stdin.take().expect("stdin is piped");
        let stdin_task = tokio::spawn(async move {
            // EPIPE if the command does not read its stdin: fine. Dropping closes it.
            let _ = stdin.write_all(&payload).await;
        });
        let mut stderr_task = tokio::spawn(keep_tail(child.stderr.take().expect("piped")));
        // Bounded: while progress reports are slow, the command waits on its stdout.
        let (tx, rx) = mpsc::channel(16);
        let mut stdout_task = tokio::spawn(read_lines(child.stdout.take().expect("piped"), tx));

        let ran = tokio::select! {
            r = drive(&mut child, rx, job) => r,
            _ = tokio::time::sleep(job.timeout) => Err(format!(
                "timed out after {}",
                humantime::format_duration(job.timeout)
            )),
            _ = job.cancel.cancelled() => Err("cancelled".to_string()),
        };
        let outcome = match ran {
            Ok(status) => {
                // Leftovers die, so the pipes reach EOF. The result line is usually among
                // the last ones and may still be in the pipe.
                drop(guard);
                let (result, tail) = tokio::join!(
                    tokio::time::timeout(DRAIN_GRACE, &mut stdout_task),
                    tokio::time::timeout(DRAIN_GRACE, &mut stderr_task),
                );
                let lines = result.ok().and_then(Result::ok).unwrap_or_default();
                let tail = tail.ok().and_then(Result::ok).unwrap_or_default();
                let tail = crate::redact::known(&self.secrets.scrub(&tail)).into_owned();
                match (status.code(), lines.defer) {
                    (Some(EXIT_DEFERRED), Some(deadline)) => {
                        match crate::completion::parse_deadline(&deadline) {
                            Ok(d) => job.defer(d),
                            Err(e) => {
                                Err(JobError::retry(format!("exit code {EXIT_DEFERRED}: {e}")))
                            }
                        }
                    }
                    (Some(EXIT_DEFERRED), None) => Err(JobError::retry(format!(
                        "exit code {EXIT_DEFERRED} defers the job, but the command printed no \
                         deadline: print a {{\"defer\": \"10m\"}} line on stdout before exiting"
                    ))),
                    _ => exit_outcome(status, lines.result, &tail),
                }
            }
            Err(message) => {
                // A lost attempt (the job may run elsewhere soon) gets a shorter grace.
                let grace = self.grace.min(job.control.kill_grace());
                self.terminate(&mut child, pgid, grace).await;
                Err(JobError::retry(message))
            }
        };
        stderr_task.abort();
        stdin_task.abort();
        stdout_task.abort();
        outcome
    }
}

/// Whether any process of the group is still running. Zombies do not count: an orphaned
/// member stays one until pid 1 reaps it, which some container inits do lazily, and that
/// would keep a plain `killpg(pgid, 0)` succeeding for the whole grace period.
fn group_running(pgid: Pid) -> bool {
    if killpg(pgid, None).is_err() {
        return false; // ESRCH: not even a zombie left
    }
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return true; // no procfs: trust the signal
    };
    let pgid = pgid.as_raw().to_string();
    procs.filter_map(Result::ok).any(|entry| {
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        // `pid (comm) state ppid pgrp …`; comm may contain anything: cut at the last ')'.
        let mut fields = stat
            .rsplit_once(')')
            .map_or("", |(_, r)| r)
            .split_whitespace();
        let (state, pgrp) = (fields.next(), fields.nth(1));
        state.is_some_and(|s| s != "Z") && pgrp == Some(pgid.as_str())
    })
}

/// Reports progress until the command exits. `Err` says why the attempt must stop.
async fn drive(
    child: &mut Child,
    mut progress: mpsc::Receiver<Progress>,
    job: &JobContext,
) -> Result<ExitStatus, String> {
    loop {
        tokio::select! {
            Some(p) = progress.recv() => {
                job.progress(p).await.map_err(|_| "ownership lost".to_string())?
            }
            status = child.wait() => {
                let status = status.map_err(|e| format!("waiting failed: {e}"))?;
                // Reports written just before the exit may still be in the pipe: apply them,
                // in order, so the row shows the latest one.
                let _ = tokio::time::timeout(DRAIN_GRACE, async {
                    while let Some(p) = progress.recv().await {
                        if job.progress(p).await.is_err() {
                            break;
                        }
                    }
                })
                .await;
                return Ok(status);
            }
        }
    }
}

fn exit_outcome(status: ExitStatus, result: Option<Value>, stderr: &str) -> HandlerResult {
    let head = match (status.code(), status.signal()) {
        (Some(0), _) => return Ok(result),
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(sig)) => match Signal::try_from(sig) {
            Ok(s) => format!("killed by signal {}", s.as_str()),
            Err(_) => format!("killed by signal {sig}"),
        },
        (None, None) => format!("ended with {status}"),
    };
    let sep = if stderr.is_empty() { "" } else { ": " };
    let message = format!("{head}{sep}{stderr}");
    match status.code() {
        Some(EXIT_PERMANENT) => Err(JobError::Permanent(message)),
        _ => Err(JobError::retry(message)),
    }
}

/// What a command's stdout said besides progress.
#[derive(Debug, Default)]
struct Lines {
    /// The last `{"result": …}`.
    result: Option<Value>,
    /// The last `{"defer": "<deadline>"}` (a string, or a number of seconds).
    defer: Option<String>,
}

/// Reads stdout line by line: a non-empty object with only `progress`/`stage`/`message`
/// keys goes to `progress`; the last `{"result": …}` and `{"defer": …}` (each that key alone)
/// are returned; other lines are plain output.
async fn read_lines(out: impl AsyncRead + Unpin, progress: mpsc::Sender<Progress>) -> Lines {
    let (mut out, mut buf, mut lines) = (BufReader::new(out), Vec::new(), Lines::default());
    loop {
        buf.clear();
        match (&mut out).take(MAX_LINE).read_until(b'\n', &mut buf).await {
            Ok(0) | Err(_) => return lines,
            Ok(_) => {}
        }
        let report = match serde_json::from_slice::<Value>(&buf) {
            Ok(Value::Object(mut o)) if o.len() == 1 && o.contains_key("result") => {
                lines.result = o.remove("result");
                continue;
            }
            Ok(Value::Object(o)) if o.len() == 1 && o.contains_key("defer") => {
                lines.defer = o.get("defer").map(|d| match d {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                });
                continue;
            }
            // `Progress` denies unknown fields.
            Ok(v) if v.as_object().is_some_and(|o| !o.is_empty()) => serde_json::from_value(v).ok(),
            _ => None,
        };
        match report {
            // Fails once the command has exited (nobody listens): keep reading for the result.
            Some(p) => drop(progress.send(p).await),
            None => {
                tracing::debug!(line = %String::from_utf8_lossy(&buf).trim_end(), "exec: stdout")
            }
        }
    }
}

/// Reads `err` to EOF, keeping the last [`STDERR_TAIL`] bytes.
async fn keep_tail(mut err: impl AsyncRead + Unpin) -> String {
    let (mut tail, mut chunk) = (Vec::new(), [0u8; 8192]);
    while let Ok(n @ 1..) = err.read(&mut chunk).await {
        tail.extend_from_slice(&chunk[..n]);
        if tail.len() > 2 * STDERR_TAIL {
            tail.drain(..tail.len() - STDERR_TAIL);
        }
    }
    let cut = tail.len().saturating_sub(STDERR_TAIL);
    // The cut may split a UTF-8 sequence: lossy decoding shows it as U+FFFD.
    String::from_utf8_lossy(&tail[cut..]).trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handler::{LostOwnership, ProgressSink};
    use serde_json::json;
    use std::sync::{Arc, Mutex};
    use std::time::Instant;

    const GRACE: Duration = Duration::from_millis(500);

    /// Runs `sh -c script` for a job with the given timeout.
    async fn run_in(script: &str, job: &mut JobContext, timeout_ms: u64) -> HandlerResult {
        let mut h = ExecHandler::new(&["sh".into(), "-c".into(), script.into()], &BTreeMap::new());
        h.grace = GRACE;
        h.env.insert("EXTRA".into(), "extra".into());
        job.timeout = Duration::from_millis(timeout_ms);
        h.handle(job).await
    }

    async fn run(script: &str) -> HandlerResult {
        run_in(script, &mut job(), 10_000).await
    }

    fn job() -> JobContext {
        JobContext::detached("job-1", "builds", json!({"repo": "x", "n": 1}))
    }

    /// Records reports; after `keep` of them, the job is "taken away".
    struct Recorder(Mutex<Vec<Progress>>, usize);

    #[async_trait]
    impl ProgressSink for Recorder {
        async fn report(
            &self,
            id: &str,
            _lease: i64,
            report: Progress,
        ) -> Result<(), LostOwnership> {
            let mut reports = self.0.lock().unwrap();
            if reports.len() >= self.1 {
                return Err(LostOwnership(id.into()));
            }
            reports.push(report);
            Ok(())
        }
    }

    /// A script that starts `sleep 300` in the background and writes its pid to a file,
    /// and a function telling afterwards whether that sleep still runs (zombies count as
    /// dead: pid 1 reaps them, at its own pace).
    fn grandchild(name: &str, sleeper: &str) -> (String, impl Fn() -> bool) {
        let file = std::env::temp_dir().join(format!("jobwarden-{}-{name}", std::process::id()));
        let script = format!("{sleeper} & echo $! > {}", file.display());
        // Whether the process is still alive 2 s after the question: a process sent SIGKILL
        // on a loaded machine may take a moment to be scheduled and die (a zombie is dead).
        let alive = move || {
            let pid = std::fs::read_to_string(&file).unwrap();
            let _ = std::fs::remove_file(&file);
            let living = || {
                let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid.trim()));
                stat.is_ok_and(|s| !s.rsplit_once(')').unwrap().1.trim_start().starts_with('Z'))
            };
            let deadline = std::time::Instant::now() + Duration::from_secs(2);
            while living() {
                if std::time::Instant::now() > deadline {
                    return true;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            false
        };
        (script, alive)
    }

    #[tokio::test]
    async fn success_stdin_env_and_result() {
        let script = r#"echo hello; echo '{"result": {"n": 1}}'; echo 'x {"result": 2}'"#;
        assert_eq!(run(script).await, Ok(Some(json!({"n": 1}))));
        assert_eq!(run("echo plain output").await, Ok(None));
        let echo = r#"printf '{"result": %s}\n' "$(cat)""#;
        assert_eq!(run(echo).await, Ok(Some(json!({"repo": "x", "n": 1}))));

        let env = r#"echo "{\"result\": \"$JOB_ID $JOB_QUEUE $JOB_ATTEMPT $JOB_MAX_ATTEMPTS $JOBWARDEN_API $TRACEPARENT $EXTRA\"}""#;
        let mut job = job();
        job.traceparent = Some("tp".into());
        let expected = json!("job-1 builds 1 1 http://127.0.0.1:0 tp extra");
        assert_eq!(run_in(env, &mut job, 10_000).await, Ok(Some(expected)));
    }

    #[tokio::test]
    async fn exit_202_defers_with_the_deadline_printed_and_the_token_in_the_environment() {
        let ctx = job();
        let script =
            r#"[ -n "$JOB_COMPLETION_TOKEN" ] || exit 3; echo '{"defer": "15m"}'; exit 202"#;
        let res = ExecHandler::new(&["sh".into(), "-c".into(), script.into()], &BTreeMap::new())
            .handle(&ctx)
            .await;
        assert_eq!(res, Ok(None));
        assert_eq!(ctx.deferred(), Some(Duration::from_secs(900)));
        let res = run("exit 202").await.unwrap_err();
        assert!(res.to_string().contains("printed no deadline"), "{res}");
        let res = run(r#"echo '{"defer": 0}'; exit 202"#).await.unwrap_err();
        assert!(res.to_string().contains("out of range"), "{res}");
    }

    #[tokio::test]
    async fn exit_codes_and_stderr() {
        let res = run("echo 'bad: no repo' >&2; exit 65").await;
        assert_eq!(res, Err(JobError::permanent("exit code 65: bad: no repo")));
        assert_eq!(run("exit 3").await, Err(JobError::retry("exit code 3")));
        let res = run("echo oops >&2; kill -9 $$").await;
        assert_eq!(res, Err(JobError::retry("killed by signal SIGKILL: oops")));
        // A big stderr keeps only its tail.
        let script = "head -c 100000 /dev/zero | tr '\\0' x >&2; echo END >&2; exit 1";
        let message = run(script).await.unwrap_err().to_string();
        assert!(message.len() <= STDERR_TAIL + 20 && message.ends_with("xxEND"));

        // A secret of the handler's own environment never reaches the attempt's error.
        let env = BTreeMap::from([("SMTP_PASSWORD".to_string(), "pw-7f3k9q".to_string())]);
        let leaky = ExecHandler::new(
            &[
                "sh".into(),
                "-c".into(),
                "echo \"login failed for $SMTP_PASSWORD\" >&2; exit 1".into(),
            ],
            &env,
        );
        let message = leaky.handle(&job()).await.unwrap_err().to_string();
        assert!(
            message.starts_with("exit code 1: login failed for "),
            "{message}"
        );
        assert!(!message.contains("pw-7f3k9q"), "{message}");

        let missing = ExecHandler::new(&["/nonexistent/app".into()], &BTreeMap::new());
        let res = missing.handle(&job()).await;
        assert!(matches!(&res, Err(JobError::Retry { message, .. })
            if message.contains("\"/nonexistent/app\"") && message.contains("check handler.command")));
    }

    #[tokio::test]
    async fn progress_lines_reach_the_sink() {
        let recorder = Arc::new(Recorder(Mutex::new(Vec::new()), usize::MAX));
        let mut job = job();
        job.progress = recorder.clone();
        let script = r#"echo '{"progress": 0.5, "stage": "clone"}'; echo '{"progress": 0.9, "x": 1}'
            echo '{}'; echo 'progress 1.0'; echo '{"message": "almost"}'; echo '{"result": true}'
            sleep 0.2 # progress sent just before exiting may be dropped"#;
        let res = run_in(script, &mut job, 10_000).await;
        assert_eq!(res, Ok(Some(json!(true))));
        let expected = json!([{"progress": 0.5, "stage": "clone"}, {"message": "almost"}]);
        let expected: Vec<Progress> = serde_json::from_value(expected).unwrap();
        assert_eq!(*recorder.0.lock().unwrap(), expected);

        // Losing the job stops the command at once.
        job.progress = Arc::new(Recorder(Mutex::new(Vec::new()), 1));
        let started = Instant::now();
        let script = r#"echo '{"stage": "a"}'; echo '{"stage": "b"}'; sleep 300"#;
        let res = run_in(script, &mut job, 10_000).await;
        assert_eq!(res, Err(JobError::retry("ownership lost")));
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[tokio::test]
    async fn timeout_terminates_the_whole_group() {
        let (script, alive) = grandchild("term", "sleep 300");
        let started = Instant::now();
        let res = run_in(&format!("{script}; wait"), &mut job(), 300).await;
        assert_eq!(res, Err(JobError::retry("timed out after 300ms")));
        // Everyone died of SIGTERM: no waiting for the grace period.
        assert!(started.elapsed() < Duration::from_millis(300) + GRACE);
        assert!(!alive(), "the grandchild survived");
    }

    #[tokio::test]
    async fn term_is_followed_by_kill() {
        // The command traps TERM and keeps going; its grandchild ignores TERM.
        let (script, alive) = grandchild("kill", "(trap '' TERM; sleep 300)");
        let script = format!("{script}; trap 'echo TERM >&2' TERM; while :; do sleep 0.05; done");
        let started = Instant::now();
        let res = run_in(&script, &mut job(), 300).await;
        assert_eq!(res, Err(JobError::retry("timed out after 300ms")));
        assert!(started.elapsed() >= Duration::from_millis(300) + GRACE);
        assert!(!alive(), "the grandchild survived");
    }

    #[tokio::test]
    async fn cancellation_and_leftovers() {
        let mut job = job();
        let cancel = job.cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            cancel.cancel();
        });
        let res = run_in("sleep 300", &mut job, 10_000).await;
        assert_eq!(res, Err(JobError::retry("cancelled")));

        // Background processes do not outlive a command that exited normally.
        let (script, alive) = grandchild("leftover", "sleep 300");
        assert_eq!(run(&format!("{script}; exit 0")).await, Ok(None));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!alive(), "the leftover survived");

        // The worker drops the handler's future when it cancels: the group goes with it.
        let (script, alive) = grandchild("dropped", "sleep 300");
        let script = format!("{script}; wait");
        let dropped = tokio::time::timeout(Duration::from_millis(300), run(&script)).await;
        assert!(dropped.is_err());
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!alive(), "the grandchild survived");
    }
}
