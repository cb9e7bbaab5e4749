//! Invariant 14: no task of the worker dies unnoticed. A panic or an unexpected end of any
//! service fails `/livez`, is logged once with the service's name, and ends `jobwarden run`
//! with exit code 70 (after a bounded drain of the jobs it runs); a panic inside a job's
//! handler fails only that job; the NATS client's own connection task dying is noticed, an
//! outage is not mistaken for it.
//!
//! Failures are injected with fail points (`JOBWARDEN_FAILPOINTS`, `Worker::failpoints`) and,
//! for the NATS client, with the real thing: a message whose header value holds a lone CR,
//! on which async-nats 0.51's connection task panics.

mod common;

use common::{wait_for, TestEnv};
use jobwarden::config::Config;
use jobwarden::handler::from_fn;
use jobwarden::worker::{
    Action, Cause, FailPoints, FailTrigger, RunningWorker, Service, ServiceFailure, Worker,
};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

/// A queue under a rate limit (so flow control runs), with a Rust handler.
const QUEUE: &str = r#"
[queues.work]
concurrency = 4
max_attempts = 1
rate_limit = "1000/1s"
handler = { kind = "rust", name = "h" }
"#;

const FAILED_LINE: &str = "a service of this worker failed";

fn ok_handler() -> Arc<dyn jobwarden::Handler> {
    from_fn(|_job| async { Ok(None) })
}

async fn start(config: &Config, points: &str) -> RunningWorker {
    Worker::new(config.clone())
        .rust_handler("h", ok_handler())
        .failpoints(points.parse::<FailPoints>().expect("valid fail points"))
        .start(CancellationToken::new())
        .await
        .expect("worker start")
}

/// The status and body of a GET.
async fn get(url: &str) -> (u16, String) {
    let r = reqwest::get(url).await.expect("GET");
    (r.status().as_u16(), r.text().await.unwrap_or_default())
}

async fn failure_of(worker: &RunningWorker) -> ServiceFailure {
    tokio::time::timeout(Duration::from_secs(30), worker.failed())
        .await
        .expect("a service failure is reported")
}

async fn publish_job(env: &TestEnv, queue: &str, id: &str) {
    env.publish_raw(queue, json!({"id": id, "payload": {}}).to_string())
        .await;
}

#[tokio::test]
async fn a_scheduler_panic_fails_livez_and_ends_the_worker_with_it() {
    let env = TestEnv::new(QUEUE).await;
    let worker = start(&env.config, "scheduler=panic").await;
    let ops = worker.ops_addr.expect("ops listener");
    let f = failure_of(&worker).await;
    assert_eq!(f.service, Service::Scheduler);
    assert_eq!(
        f.cause,
        Cause::Panicked("fail point scheduler=panic (JOBWARDEN_FAILPOINTS)".into())
    );
    for probe in ["livez", "healthz"] {
        let (status, body) = get(&format!("http://{ops}/{probe}")).await;
        assert_eq!(status, 503, "/{probe}: {body}");
        assert!(
            body.contains("service scheduler failed"),
            "/{probe}: {body}"
        );
    }
    let ended = worker.run_until(std::future::pending()).await;
    assert_eq!(ended.err(), Some(f));
}

/// Every service of a real worker, through its fail point, both ways it can fail: each is
/// spawned under the supervisor by its name (a service spawned outside it would never fire).
#[tokio::test]
async fn every_service_of_a_worker_is_supervised_under_its_name() {
    let env = TestEnv::new(&format!("{QUEUE}\n[dashboard]\nlisten = \"127.0.0.1:0\"\n")).await;
    let tasks = [
        Service::Producer,
        Service::Completer,
        Service::Scheduler,
        Service::Rescuer,
        Service::Reconciler,
        Service::Janitor,
        Service::Heartbeat,
        Service::Cron,
        Service::Pruner,
        Service::Api,
        Service::Metrics,
        Service::Dashboard,
        Service::Outbound,
        Service::NatsClient,
    ];
    let mut cases: Vec<(Service, &str)> = Vec::new();
    for s in tasks {
        cases.push((s, "panic"));
        cases.push((s, "return"));
    }
    // Parts that are no task of their own fire inside their code, when a job comes.
    cases.push((Service::Executor, "panic"));
    cases.push((Service::Flow, "panic"));
    for (i, (service, action)) in cases.into_iter().enumerate() {
        let worker = start(&env.config, &format!("{service}={action}")).await;
        publish_job(&env, "work", &format!("job-{i}")).await;
        let f = failure_of(&worker).await;
        match service {
            // Flow control runs inside its queue's producer.
            Service::Flow => {
                assert_eq!(f.service, Service::Producer, "{service}={action}: {f}");
                assert_eq!(f.scope.as_deref(), Some("queue work"));
            }
            _ => assert_eq!(f.service, service, "{service}={action}: {f}"),
        }
        match action {
            "panic" => assert_eq!(
                f.cause,
                Cause::Panicked(format!("fail point {service}=panic (JOBWARDEN_FAILPOINTS)")),
                "{service}"
            ),
            _ => assert_eq!(f.cause, Cause::Returned, "{service}"),
        }
        // The probe answers on both listeners; one of them may be the service that failed.
        let listener = if service == Service::Metrics {
            worker.api_addr
        } else {
            worker.ops_addr.unwrap()
        };
        let (status, body) = get(&format!("http://{listener}/livez")).await;
        assert_eq!(status, 503, "{service}={action}: {body}");
        assert!(body.contains(&f.to_string()), "{body}");
        let ended = tokio::time::timeout(
            Duration::from_secs(60),
            worker.run_until(std::future::pending()),
        )
        .await
        .expect("the worker stops after a failure");
        assert_eq!(ended.err(), Some(f), "{service}={action}");
    }
}

