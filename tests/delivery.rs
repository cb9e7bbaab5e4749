//! Between the stream and PostgreSQL: every way a message and its job row can drift apart —
//! a stream recreated, a message id reused, a worker that dies holding fetched messages, a
//! row too large to publish, a message lost on a busy queue, a NATS outage, a queue no pod
//! serves yet — and the job must still run once, or be dead-lettered with a reason.

mod common;

use common::{outcomes, stat, wait_for, ChildWorker, RecordingApp, TestEnv};
use jobwarden::client::{Client, ClientError, EnqueueOptions};
use jobwarden::handler::{from_fn, JobError, Progress};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn rust_queue(name: &str, extra: &str) -> String {
    format!("[queues.{name}]\nhandler = {{ kind = \"rust\", name = \"h\" }}\n{extra}")
}

/// Runs per job id, and the payload each job ran with.
type Seen = Arc<Mutex<HashMap<String, (u32, Value)>>>;

/// Counts runs per job id and remembers each payload.
fn recorder() -> (Arc<dyn jobwarden::Handler>, Seen) {
    let seen = Arc::new(Mutex::new(HashMap::<String, (u32, Value)>::new()));
    let s = seen.clone();
    let h = from_fn(move |job| {
        let s = s.clone();
        async move {
            let mut m = s.lock().unwrap();
            let e = m.entry(job.id.clone()).or_insert((0, job.payload.clone()));
            e.0 += 1;
            Ok(None)
        }
    });
    (h, seen)
}