#[tokio::test]
async fn a_panicking_rust_handler_fails_only_its_job() {
    let env = TestEnv::new(QUEUE).await;
    let h = from_fn(|job| async move {
        if job.id == "boom" {
            let empty: Vec<u8> = Vec::new();
            // A real panic of user code, not a crafted error.
            let _ = empty[job.attempt as usize];
        }
        Ok(Some(json!({"ran": job.id})))
    });
    let worker = env.worker(&[("h", h)]).await;
    let ops = worker.ops_addr.unwrap();
    publish_job(&env, "work", "boom").await;
    for i in 0..5 {
        publish_job(&env, "work", &format!("fine-{i}")).await;
    }
    assert!(env.wait_status("boom", "dead", 20).await);
    assert!(env.wait_count("completed", 5, 20).await);
    let c = env.store.raw().await.unwrap();
    let error: String = c
        .query_one("SELECT last_error FROM jobs WHERE id = 'boom'", &[])
        .await
        .unwrap()
        .get(0);
    assert!(
        error.starts_with("the handler panicked: index out of bounds"),
        "{error}"
    );
    assert_eq!(worker.failure(), None);
    assert_eq!(get(&format!("http://{ops}/livez")).await.0, 200);
    // The worker goes on: a later job runs.
    publish_job(&env, "work", "after").await;
    assert!(env.wait_status("after", "completed", 20).await);
    worker.shutdown().await;
}

/// The scheduler's LISTEN connection is a future it spawns under the supervisor: it
/// subscribes, wakes on a SQL enqueue, and ends when its receiver is dropped.
#[tokio::test]
async fn the_listen_driver_wakes_on_a_sql_enqueue_and_ends_with_its_receiver() {
    let env = TestEnv::new(QUEUE).await;
    let (mut rx, driver) = env.store.listen_enqueues().await.expect("listen");
    let driver = tokio::spawn(driver);
    let c = env.store.raw().await.unwrap();
    // The subscription is made once the driver runs: enqueue until a wake-up comes.
    let mut woke = false;
    for _ in 0..100 {
        c.batch_execute("SELECT enqueue('work', '{}')")
            .await
            .unwrap();
        if let Ok(Some(())) = tokio::time::timeout(Duration::from_millis(200), rx.recv()).await {
            woke = true;
            break;
        }
    }
    assert!(woke, "no wake-up for an enqueue");
    drop(rx);
    tokio::time::timeout(Duration::from_secs(10), driver)
        .await
        .expect("the driver ends once its receiver is gone")
        .expect("and does not panic");
}

/// Publishes, as a plain NATS client speaking the protocol over TCP, a message whose header
/// `X-Bad` holds a lone CR (`a\rb`): nats-server 2.9 stores and delivers it; async-nats
/// 0.51's connection task panics when it receives it.
async fn publish_lone_cr(port: u16, subject: &str, body: &str) {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect to nats-server");
    let mut buf = vec![0u8; 4096];
    let n = s.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("INFO"));
    let header = "NATS/1.0\r\nX-Bad: a\rb\r\n\r\n";
    let cmd = format!(
        "CONNECT {{\"verbose\":false,\"pedantic\":false,\"headers\":true,\"protocol\":1}}\r\n\
         HPUB {subject} {} {}\r\n{header}{body}\r\nPING\r\n",
        header.len(),
        header.len() + body.len()
    );
    s.write_all(cmd.as_bytes()).await.unwrap();
    let n = s.read(&mut buf).await.unwrap();
    assert_eq!(&buf[..n], b"PONG\r\n", "the server took the message");
}

#[tokio::test]
async fn the_nats_clients_death_is_noticed_and_an_outage_is_not() {
    let mut env = TestEnv::new(QUEUE).await;
    let worker = env.worker(&[("h", ok_handler())]).await;
    let ops = worker.ops_addr.unwrap();
    publish_job(&env, "work", "before").await;
    assert!(env.wait_status("before", "completed", 20).await);

    // An outage: the server is killed and comes back; the client waits, then reconnects.
    env.nats.kill();
    let down = worker.broker.client.clone();
    assert!(
        wait_for(Duration::from_secs(20), || async {
            down.connection_state() != async_nats::connection::State::Connected
        })
        .await,
        "the client saw the server go"
    );
    // Several of the watchdog's probe periods pass while it waits on its probe.
    tokio::time::sleep(Duration::from_secs(3)).await;
    env.nats.restart().expect("restart nats-server");
    publish_job(&env, "work", "after-outage").await;
    assert!(env.wait_status("after-outage", "completed", 60).await);
    assert_eq!(worker.failure(), None, "an outage is not a death");
    assert_eq!(get(&format!("http://{ops}/livez")).await.0, 200);

    // The client's connection task dies on a header it cannot represent.
    publish_lone_cr(env.nats.port(), "jobs.work", r#"{"id":"bad","payload":{}}"#).await;
    let f = failure_of(&worker).await;
    assert_eq!(f.service, Service::NatsClient, "{f}");
    match &f.cause {
        Cause::Failed(m) => assert!(
            m.starts_with("the NATS client's connection task has ended"),
            "{m}"
        ),
        other => panic!("{other:?}"),
    }
    let (status, body) = get(&format!("http://{ops}/livez")).await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("nats-client"), "{body}");
    let ended = worker.run_until(std::future::pending()).await;
    assert_eq!(ended.err(), Some(f));
}

/// A `jobwarden run` child process with extra environment, its log in a file, and its ops
/// listener on a known port.
struct Child {
    child: std::process::Child,
    ops: String,
    log: PathBuf,
    _config: PathBuf,
}