/// Leaves `n` plain messages delivered to a worker that dies before claiming them (see
/// [`common::strand_in_a_killed_worker`]).
async fn strand_in_a_killed_worker(env: &TestEnv, config: &jobwarden::config::Config, n: usize) {
    let bodies: Vec<String> = (0..n).map(|i| format!(r#"{{"n":{i}}}"#)).collect();
    common::strand_in_a_killed_worker(env, config, &bodies).await;
}

/// A `work` queue handled over HTTP by `app`, plus `extra` settings.
async fn http_env(app: &RecordingApp, extra: &str) -> TestEnv {
    TestEnv::new(&format!(
        "{extra}[queues.work]\nhandler = {{ kind = \"http\", url = \"{}\" }}\n",
        app.url
    ))
    .await
}

/// How long adoption may take under `config` (invariant 11: "within seconds", not after
/// `ack_wait`), counted from the adopting worker's start: its adopter looks every
/// `adopt_after` and adopts a message it found without a row on two looks in a row, so two
/// periods; plus headroom for the worker's start-up and the job's run on a loaded machine.
/// (Measured on the 2-core test machine: 10.2-10.5 s with the default 5 s `adopt_after`.)
fn adoption_deadline(config: &jobwarden::config::Config) -> Duration {
    2 * config.worker.adopt_after + Duration::from_secs(5)
}

/// How many jobs were adopted (their history says so).
async fn adopted_jobs(env: &TestEnv) -> i64 {
    env.scalar("SELECT count(DISTINCT job_id) FROM job_attempts WHERE outcome = 'adopted'")
        .await
}

/// Waits until every thread of `worker` is stopped (SIGSTOP). A signal to a process is taken
/// by one of its threads, and the others stop only once that one has run: on a loaded
/// machine the rest of the worker can go on for tens of milliseconds (seen: it claimed a
/// message published after the signal was sent).
async fn wait_stopped(worker: &ChildWorker) {
    let pid = worker.child.id();
    let all_stopped = || async {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return false;
        };
        tasks.filter_map(Result::ok).all(|t| {
            std::fs::read_to_string(t.path().join("stat")).is_ok_and(|stat| {
                // The state follows the command name, which is in parentheses.
                stat.rsplit_once(") ")
                    .is_some_and(|(_, rest)| rest.starts_with('T'))
            })
        })
    };
    assert!(
        wait_for(Duration::from_secs(5), all_stopped).await,
        "worker {} (pid {pid}) was sent SIGSTOP but not all its threads stopped within 5 s",
        worker.hostname
    );
}

#[tokio::test]
async fn plain_messages_after_the_stream_is_recreated_are_new_jobs() {
    let env = TestEnv::new(&rust_queue("work", "")).await;
    let (h, seen) = recorder();
    let w = env.worker(&[("h", h)]).await;
    env.publish_raw("work", r#"{"n":1}"#).await;
    assert!(env.wait_count("completed", 1, 10).await);
    // An operator deletes the stream and creates it again: sequences start at 1 again.
    env.broker.js.delete_stream("JOBS").await.unwrap();
    env.broker.provision_stream().await.unwrap();
    env.broker
        .provision_consumer(&jobwarden::broker::Lane::bare("work"))
        .await
        .unwrap();
    env.publish_raw("work", r#"{"n":2}"#).await;
    let both = env.wait_count("completed", 2, 20).await;
    let payloads: Vec<Value> = seen.lock().unwrap().values().map(|v| v.1.clone()).collect();
    assert!(
        both,
        "the message published after the stream was recreated did not run; ran: {payloads:?}"
    );
    assert!(payloads.contains(&json!({"n": 2})), "{payloads:?}");
    w.shutdown().await;
}

#[tokio::test]
async fn a_message_id_reused_for_another_payload_is_kept_visibly_not_dropped() {
    let env = TestEnv::new(&rust_queue("work", "")).await;
    // A short duplicate window, so the test need not wait two minutes.
    let mut stream = env.broker.stream().await.unwrap();
    let mut sc = stream.info().await.unwrap().config.clone();
    sc.duplicate_window = Duration::from_secs(1);
    env.broker.js.update_stream(sc).await.unwrap();
    let mut cfg = env.config.clone();
    cfg.nats.duplicate_window = Duration::from_secs(1);
    let (h, seen) = recorder();
    let w = env.worker_with(cfg, &[("h", h)]).await;
    let publish = |body: &'static str| async {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(async_nats::header::NATS_MESSAGE_ID, "order-7");
        env.broker
            .js
            .publish_with_headers("jobs.work", headers, body.into())
            .await
            .unwrap()
            .await
            .unwrap()
    };
    publish(r#"{"v":1}"#).await;
    assert!(env.wait_status("order-7", "completed", 10).await);
    // Past the broker's duplicate window the producer reuses the id for another job.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let ack = publish(r#"{"v":2}"#).await;
    assert!(!ack.duplicate, "the broker took it as a duplicate");
    let kept = wait_for(Duration::from_secs(10), || async {
        let c = env.store.raw().await.unwrap();
        let n: i64 = c
            .query_one(
                "SELECT count(*) FROM jobs WHERE payload = '{\"v\":2}'::jsonb \
                 AND status = 'dead' AND last_error LIKE '%order-7%'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        n == 1
    })
    .await;
    assert!(
        kept,
        "the second message vanished; jobs: {:?}",
        env.cli(&["jobs", "list"]).stdout.len()
    );
    assert_eq!(stat(&w.stats.id_conflicts), 1);
    assert_eq!(seen.lock().unwrap()["order-7"].0, 1);
    w.shutdown().await;
}

#[tokio::test]
async fn messages_a_killed_worker_fetched_but_never_claimed_run_again_within_seconds() {
    let app = RecordingApp::start().await;
    // Default settings: ack_wait is 10 minutes, adopt_after 5 s.
    let env = http_env(&app, "").await;
    strand_in_a_killed_worker(&env, &env.config, 5).await;
    let killed = Instant::now();
    let _b = ChildWorker::spawn(&env.config, "pod-b");
    let deadline = adoption_deadline(&env.config);
    let all = wait_for(deadline, || async { env.count("completed").await == 5 }).await;
    assert!(
        all,
        "only {} of 5 fetched-but-unclaimed messages ran within {deadline:?} (two adopt_after \
         periods and headroom; ack_wait is {:?}); adopted: {}",
        env.count("completed").await,
        env.config.nats.ack_wait,
        adopted_jobs(&env).await
    );
    println!(
        "fetched but unclaimed by a killed worker: all 5 completed {:?} after the kill",
        killed.elapsed()
    );
    assert_eq!(adopted_jobs(&env).await, 5, "every job was to be adopted");
    assert_eq!(app.start_count(), 5, "a job ran twice");
}

#[tokio::test]
async fn rows_too_large_to_publish_are_dead_lettered_and_never_block_the_others() {
    let env = TestEnv::with_nats_conf(
        "max_payload: 8192\n",
        &format!("max_payload_bytes = 65536\n{}", rust_queue("work", "")),
    )
    .await;
    // 600 due jobs whose envelope is over the server's max_payload, at the head of the line.
    let c = env.store.raw().await.unwrap();
    c.execute(
        "INSERT INTO jobs (id, queue, payload, status, max_attempts, scheduled_at) \
         SELECT 'big-' || g, 'work', jsonb_build_object('blob', repeat('x', 10000)), \
                'scheduled', 3, now() - interval '1 hour' \
         FROM generate_series(1, 600) g",
        &[],
    )
    .await
    .unwrap();
    let client = Client::new(env.store.clone(), env.broker.clone());
    client
        .enqueue(
            "work",
            json!({"small": true}),
            EnqueueOptions {
                id: Some("small".into()),
                delay: Some(Duration::from_millis(100)),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let (h, _seen) = recorder();
    let w = env.worker(&[("h", h)]).await;
    assert!(
        env.wait_status("small", "completed", 15).await,
        "a due job behind unpublishable ones never ran"
    );
    assert!(env.wait_count("dead", 600, 30).await);
    let big = env.store.job_get("big-1").await.unwrap().unwrap();
    assert!(
        big.last_error
            .as_deref()
            .unwrap_or("")
            .contains("max_payload"),
        "{:?}",
        big.last_error
    );
    // Enqueueing one says so at once, and stores nothing.
    let err = env
        .enqueue_id("work", "too-big", json!({"blob": "y".repeat(10_000)}))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ClientError::Invalid(m) if m.contains("max_payload")),
        "{err}"
    );
    assert_eq!(env.status_of("too-big").await, None);
    w.shutdown().await;
}

#[tokio::test]
async fn a_lost_message_on_a_busy_queue_is_republished_while_the_backlog_lasts() {
    let env = TestEnv::new(&format!(
        "sweep_every = \"300ms\"\nbroker_lost_after = \"1s\"\n{}",
        rust_queue("work", "concurrency = 4\n")
    ))
    .await;
    let h = from_fn(|_job| async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        Ok(None)
    });
    // A backlog that never drains: about as many messages arrive as the worker runs.
    for i in 0..300 {
        env.publish_raw("work", format!(r#"{{"backlog":{i}}}"#))
            .await;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let feeder = {
        let (stop, js) = (stop.clone(), env.broker.js.clone());
        tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) {
                let _ = js
                    .publish("jobs.work", format!(r#"{{"feed":{i}}}"#).into())
                    .await;
                i += 1;
                tokio::time::sleep(Duration::from_millis(14)).await;
            }
        })
    };
    // A job stored in PostgreSQL whose publish was lost.
    let c = env.store.raw().await.unwrap();
    c.execute(
        "INSERT INTO jobs (id, queue, payload, status, max_attempts) \
         VALUES ('lost-1', 'work', '{}', 'queued', 3)",
        &[],
    )
    .await
    .unwrap();
    let w = env.worker(&[("h", h)]).await;
    let done = env.wait_status("lost-1", "completed", 25).await;
    let backlog = env.consumer_backlog("work").await.0;
    stop.store(true, Ordering::SeqCst);
    feeder.await.unwrap();
    assert!(done, "the lost job waited for the backlog to drain");
    assert!(
        backlog > 0,
        "the backlog drained first; the test proves nothing"
    );
    assert_eq!(
        outcomes(&env.store, "lost-1").await,
        vec!["broker_lost", "completed"]
    );
    w.shutdown().await;
}

#[tokio::test]
async fn a_republish_answered_duplicate_is_not_taken_for_a_publish() {
    let env = TestEnv::new(&format!(
        "broker_lost_after = \"1h\"\n{}",
        rust_queue("work", "")
    ))
    .await;
    // Another message already holds the id the scheduler will use (`<id>:<generation>`).
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(async_nats::header::NATS_MESSAGE_ID, "dup-1:1");
    env.broker
        .js
        .publish_with_headers("jobs.work", headers, r#"{"other":true}"#.into())
        .await
        .unwrap()
        .await
        .unwrap();
    let c = env.store.raw().await.unwrap();
    c.execute(
        "INSERT INTO jobs (id, queue, payload, status, max_attempts) \
         VALUES ('dup-1', 'work', '{}', 'scheduled', 3)",
        &[],
    )
    .await
    .unwrap();
    let (h, _seen) = recorder();
    let w = env.worker(&[("h", h)]).await;
    assert!(
        env.wait_status("dup-1", "completed", 15).await,
        "the job stayed {:?} after a duplicate publish",
        env.status_of("dup-1").await
    );
    w.shutdown().await;
}

#[tokio::test]
async fn jobs_that_finish_during_a_nats_outage_are_settled_during_it() {
    let mut env = TestEnv::new(&rust_queue("work", "concurrency = 100\n")).await;
    let go = Arc::new(AtomicBool::new(false));
    let runs = Arc::new(AtomicU32::new(0));
    let (g, r) = (go.clone(), runs.clone());
    // Chatty jobs: a progress report every 2 ms (each one an in-progress ack) until told to
    // finish, so the client's send buffer fills while NATS is down.
    let h = from_fn(move |job| {
        let (g, r) = (g.clone(), r.clone());
        async move {
            r.fetch_add(1, Ordering::SeqCst);
            while !g.load(Ordering::SeqCst) {
                job.progress(Progress {
                    stage: Some("busy".into()),
                    ..Default::default()
                })
                .await
                .map_err(|e| JobError::retry(e.to_string()))?;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let jitter = job.id.len() as u64 * 37 % 500;
            tokio::time::sleep(Duration::from_millis(jitter)).await;
            Ok(None)
        }
    });
    let w = env.worker(&[("h", h)]).await;
    for i in 0..100 {
        env.publish_raw("work", format!(r#"{{"id":"out-{i}","payload":{{}}}}"#))
            .await;
    }
    assert!(env.wait_count("processing", 100, 20).await);
    env.nats.kill();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    go.store(true, Ordering::SeqCst);
    let settled = env.wait_count("completed", 100, 10).await;
    let n = env.count("completed").await;
    env.nats.restart().unwrap();
    assert!(
        settled,
        "only {n} of 100 jobs that finished during the NATS outage were settled"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 100);
    w.shutdown().await;
}

#[tokio::test]
async fn messages_for_a_queue_no_pod_serves_yet_wait_then_keep_their_payload() {
    let env = TestEnv::new(&format!(
        "sweep_every = \"300ms\"\nunserved_grace = \"3s\"\n{}",
        rust_queue("work", "")
    ))
    .await;
    let (h, seen) = recorder();
    let w = env.worker(&[("h", h.clone())]).await;
    // Producers of a new queue are deployed before its workers; another producer misspells
    // a queue with a plain message (no envelope, no id). A served queue's job goes through
    // meanwhile.
    env.broker
        .js
        .publish("jobs.newq", r#"{"id":"new-1","payload":{"x":1}}"#.into())
        .await
        .unwrap()
        .await
        .unwrap();
    env.publish_raw("emial", r#"{"to":"typo@example.com"}"#)
        .await;
    env.publish_raw("work", r#"{"id":"fine","payload":{}}"#)
        .await;
    assert!(env.wait_status("fine", "completed", 10).await);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(env.status_of("new-1").await, None, "dead-lettered at once");
    assert_eq!(env.count("dead").await, 0, "dead-lettered at once");
    assert_eq!(stat(&w.stats.unserved_waiting), 2);
    let stats = common::text(&env.cli(&["stats"]));
    assert!(
        stats.contains("newq") && stats.contains("emial"),
        "stats do not show the waiting queues:\n{stats}"
    );
    // After the grace each is dead-lettered with its own payload and the reason.
    assert!(env.wait_status("new-1", "dead", 10).await);
    assert!(env.wait_count("dead", 2, 10).await);
    let job = env.store.job_get("new-1").await.unwrap().unwrap();
    assert_eq!(job.payload, json!({"x": 1}));
    assert_eq!(job.queue, "newq");
    assert!(job.last_error.unwrap_or_default().contains("newq"));
    let c = env.store.raw().await.unwrap();
    let row = c
        .query_one(
            "SELECT last_error, payload FROM jobs WHERE queue = 'emial' AND status = 'dead'",
            &[],
        )
        .await
        .unwrap();
    let reason: String = row.get(0);
    assert!(
        reason.contains("no worker served queue `emial`"),
        "{reason}"
    );
    assert_eq!(row.get::<_, Value>(1), json!({"to": "typo@example.com"}));
    // The row is committed a moment before the counter moves.
    let counted = common::wait_for(Duration::from_secs(5), || async {
        stat(&w.stats.unserved_dead_lettered) >= 2
    })
    .await;
    assert!(counted, "the dead-lettered messages were not counted");
    // The messages are out of the stream, and no consumer was ever created for them (only
    // the eleven lanes of `work`).
    let mut stream = env.broker.stream().await.unwrap();
    let info = stream.info().await.unwrap();
    assert_eq!(info.state.messages, 0, "{:?}", info.state);
    assert_eq!(info.state.consumer_count, 11, "{:?}", info.state);
    // The queue's workers arrive; a retry runs the real job.
    let mut cfg = env.config.clone();
    cfg.queues.insert("newq".into(), cfg.queues["work"].clone());
    let w2 = env.worker_with(cfg, &[("h", h)]).await;
    let out = env.cli(&["dlq", "retry", "new-1"]);
    assert!(out.status.success(), "{}", common::text(&out));
    assert!(env.wait_status("new-1", "completed", 15).await);
    assert_eq!(seen.lock().unwrap()["new-1"].1, json!({"x": 1}));
    w.shutdown().await;
    w2.shutdown().await;
}

#[tokio::test]
async fn a_job_enqueued_for_a_queue_no_pod_serves_is_dead_lettered_once_not_copied() {
    let env = TestEnv::new(&format!(
        "sweep_every = \"300ms\"\nunserved_grace = \"1s\"\n{}",
        rust_queue("work", "")
    ))
    .await;
    let (h, seen) = recorder();
    let w = env.worker(&[("h", h.clone())]).await;
    // Enqueued through PostgreSQL (the row exists) before any pod serves the queue.
    env.enqueue_id("newq", "enq-1", json!({"x": 2}))
        .await
        .unwrap();
    assert!(env.wait_status("enq-1", "dead", 15).await);
    let job = env.store.job_get("enq-1").await.unwrap().unwrap();
    assert!(job.last_error.unwrap_or_default().contains("newq"));
    // The job's own row holds it: no copy under the message id.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let rows = env.scalar("SELECT count(*) FROM jobs").await;
    assert_eq!(rows, 1, "the unserved message was kept as a second job");
    // Once a pod serves the queue, a retry runs it once.
    let mut cfg = env.config.clone();
    cfg.queues.insert("newq".into(), cfg.queues["work"].clone());
    let w2 = env.worker_with(cfg, &[("h", h)]).await;
    let out = env.cli(&["dlq", "retry", "enq-1"]);
    assert!(out.status.success(), "{}", common::text(&out));
    assert!(env.wait_status("enq-1", "completed", 15).await);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(seen.lock().unwrap()["enq-1"], (1, json!({"x": 2})));
    w.shutdown().await;
    w2.shutdown().await;
}

#[tokio::test]
async fn a_janitor_consumer_left_behind_never_stops_a_pod_from_starting() {
    let env = TestEnv::new(&rust_queue("newq", "")).await;
    // What an older janitor, killed in the middle of a round, leaves in the stream: a
    // consumer on the queue's subject.
    let stream = env.broker.stream().await.unwrap();
    stream.delete_consumer("jobwarden-newq").await.unwrap();
    stream
        .create_consumer(async_nats::jetstream::consumer::pull::Config {
            durable_name: Some("jobwarden-orphans-newq".into()),
            filter_subject: "jobs.newq".into(),
            ack_policy: async_nats::jetstream::consumer::AckPolicy::Explicit,
            ..Default::default()
        })
        .await
        .unwrap();
    let (h, _seen) = recorder();
    let w = jobwarden::Worker::new(env.config.clone())
        .rust_handler("h", h)
        .start(tokio_util::sync::CancellationToken::new())
        .await;
    let w = match w {
        Ok(w) => w,
        Err(e) => panic!("the pod could not start: {e}"),
    };
    env.publish_raw("newq", r#"{"id":"n-1","payload":{}}"#)
        .await;
    assert!(env.wait_status("n-1", "completed", 10).await);
    w.shutdown().await;
}

#[tokio::test]
async fn a_postgres_outage_is_logged_with_backoff_not_every_few_milliseconds() {
    let pg = common::testkit::PgCluster::start().unwrap();
    let env = TestEnv::with_database(
        &pg.url(),
        &format!("sweep_every = \"300ms\"\n{}", rust_queue("work", "")),
    )
    .await;
    let mut cfg = env.config.clone();
    cfg.queues.get_mut("work").unwrap().handler = Some(jobwarden::config::HandlerConfig::Exec {
        command: vec!["true".into()],
        env: Default::default(),
    });
    let log = std::env::temp_dir().join(format!("jw-outage-{}.log", std::process::id()));
    let mut worker = ChildWorker::spawn_logged(&cfg, "pod-log", &log);
    env.publish_raw("work", r#"{"id":"before","payload":{}}"#)
        .await;
    assert!(env.wait_status("before", "completed", 20).await);
    // The worker's own reports. The pool logs one line or two for each connection the outage
    // closes (`deadpool.postgres`: "Connection error", "could not be recycled"), at most
    // `pool_size` connections, once each: not a report that repeats.
    let lines = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter(|l| (l.contains("WARN") || l.contains("ERROR")) && !l.contains("deadpool"))
            .count()
    };
    let before = lines();
    pg.stop_immediate().unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let during = lines() - before;
    pg.start_again().unwrap();
    env.publish_raw("work", r#"{"id":"after","payload":{}}"#)
        .await;
    let recovered = wait_for(Duration::from_secs(30), || async {
        matches!(env.store.job_get("after").await, Ok(Some(j)) if j.status == "completed")
    })
    .await;
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    worker.kill9();
    let _ = std::fs::remove_file(&log);
    assert!(recovered, "no recovery after the outage:\n{text}");
    assert!(during >= 1, "the outage was not logged at all:\n{text}");
    assert!(
        during <= 15,
        "{during} warnings in 4 s of outage (no backoff):\n{text}"
    );
}

#[tokio::test]
async fn an_adopted_message_and_its_late_redelivery_are_one_job() {
    let app = RecordingApp::start().await;
    // Adoption long before JetStream redelivers the original (ack_wait 3 s): the
    // redelivery must map to the adopted job, not to a second one.
    let env = http_env(
        &app,
        "stale_after = \"1s\"\nsweep_every = \"200ms\"\nheartbeat_every = \"200ms\"\n\
         adopt_after = \"300ms\"\n",
    )
    .await;
    let mut cfg = env.config.clone();
    cfg.nats.ack_wait = Duration::from_secs(3);
    env.reprovision(&cfg, "work").await;
    strand_in_a_killed_worker(&env, &cfg, 5).await;
    let started = Instant::now();
    let b = env.worker_with(cfg.clone(), &[]).await;
    let deadline = adoption_deadline(&cfg);
    assert!(
        wait_for(deadline, || async { env.count("completed").await == 5 }).await,
        "only {} of 5 stranded messages ran within {deadline:?} (adopt_after {:?})",
        env.count("completed").await,
        cfg.worker.adopt_after
    );
    println!(
        "stranded messages, adopt_after {:?}: all 5 completed {:?} after the adopting worker started",
        cfg.worker.adopt_after,
        started.elapsed()
    );
    // Past ack_wait: the original messages come back and find their jobs done.
    tokio::time::sleep(Duration::from_secs(5)).await;
    env.wait_consumer_drained("work").await;
    assert_eq!(
        app.start_count(),
        5,
        "a redelivery ran an adopted job again"
    );
    assert_eq!(env.count("completed").await, 5);
    assert!(
        stat(&b.stats.adopted) >= 5,
        "adopted {}",
        stat(&b.stats.adopted)
    );
    assert!(
        stat(&b.stats.dropped) >= 5,
        "the redeliveries were not dropped"
    );
    b.shutdown().await;
}

#[tokio::test]
async fn pulls_are_bounded_by_bytes_as_well_as_by_count() {
    let env = TestEnv::new(&format!(
        "max_payload_bytes = 716800\npull_max_bytes = 1048576\n{}",
        rust_queue("work", "concurrency = 10\n")
    ))
    .await;
    let (h, seen) = recorder();
    let blob = "x".repeat(600 * 1024);
    for i in 0..10 {
        env.publish_raw(
            "work",
            format!(r#"{{"id":"big-{i}","payload":{{"b":"{blob}"}}}}"#),
        )
        .await;
    }
    let w = env.worker(&[("h", h)]).await;
    assert!(env.wait_count("completed", 10, 30).await);
    let largest = stat(&w.stats.largest_pull_bytes);
    // One 600 KiB message per pull: a budget of 1 MiB (the server's max_payload, plus room
    // for headers) never takes two.
    assert!(largest > 600 * 1024, "{largest}");
    assert!(largest < 1200 * 1024, "a pull brought {largest} bytes");
    assert_eq!(seen.lock().unwrap().len(), 10);
    w.shutdown().await;
}

#[tokio::test]
async fn messages_delivered_to_a_paused_workers_open_pulls_run_after_it_is_killed() {
    let app = RecordingApp::start().await;
    // Default settings: ack_wait is 10 minutes.
    let env = http_env(&app, "").await;
    let mut a = ChildWorker::spawn(&env.config, "pod-a");
    // Idle, it keeps a long-poll pull request open at the server.
    env.publish_raw("work", r#"{"id":"warm-up","payload":{}}"#)
        .await;
    assert!(env.wait_status("warm-up", "completed", 20).await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Paused: the server still delivers to its open pulls; it never reads them. Then it dies.
    a.signal(nix::sys::signal::Signal::SIGSTOP);
    wait_stopped(&a).await;
    for i in 0..3 {
        env.publish_raw("work", format!(r#"{{"n":{i}}}"#)).await;
    }
    // The premise: some of them went into the paused worker's open pulls (delivered, never
    // acked; nothing else consumes them while no other worker runs). The rest wait in the
    // stream for the next worker.
    let delivered = wait_for(Duration::from_secs(5), || async {
        let (pending, unacked) = env.consumer_backlog("work").await;
        unacked > 0 && pending + unacked as u64 == 3
    })
    .await;
    let (pending, in_pulls) = env.consumer_backlog("work").await;
    assert!(
        delivered,
        "none of the 3 messages went into the paused worker's open pull (consumer backlog: \
         {pending} pending, {in_pulls} unacked): the test needs the worker to keep a pull \
         open while idle"
    );
    a.kill9();
    let killed = Instant::now();
    let _b = ChildWorker::spawn(&env.config, "pod-b");
    let deadline = adoption_deadline(&env.config);
    assert!(
        wait_for(deadline, || async { env.count("completed").await == 4 }).await,
        "only {} of 3 messages (of which {in_pulls} in a dead worker's pulls) ran within \
         {deadline:?} (two adopt_after periods and headroom; ack_wait is {:?}); adopted: {}",
        env.count("completed").await - 1,
        env.config.nats.ack_wait,
        adopted_jobs(&env).await
    );
    println!(
        "messages in a dead worker's pulls: all ran {:?} after the kill ({in_pulls} of 3 were in its pulls)",
        killed.elapsed()
    );
    // Those in the dead worker's pulls came back by adoption; the others were claimed.
    assert_eq!(
        adopted_jobs(&env).await,
        in_pulls as i64,
        "the messages in the dead worker's pulls were to be adopted, and only those"
    );
    assert_eq!(app.start_count(), 4);
}