impl Child {
    fn spawn(config: &Config, env: &[(&str, &str)], dir: &Path) -> Child {
        let mut config = config.clone();
        let port = common::testkit::free_port();
        config.worker.ops_listen = format!("127.0.0.1:{port}").parse().unwrap();
        let path = dir.join("jobwarden.toml");
        std::fs::write(&path, config.to_redacted_toml()).unwrap();
        let log = dir.join("worker.log");
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_jobwarden"));
        cmd.args(["--config", path.to_str().unwrap(), "run"])
            .env("RUST_LOG", "info")
            .stdin(std::process::Stdio::null())
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::fs::File::create(dir.join("stderr.log")).unwrap());
        for (k, v) in env {
            cmd.env(k, v);
        }
        Child {
            child: cmd.spawn().expect("spawn jobwarden run"),
            ops: format!("http://127.0.0.1:{port}"),
            log,
            _config: path,
        }
    }

    async fn wait_ready(&mut self) {
        let url = format!("{}/readyz", self.ops);
        let ready = wait_for(Duration::from_secs(30), || async {
            matches!(reqwest::get(&url).await, Ok(r) if r.status() == 200)
        })
        .await;
        assert!(ready, "worker not ready; log:\n{}", self.log());
    }

    /// Waits until `/livez` answers 503 (while the process still runs); returns its body.
    async fn wait_unlive(&mut self) -> String {
        let url = format!("{}/livez", self.ops);
        for _ in 0..1500 {
            if let Ok(r) = reqwest::get(&url).await {
                if r.status() == 503 {
                    return r.text().await.unwrap_or_default();
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("/livez never failed; log:\n{}", self.log());
    }

    async fn wait_exit(&mut self) -> Option<i32> {
        let exited = wait_for(Duration::from_secs(90), || {
            let done = self.child.try_wait().unwrap().is_some();
            async move { done }
        })
        .await;
        exited.then(|| self.child.wait().unwrap().code().unwrap_or(-1))
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
            + &std::fs::read_to_string(self.log.with_file_name("stderr.log")).unwrap_or_default()
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(common::testkit::unique_name(name));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A queue whose exec handler marks its start and runs until the test releases it, and a
/// rate-limited queue whose flow control the test's fail point lives in.
fn held_queues(dir: &Path) -> String {
    let script = format!(
        "touch {d}/started-$JOB_ID; while [ ! -f {d}/release ]; do sleep 0.05; done",
        d = dir.display()
    );
    // (The first lines land in the harness's [worker] section.)
    format!(
        "shutdown_grace = \"60s\"\n\
         [queues.held]\nconcurrency = 2\nhandler = {{ kind = \"exec\", command = [\"sh\", \"-c\", {script:?}] }}\n\
         [queues.limited]\nrate_limit = \"1000/1s\"\nhandler = {{ kind = \"exec\", command = [\"true\"] }}\n"
    )
}

async fn wait_started(dir: &Path, id: &str) {
    let marker = dir.join(format!("started-{id}"));
    assert!(
        wait_for(Duration::from_secs(30), || {
            let m = marker.exists();
            async move { m }
        })
        .await,
        "job {id} never started"
    );
}

/// Whether process `pid` still runs (a zombie does not).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let state = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .next()?
                .to_string();
            Some(state != "Z")
        })
        .unwrap_or(false)
}

/// The crash-only stop, when the drain would need the failed service (here the completer):
/// the worker stops its handlers — none outlives it, even one that ignores SIGTERM — marks
/// itself stopped with the cause, and any worker's reaper takes its job back at once; the job
/// runs again, its attempt counted.
#[tokio::test]
async fn after_a_completer_failure_no_handler_outlives_the_worker_and_its_job_comes_back() {
    let dir = temp_dir("crash");
    let script = format!(
        "[ \"$JOB_ATTEMPT\" -ge 2 ] && exit 0; echo $$ > {d}/pid-$JOB_ID; trap '' TERM; \
         while true; do sleep 0.05; done",
        d = dir.display()
    );
    let env = TestEnv::new(&format!(
        "[queues.held]\nconcurrency = 1\nmax_attempts = 3\n\
         handler = {{ kind = \"exec\", command = [\"sh\", \"-c\", {script:?}] }}\n"
    ))
    .await;
    let trigger = FailTrigger::new();
    let points = FailPoints::default().on_trigger(Service::Completer, Action::Panic, &trigger);
    let worker = Worker::new(env.config.clone())
        .failpoints(points)
        .start(CancellationToken::new())
        .await
        .expect("worker start");
    let id = worker.id.clone();
    publish_job(&env, "held", "long").await;
    let pid_file = dir.join("pid-long");
    assert!(
        wait_for(Duration::from_secs(30), || {
            let there = std::fs::read_to_string(&pid_file).is_ok_and(|p| p.ends_with('\n'));
            async move { there }
        })
        .await,
        "the job never started"
    );
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(alive(pid));
    trigger.fire();
    let ended = tokio::time::timeout(
        Duration::from_secs(60),
        worker.run_until(std::future::pending()),
    )
    .await
    .expect("the worker stops");
    let f = ended.expect_err("a failure");
    assert_eq!(f.service, Service::Completer);
    assert!(!alive(pid), "the job's command outlived the worker's stop");
    let c = env.store.raw().await.unwrap();
    let reason: Option<String> = c
        .query_one("SELECT stop_reason FROM workers WHERE id = $1", &[&id])
        .await
        .unwrap()
        .get(0);
    assert_eq!(reason.as_deref(), Some("failed: completer"));
    // Another worker takes the job back and runs it again; the crash cost an attempt.
    let other = env.worker(&[]).await;
    assert!(env.wait_status("long", "completed", 60).await);
    assert_eq!(
        env.scalar("SELECT attempts::int8 FROM jobs WHERE id = 'long'")
            .await,
        2
    );
    other.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// The whole path in the shipped command: a service panics while a job runs; `/livez` fails
/// naming it; the running job still finishes and is settled once (the bounded drain); the
/// process exits 70 with the failure logged once.
#[tokio::test]
async fn jobwarden_run_exits_70_after_a_service_panic_and_drains_first() {
    let dir = temp_dir("sup");
    let env = TestEnv::new(&held_queues(&dir)).await;
    let mut w = Child::spawn(&env.config, &[("JOBWARDEN_FAILPOINTS", "flow=panic")], &dir);
    w.wait_ready().await;
    publish_job(&env, "held", "running").await;
    wait_started(&dir, "running").await;
    // The rate-limited queue's flow control panics as its first message arrives.
    publish_job(&env, "limited", "trigger").await;
    let body = w.wait_unlive().await;
    assert!(
        body.contains("service producer (queue limited) failed: panicked: fail point flow=panic"),
        "{body}"
    );
    std::fs::write(dir.join("release"), "").unwrap();
    let code = w.wait_exit().await;
    let log = w.log();
    assert_eq!(code, Some(70), "log:\n{log}");
    assert_eq!(log.matches(FAILED_LINE).count(), 1, "log:\n{log}");
    assert!(log.contains("drained after the failure"), "log:\n{log}");
    // The running job finished and was settled by this worker, once.
    assert_eq!(env.status_of("running").await.as_deref(), Some("completed"));
    assert_eq!(
        env.scalar("SELECT attempts::int8 FROM jobs WHERE id = 'running'")
            .await,
        1
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The reported defect, end to end: a message whose header holds a lone CR kills the NATS
/// client's connection task inside `jobwarden run`. Before, the worker went on with a dead
/// client — `/readyz` and `/livez` said 200, every pull failed with "channel closed" twice a
/// second, and no job ran again. Now the panic is noticed, the running job is drained and
/// the process exits 70, naming where it panicked.
#[tokio::test]
async fn a_header_with_a_lone_cr_ends_jobwarden_run_with_70() {
    let dir = temp_dir("cr");
    let env = TestEnv::new(&held_queues(&dir)).await;
    let mut w = Child::spawn(&env.config, &[], &dir);
    w.wait_ready().await;
    publish_job(&env, "held", "running").await;
    wait_started(&dir, "running").await;
    publish_lone_cr(env.nats.port(), "jobs.held", r#"{"id":"bad","payload":{}}"#).await;
    let body = w.wait_unlive().await;
    assert!(
        body.contains("service unsupervised failed") || body.contains("service nats-client failed"),
        "{body}"
    );
    std::fs::write(dir.join("release"), "").unwrap();
    let code = w.wait_exit().await;
    let log = w.log();
    assert_eq!(code, Some(70), "log:\n{log}");
    assert_eq!(log.matches(FAILED_LINE).count(), 1, "log:\n{log}");
    assert!(log.contains("invalid header value"), "log:\n{log}");
    assert_eq!(env.status_of("running").await.as_deref(), Some("completed"));
    // Another worker reads the message raw (the stream still holds it, unacked), keeps its
    // job — which runs, its bad header dropped — and deletes it from the stream, so it is
    // never delivered to a worker again (before, it came back after every ack_wait and
    // ended one pod each time).
    let mut cfg = env.config.clone();
    cfg.worker.adopt_after = Duration::from_millis(500);
    let other = env.worker_with(cfg, &[]).await;
    assert!(
        env.wait_status("bad", "completed", 30).await,
        "bad is {:?}",
        env.status_of("bad").await
    );
    // Gone from the stream. (The message of `running` may still be there: the dead client
    // could not send its ack; its redelivery finds the job completed.)
    let stream = env.broker.stream().await.unwrap();
    let mut from = 1;
    while let Some(m) = env
        .broker
        .first_message(&stream, "jobs.held", from)
        .await
        .unwrap()
    {
        assert!(m.unreadable.is_none(), "still in the stream: {m:?}");
        from = m.seq + 1;
    }
    other.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A panic in a task nobody wraps (a library's) ends `jobwarden run` too: the command's panic
/// hook reports it.
#[tokio::test]
async fn a_panic_outside_the_supervisor_ends_jobwarden_run_with_70() {
    let dir = temp_dir("unsup");
    let env = TestEnv::new(&held_queues(&dir)).await;
    let mut w = Child::spawn(
        &env.config,
        &[("JOBWARDEN_FAILPOINTS", "unsupervised=panic")],
        &dir,
    );
    let code = w.wait_exit().await;
    let log = w.log();
    assert_eq!(code, Some(70), "log:\n{log}");
    assert_eq!(log.matches(FAILED_LINE).count(), 1, "log:\n{log}");
    assert!(
        log.contains("a task outside the supervisor panicked at")
            && log.contains("fail point unsupervised=panic"),
        "log:\n{log}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_malformed_failpoints_variable_is_refused_with_exit_2() {
    let dir = temp_dir("badfp");
    let env = TestEnv::new(&held_queues(&dir)).await;
    let mut w = Child::spawn(
        &env.config,
        &[("JOBWARDEN_FAILPOINTS", "schedular=panic")],
        &dir,
    );
    let code = w.wait_exit().await;
    let log = w.log();
    assert_eq!(code, Some(2), "log:\n{log}");
    assert!(log.contains("no service \"schedular\""), "log:\n{log}");
    let _ = std::fs::remove_dir_all(&dir);
}
