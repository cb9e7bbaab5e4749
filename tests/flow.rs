//! Flow control against real servers: priorities (bands as subjects, strict, with the
//! `fair_every` share for lower bands).

mod common;

use common::{wait_for, TestEnv};
use jobwarden::client::{Client, EnqueueOptions};
use jobwarden::handler::from_fn;
use jobwarden::store::GrantCounts;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn rust_queue(name: &str, extra: &str) -> String {
    format!("[queues.{name}]\nhandler = {{ kind = \"rust\", name = \"h\" }}\n{extra}")
}

/// Start times of every job, in order, with its id and priority; each job runs `ms`
/// milliseconds.
type Starts = Arc<Mutex<Vec<(Instant, String, i16)>>>;

fn timed(ms: u64) -> (Arc<dyn jobwarden::Handler>, Starts) {
    let starts: Starts = Arc::default();
    let s = starts.clone();
    let h = from_fn(move |job| {
        let s = s.clone();
        async move {
            let priority = job.payload["p"].as_i64().unwrap_or(-1) as i16;
            s.lock()
                .unwrap()
                .push((Instant::now(), job.id.clone(), priority));
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok(None)
        }
    });
    (h, starts)
}

/// Publishes `n` plain messages `{"p": priority}` to `subject`, acks awaited 500 at a time.
async fn publish_many(env: &TestEnv, subject: &str, n: usize, p: i16) {
    let body = json!({ "p": p }).to_string();
    let mut left = n;
    while left > 0 {
        let k = left.min(500);
        let mut acks = Vec::with_capacity(k);
        for _ in 0..k {
            acks.push(
                env.broker
                    .js
                    .publish(subject.to_string(), body.clone().into())
                    .await
                    .expect("publish"),
            );
        }
        for a in acks {
            a.await.expect("publish ack");
        }
        left -= k;
    }
}

#[tokio::test]
async fn a_priority_0_job_behind_10000_priority_8_jobs_starts_at_the_next_free_slot() {
    let env = TestEnv::new(&rust_queue("work", "concurrency = 4\n")).await;
    publish_many(&env, "jobs.work.8", 10_000, 8).await;
    let (h, starts) = timed(40);
    let w = env.worker(&[("h", h)]).await;
    // The backlog is flowing.
    assert!(
        wait_for(Duration::from_secs(20), || async {
            starts.lock().unwrap().len() >= 40
        })
        .await
    );
    // Enqueued through the client with priority 0: it picks the band's subject.
    let client = Client::new(env.store.clone(), env.broker.clone());
    let published = Instant::now();
    client
        .enqueue(
            "work",
            json!({"p": 0}),
            EnqueueOptions {
                id: Some("urgent".into()),
                priority: Some(0),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(
        wait_for(Duration::from_secs(10), || async {
            starts.lock().unwrap().iter().any(|s| s.1 == "urgent")
        })
        .await,
        "the priority-0 job never started"
    );
    let starts = starts.lock().unwrap().clone();
    let urgent = starts.iter().find(|s| s.1 == "urgent").unwrap().0;
    let waited = urgent - published;
    // Jobs of band 8 that started after the urgent one was published and before it: only
    // those whose slots were already promised (one pull's worth at most).
    let overtaken = starts
        .iter()
        .filter(|s| s.2 == 8 && s.0 > published && s.0 < urgent)
        .count();
    println!("priority 0 started {waited:?} after its publish; {overtaken} band-8 jobs started in between");
    assert!(waited < Duration::from_secs(1), "waited {waited:?}");
    assert!(overtaken <= 4, "{overtaken} band-8 jobs started before it");
    let job = env.store.job_get("urgent").await.unwrap().unwrap();
    assert_eq!(job.priority, 0);
    // Rows of the band-8 messages carry the band's priority.
    let c = env.store.raw().await.unwrap();
    let p8: i64 = c
        .query_one(
            "SELECT count(*) FROM jobs WHERE priority = 8 AND status <> 'queued'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(p8 >= 40);
    w.shutdown().await;
}

/// Runs `n0` priority-0 jobs, and `n9` priority-9 ones published while the priority-0
/// backlog runs, one at a time; returns the priorities in the order they started.
async fn run_two_bands(extra: &str, n0: usize, n9: usize) -> Vec<i16> {
    let env = TestEnv::new(&rust_queue("work", &format!("concurrency = 1\n{extra}"))).await;
    let (h, starts) = timed(1);
    let w = env.worker(&[("h", h)]).await;
    // An idle worker: every lane has been found empty and is watched by a doorbell.
    tokio::time::sleep(Duration::from_millis(500)).await;
    publish_many(&env, "jobs.work.0", n0, 0).await;
    assert!(
        wait_for(Duration::from_secs(10), || async {
            starts.lock().unwrap().len() >= 5
        })
        .await
    );
    // Band 9's doorbell brings its first message while band 0 has a backlog: it must not
    // jump the queue.
    publish_many(&env, "jobs.work.9", n9, 9).await;
    assert!(env.wait_count("completed", (n0 + n9) as i64, 60).await);
    w.shutdown().await;
    let order: Vec<i16> = starts.lock().unwrap().iter().map(|s| s.2).collect();
    order
}

#[tokio::test]
async fn priorities_are_strict_unless_fair_every_gives_lower_bands_a_share() {
    // Strict (the default): every priority-0 job starts before any priority-9 one.
    let order = run_two_bands("", 200, 10).await;
    let last0 = order.iter().rposition(|p| *p == 0).unwrap();
    let first9 = order.iter().position(|p| *p == 9).unwrap();
    assert!(
        last0 < first9,
        "a priority-9 job ran before the priority-0 backlog was done: {order:?}"
    );
    // fair_every = 4: band 9 gets pulls while band 0 still has a backlog.
    let order = run_two_bands("fair_every = 4\n", 200, 10).await;
    let last0 = order.iter().rposition(|p| *p == 0).unwrap();
    let early9 = order[..last0].iter().filter(|p| **p == 9).count();
    assert!(
        early9 >= 3,
        "band 9 starved behind band 0 with fair_every = 4: {order:?}"
    );
}

/// The bare subject's lane, while idle, is watched by a long poll that holds the free slots
/// loosely: a band with a backlog takes them, and what the watch brings then waits for the
/// next slots by priority. Bare jobs (priority 5) published during a priority-8 backlog all
/// start before that backlog goes on (but for the slots already promised to it), and none
/// is lost.
#[tokio::test]
async fn default_priority_jobs_overtake_a_lower_band_backlog_and_none_is_lost() {
    let env = TestEnv::new(&rust_queue("work", "concurrency = 4\n")).await;
    let (h, starts) = timed(2);
    let w = env.worker(&[("h", h)]).await;
    // Idle: the bare lane is watched.
    tokio::time::sleep(Duration::from_millis(500)).await;
    publish_many(&env, "jobs.work.8", 2000, 8).await;
    assert!(
        wait_for(Duration::from_secs(10), || async {
            starts.lock().unwrap().len() >= 20
        })
        .await
    );
    publish_many(&env, "jobs.work", 50, 5).await;
    assert!(env.wait_count("completed", 2050, 60).await);
    w.shutdown().await;
    let order: Vec<i16> = starts.lock().unwrap().iter().map(|s| s.2).collect();
    assert_eq!(order.len(), 2050, "every job ran once");
    let first = order.iter().position(|p| *p == 5).unwrap();
    let last = order.iter().rposition(|p| *p == 5).unwrap();
    let overtaking = order[first..last].iter().filter(|p| **p == 8).count();
    println!("band-8 jobs started between the first and last bare job: {overtaking}");
    // Promised to the backlog when the bare jobs arrive: the jobs claimed ahead of a slot (a
    // claim group of 4 per claim in flight, 2 in flight: 8), and one group whose pull or
    // claim was already on its way (4 more; seen once in a full run on a loaded machine: 9).
    // Of the 2000 band-8 jobs, every other one waits.
    assert!(
        overtaking <= 12,
        "{overtaking} band-8 jobs started while bare jobs waited: {:?}",
        &order[first..=last]
    );
}

#[tokio::test]
async fn a_plain_message_on_a_band_subject_gets_the_bands_priority() {
    let env = TestEnv::new(&rust_queue("work", "")).await;
    let (h, _starts) = timed(1);
    let w = env.worker(&[("h", h)]).await;
    env.broker
        .js
        .publish("jobs.work.3", r#"{"id":"banded","payload":{}}"#.into())
        .await
        .unwrap()
        .await
        .unwrap();
    env.publish_raw("work", r#"{"id":"bare","payload":{}}"#)
        .await;
    assert!(env.wait_status("banded", "completed", 10).await);
    assert!(env.wait_status("bare", "completed", 10).await);
    assert_eq!(
        env.store.job_get("banded").await.unwrap().unwrap().priority,
        3
    );
    assert_eq!(
        env.store.job_get("bare").await.unwrap().unwrap().priority,
        5
    );
    w.shutdown().await;
}

#[tokio::test]
async fn fifty_concurrent_enqueues_with_one_key_make_one_job_and_another_payload_is_a_conflict() {
    let env = TestEnv::new(&rust_queue("work", "")).await;
    let client = Client::new(env.store.clone(), env.broker.clone());
    let key_opts = || EnqueueOptions {
        idempotency_key: Some("order-42".into()),
        ..Default::default()
    };
    let tries = (0..50).map(|_| {
        let client = client.clone();
        let opts = key_opts();
        async move { client.enqueue("work", json!({"order": 42}), opts).await }
    });
    let results = futures::future::join_all(tries).await;
    let ids: std::collections::HashSet<String> = results
        .into_iter()
        .map(|r| r.expect("same key, same payload: the existing job").id)
        .collect();
    assert_eq!(ids.len(), 1, "one key made {} jobs", ids.len());
    let rows = env.scalar("SELECT count(*) FROM jobs").await;
    assert_eq!(rows, 1);
    // The one job runs, once; an enqueue with the key after it finished is still that job.
    let runs = Arc::new(Mutex::new(Vec::<String>::new()));
    let r = runs.clone();
    let h = from_fn(move |job| {
        let r = r.clone();
        async move {
            r.lock().unwrap().push(job.id.clone());
            Ok(None)
        }
    });
    let worker = env.worker(&[("h", h)]).await;
    let only = ids.iter().next().unwrap().clone();
    assert!(env.wait_status(&only, "completed", 10).await);
    let again = client
        .enqueue("work", json!({"order": 42}), key_opts())
        .await
        .unwrap();
    assert!(!again.created && again.id == only, "{again:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(*runs.lock().unwrap(), vec![only.clone()], "runs");
    worker.shutdown().await;
    // The same key for another payload is another job: a clear error, nothing stored.
    let err = client
        .enqueue("work", json!({"order": 43}), key_opts())
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, jobwarden::client::ClientError::Conflict(_)),
        "{text}"
    );
    assert!(
        text.contains("\"order-42\"") && text.contains("another payload"),
        "{text}"
    );
    // The same id for another payload too.
    let id = ids.into_iter().next().unwrap();
    let err = env
        .enqueue_id("work", &id, json!({"order": 44}))
        .await
        .unwrap_err();
    assert!(err.to_string().contains(&format!("job id {id:?}")), "{err}");
    assert_eq!(env.scalar("SELECT count(*) FROM jobs").await, 1);
    // The CLI says so too, and fails.
    let out = env.cli(&[
        "enqueue",
        "work",
        r#"{"order": 45}"#,
        "--idempotency-key",
        "order-42",
    ]);
    assert!(!out.status.success());
    assert!(
        common::text(&out).contains("another payload"),
        "{}",
        common::text(&out)
    );
}

#[tokio::test]
async fn delayed_jobs_start_within_a_second_of_due_also_from_plain_nats_publishers() {
    let env = TestEnv::new(&rust_queue("work", "")).await;
    let (h, starts) = timed(1);
    let w = env.worker(&[("h", h)]).await;
    let delay = Duration::from_secs(2);
    // A plain NATS publisher with run_at_ms in the envelope.
    let due_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
        + delay.as_millis() as i64;
    let t0 = Instant::now();
    env.publish_raw(
        "work",
        json!({"id": "nats-delayed", "payload": {"p": 5}, "run_at_ms": due_ms}).to_string(),
    )
    .await;
    // The client with a delay.
    Client::new(env.store.clone(), env.broker.clone())
        .enqueue(
            "work",
            json!({"p": 5}),
            EnqueueOptions {
                id: Some("client-delayed".into()),
                delay: Some(delay),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(env.wait_status("nats-delayed", "completed", 10).await);
    assert!(env.wait_status("client-delayed", "completed", 10).await);
    for (at, id, _) in starts.lock().unwrap().iter() {
        let after = *at - t0;
        println!("{id} started {after:?} after publish (due after {delay:?})");
        assert!(
            after >= delay - Duration::from_millis(50),
            "{id} started early: {after:?}"
        );
        assert!(
            after <= delay + Duration::from_secs(1),
            "{id} started {after:?} after publish, more than 1 s past due"
        );
    }
    w.shutdown().await;
}

#[tokio::test]
async fn jobs_show_says_what_a_job_waits_for() {
    let env = TestEnv::new(&rust_queue("work", "")).await;
    let client = Client::new(env.store.clone(), env.broker.clone());
    let enqueue = |id: &str, priority: i16, delay: Option<Duration>| {
        let client = client.clone();
        let id = id.to_string();
        async move {
            client
                .enqueue(
                    "work",
                    json!({}),
                    EnqueueOptions {
                        id: Some(id),
                        priority: Some(priority),
                        delay,
                        ..Default::default()
                    },
                )
                .await
                .unwrap();
        }
    };
    for i in 0..3 {
        enqueue(&format!("urgent-{i}"), 0, None).await;
    }
    enqueue("normal", 5, None).await;
    enqueue("later", 5, Some(Duration::from_secs(3600))).await;
    // No worker runs: everything waits.
    let show = |id: &str| common::text(&env.cli(&["jobs", "show", id]));
    let normal = show("normal");
    assert!(
        normal
            .contains("waiting for:   waits for a slot behind 3 queued job(s) of higher priority"),
        "{normal}"
    );
    assert!(normal.contains("no worker is running"), "{normal}");
    let later = show("later");
    assert!(
        later.contains("waits for its run_at: due in 59m"),
        "{later}"
    );
    let first = show("urgent-0");
    assert!(first.contains("next in line"), "{first}");
}

/// Calls the schema's SQL `enqueue(<args>)` as any application would: the job's id, or
/// PostgreSQL's message.
async fn sql_enqueue(
    db: &impl tokio_postgres::GenericClient,
    schema: &str,
    args: &str,
) -> Result<String, String> {
    db.query_one(&format!("SELECT \"{schema}\".enqueue({args})"), &[])
        .await
        .map(|r| r.get(0))
        .map_err(|e| {
            e.as_db_error()
                .expect("a database error")
                .message()
                .to_string()
        })
}

/// A business table in the test's schema, for the outbox tests.
async fn orders_table(env: &TestEnv) -> tokio_postgres::Client {
    let mut cfg: tokio_postgres::Config = common::test_database_url().parse().unwrap();
    cfg.options(format!("-c search_path={}", env.config.database.schema));
    let (client, conn) = cfg.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    client
        .batch_execute("CREATE TABLE orders (id int PRIMARY KEY)")
        .await
        .unwrap();
    client
}

#[tokio::test]
async fn outbox_a_rolled_back_enqueue_never_runs_and_a_committed_one_runs_at_once() {
    let env = TestEnv::new(&rust_queue("work", "")).await;
    let (h, starts) = timed(1);
    let w = env.worker(&[("h", h)]).await;
    let mut db = orders_table(&env).await;
    let client = Client::new(env.store.clone(), env.broker.clone());
    // Rolled back: the order and its job never existed.
    let tx = db.transaction().await.unwrap();
    tx.execute("INSERT INTO orders VALUES (1)", &[])
        .await
        .unwrap();
    let gone = client
        .enqueue_in(&tx, "work", json!({"order": 1}), EnqueueOptions::default())
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    // Committed, through the SQL function any language can call.
    let tx = db.transaction().await.unwrap();
    tx.execute("INSERT INTO orders VALUES (2)", &[])
        .await
        .unwrap();
    let schema = &env.config.database.schema;
    let order2 = r#"'work', '{"order": 2}'::jsonb, idempotency_key => 'order-2'"#;
    let kept = sql_enqueue(&tx, schema, order2).await.unwrap();
    // Not visible to workers before the commit.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(
        starts.lock().unwrap().is_empty(),
        "a job ran before its transaction committed"
    );
    let committed = Instant::now();
    tx.commit().await.unwrap();
    assert!(env.wait_status(&kept, "completed", 10).await);
    let started = starts.lock().unwrap()[0].0;
    println!("outbox: commit to handler start {:?}", started - committed);
    assert!(started - committed < Duration::from_secs(1));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        env.status_of(&gone).await,
        None,
        "the rolled-back job exists"
    );
    let ids: Vec<String> = starts.lock().unwrap().iter().map(|s| s.1.clone()).collect();
    assert_eq!(ids, vec![kept.clone()]);
    // The same key and payload return the same job; another payload is a clear error.
    assert_eq!(sql_enqueue(&db, schema, order2).await.unwrap(), kept);
    let msg = sql_enqueue(
        &db,
        schema,
        r#"'work', '{"order": 3}'::jsonb, idempotency_key => 'order-2'"#,
    )
    .await
    .unwrap_err();
    assert!(
        msg.contains("'order-2'") && msg.contains(&kept) && msg.contains("another payload"),
        "{msg}"
    );
    let err = client
        .enqueue_in(
            &db,
            "work",
            json!({"order": 3}),
            EnqueueOptions {
                idempotency_key: Some("order-2".into()),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, jobwarden::client::ClientError::Conflict(_)),
        "{err}"
    );
    // Bad input names the field and the right form.
    let msg = sql_enqueue(&db, schema, "'work', '{}'::jsonb, priority => 12")
        .await
        .unwrap_err();
    assert!(
        msg.contains("field `priority` is invalid: 12 is not a whole number from 0 to 9"),
        "{msg}"
    );
    let msg = sql_enqueue(&db, schema, "'work', '[1]'::jsonb")
        .await
        .unwrap_err();
    assert!(
        msg.contains("field `payload` must be an object, found an array"),
        "{msg}"
    );
    w.shutdown().await;
}

#[tokio::test]
async fn outbox_a_relay_killed_between_commit_and_publish_loses_nothing() {
    let mut env = TestEnv::new(&rust_queue("work", "")).await;
    // The relay: a worker process (any worker's scheduler publishes every due job).
    let mut relay_cfg = env.config.clone();
    relay_cfg.queues.clear();
    relay_cfg.queues.insert(
        "other".into(),
        jobwarden::config::Config::from_toml(
            "[queues.other]\nhandler = { kind = \"exec\", command = [\"true\"] }\n",
        )
        .unwrap()
        .queues["other"]
            .clone(),
    );
    relay_cfg.worker.scheduler_every = Duration::from_millis(100);
    let mut relay = common::ChildWorker::spawn(&relay_cfg, "relay");
    tokio::time::sleep(Duration::from_secs(2)).await;
    // NATS goes away: the relay cannot publish what commits now.
    env.nats.kill();
    let db = orders_table(&env).await;
    let schema = env.config.database.schema.clone();
    let id = sql_enqueue(&db, &schema, r#"'work', '{"order": 7}'::jsonb"#)
        .await
        .unwrap();
    // The relay tries, fails, and is killed before it could publish.
    tokio::time::sleep(Duration::from_secs(1)).await;
    relay.kill9();
    assert_eq!(env.status_of(&id).await.as_deref(), Some("scheduled"));
    env.nats.restart().unwrap();
    // Another worker (a relay too) publishes and runs it, once.
    let (h, starts) = timed(1);
    let w = env.worker(&[("h", h)]).await;
    assert!(env.wait_status(&id, "completed", 20).await);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let runs: Vec<String> = starts.lock().unwrap().iter().map(|s| s.1.clone()).collect();
    assert_eq!(runs, vec![id]);
    w.shutdown().await;
}

/// Intervals of every run (in-process handlers): start and end.
type Runs = Arc<Mutex<Vec<(Instant, Instant)>>>;

fn interval_recorder(ms: u64) -> (Arc<dyn jobwarden::Handler>, Runs) {
    let runs: Runs = Arc::default();
    let r = runs.clone();
    let h = from_fn(move |_job| {
        let r = r.clone();
        async move {
            let start = Instant::now();
            tokio::time::sleep(Duration::from_millis(ms)).await;
            r.lock().unwrap().push((start, Instant::now()));
            Ok(None)
        }
    });
    (h, runs)
}

/// The most intervals that overlap at any moment.
fn max_overlap(runs: &[(Instant, Instant)]) -> usize {
    let mut edges: Vec<(Instant, i32)> =
        runs.iter().flat_map(|(s, e)| [(*s, 1), (*e, -1)]).collect();
    // Ends before starts at the same instant.
    edges.sort_by_key(|(t, d)| (*t, *d));
    let (mut now, mut most) = (0i32, 0i32);
    for (_, d) in edges {
        now += d;
        most = most.max(now);
    }
    most as usize
}

#[tokio::test]
async fn a_cluster_wide_cap_of_3_holds_across_3_workers_with_5_slots_each() {
    let env = TestEnv::new(&rust_queue(
        "work",
        "concurrency = 5\nglobal_concurrency = 3\n",
    ))
    .await;
    let (h, runs) = interval_recorder(200);
    let mut workers = Vec::new();
    for _ in 0..3 {
        workers.push(env.worker(&[("h", h.clone())]).await);
    }
    publish_many(&env, "jobs.work", 30, 5).await;
    let t0 = Instant::now();
    assert!(env.wait_count("completed", 30, 60).await);
    let took = t0.elapsed();
    let runs = runs.lock().unwrap().clone();
    let most = max_overlap(&runs);
    println!("cap 3: 30 jobs of 200 ms in {took:?}, at most {most} running at once");
    assert!(most <= 3, "{most} jobs ran at once under a cap of 3");
    assert_eq!(
        most, 3,
        "the cap was never reached (the test proves nothing)"
    );
    for w in workers {
        w.shutdown().await;
    }
}

/// A TCP relay to `127.0.0.1:upstream` that counts the connections made through it: while
/// the server is down, each try of a PostgreSQL client is one (the relay accepts it and
/// closes it, as its connect to the server fails).
async fn counting_relay(upstream: u16) -> (u16, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let tries = Arc::new(AtomicUsize::new(0));
    let counted = tries.clone();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let server = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await;
                if let Ok(mut server) = server {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut server).await;
                }
            });
        }
    });
    (port, tries)
}

#[tokio::test]
async fn every_kind_of_queue_backs_off_through_a_postgres_outage() {
    // A job ends while PostgreSQL is down: what its queue's producer tells the store of it
    // (a capped queue's counts, a keyed queue's take) fails, and must be retried with the
    // backoff of every other service, not each time the producer's loop turns. One worker
    // per kind of queue, each through its own counting relay, all through one outage.
    let queues = [
        "concurrency = 2\n",
        "concurrency = 2\nglobal_concurrency = 2\n",
        "concurrency = 2\nrate_limit = \"100/1s\"\n",
        "concurrency = 2\nkey_concurrency = 1\n",
        "concurrency = 2\nfair_by_key = true\n",
        "concurrency = 2\nordered_by_key = true\n",
    ];
    let pg = common::testkit::PgCluster::start().unwrap();
    let mut cases = Vec::new();
    for queue in queues {
        let (port, tries) = counting_relay(pg.port()).await;
        let env = TestEnv::with_database(&pg.url(), &rust_queue("work", queue)).await;
        let mut cfg = env.config.clone();
        cfg.database.url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
        let (h, starts) = timed(1500);
        let w = env.worker_with(cfg, &[("h", h)]).await;
        cases.push((queue, env, w, tries, starts));
    }
    for (_, env, ..) in &cases {
        env.publish_raw("work", r#"{"id":"j-1","key":"k","payload":{}}"#)
            .await;
    }
    for (queue, _, _, _, starts) in &cases {
        let started = wait_for(Duration::from_secs(20), || async {
            !starts.lock().unwrap().is_empty()
        });
        assert!(started.await, "{queue:?}: the job never started");
    }
    pg.stop_immediate().unwrap();
    let before: Vec<usize> = cases.iter().map(|c| c.3.load(Ordering::SeqCst)).collect();
    // The jobs end 1.5 s after they started, in the outage.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let during: Vec<usize> = cases
        .iter()
        .zip(before)
        .map(|(c, b)| c.3.load(Ordering::SeqCst) - b)
        .collect();
    pg.start_again().unwrap();
    for ((queue, env, w, ..), during) in cases.into_iter().zip(during) {
        println!("{queue:?}: connections tried during 4 s of outage: {during}");
        // Each service retries a few times in 4 s (waits doubling from 100-200 ms): 24 to
        // 30 tries in all, seen. A capped queue's report retried at every turn of the
        // producer's loop tried 16,322 times; one retried every 50 ms would try 80.
        assert!(
            during <= 60,
            "{queue:?}: {during} connections tried in 4 s of outage: a retry without backoff"
        );
        assert!(
            env.wait_status("j-1", "completed", 30).await,
            "{queue:?}: the job did not complete after the outage"
        );
        env.publish_raw("work", r#"{"id":"j-2","key":"k","payload":{}}"#)
            .await;
        assert!(
            env.wait_status("j-2", "completed", 30).await,
            "{queue:?}: the queue did not run a job after the outage"
        );
        w.shutdown().await;
    }
}

/// Starts (from `job_attempts`, the claim's database time) in the busiest window of `w`.
async fn busiest_window(env: &TestEnv, w: Duration) -> (i64, Vec<f64>) {
    let c = env.store.raw().await.unwrap();
    let starts: Vec<f64> = c
        .query(
            "SELECT extract(epoch FROM started_at)::float8 FROM job_attempts \
             WHERE outcome = 'completed' ORDER BY started_at",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let w = w.as_secs_f64();
    let most = (0..starts.len())
        .map(|i| {
            starts[i..]
                .iter()
                .take_while(|s| **s < starts[i] + w)
                .count() as i64
        })
        .max()
        .unwrap_or(0);
    (most, starts)
}

async fn rate_limited_run(limit: &str, window: Duration, n: usize, max_total: Duration) {
    let app = common::RecordingApp::start().await;
    let env = TestEnv::new(&format!(
        "[queues.work]\nconcurrency = 10\nrate_limit = \"{limit}\"\n\
         handler = {{ kind = \"http\", url = \"{}\" }}\n",
        app.url
    ))
    .await;
    let mut pods: Vec<common::ChildWorker> = (0..3)
        .map(|i| common::ChildWorker::spawn(&env.config, &format!("pod-{i}")))
        .collect();
    publish_many(&env, "jobs.work", n, 5).await;
    let t0 = Instant::now();
    let all = env
        .wait_count("completed", n as i64, max_total.as_secs() + 30)
        .await;
    let took = t0.elapsed();
    let (most, starts) = busiest_window(&env, window).await;
    let limit_n: i64 = limit.split('/').next().unwrap().parse().unwrap();
    println!(
        "rate {limit}: {} of {n} jobs in {took:?} over 3 worker processes; busiest {window:?} window: {most} starts",
        starts.len()
    );
    for p in pods.iter_mut() {
        p.kill9();
    }
    assert!(all, "only {} of {n} jobs completed", starts.len());
    assert!(
        most <= limit_n,
        "{most} starts in one {window:?} window, over {limit}"
    );
    assert!(
        most >= limit_n - 2,
        "the limit was never approached ({most})"
    );
    assert!(took <= max_total, "{n} jobs took {took:?}");
}

#[tokio::test]
async fn a_rate_limit_holds_across_3_worker_processes_in_every_window() {
    // 20 per 10 s, 200 jobs: about 100 s, never more than 20 starts in any 10 s.
    rate_limited_run(
        "20/10s",
        Duration::from_secs(10),
        200,
        Duration::from_secs(110),
    )
    .await;
}

/// The grants' bookkeeping at the store (schema version 25): one row per acquire, counting
/// what its worker reports (held, running, started); a row the worker no longer reports (an
/// answer it never got, an earlier process under its id) stops counting; and a worker of the
/// previous version, one row per grant through flow_acquire(), shares the cap with workers of
/// this one while pods roll, both ways.
#[tokio::test]
async fn grants_count_per_acquire_and_are_shared_with_workers_of_the_previous_version() {
    let env = TestEnv::new(&rust_queue("work", "")).await;
    env.register_other("new").await;
    env.register_other("old").await;
    let take = |w: &'static str, want: usize, rows: Vec<GrantCounts>| {
        let s = env.store.clone();
        async move {
            s.flow_take("capped", w, want, Some(15), None, &rows)
                .await
                .unwrap()
        }
    };
    let row = |id: Option<i64>, held: usize, running: usize, started: usize| GrantCounts {
        id: id.expect("a row for the grants"),
        held,
        running,
        started,
    };
    let old_acquire = |want: i32| {
        let env = &env;
        async move {
            env.scalar(&format!(
                "SELECT granted::int8 FROM flow_acquire('capped', 'old', {want}, 15, NULL, NULL)"
            ))
            .await
        }
    };
    let a = take("new", 10, vec![]).await;
    assert_eq!(a.granted, 10);
    assert_eq!(
        old_acquire(10).await,
        5,
        "the new worker's row counts for the old one"
    );
    assert_eq!(take("new", 10, vec![row(a.row, 10, 0, 0)]).await.granted, 0);
    // The new worker's claim used its 10: 8 started, 4 of them ended since. The old worker's
    // 5 rows end (its own statements: started, then done).
    env.scalar(
        "WITH d AS (UPDATE flow_grants SET started_at = now(), done = true, done_at = now()          WHERE worker_id = 'old' RETURNING 1) SELECT count(*) FROM d",
    )
    .await;
    let b = take("new", 20, vec![row(a.row, 0, 4, 8)]).await;
    assert_eq!(b.granted, 11, "4 running of 15");
    assert_eq!(
        old_acquire(3).await,
        0,
        "the new worker's rows, as reported, fill the cap"
    );
    // The answer that granted b never reached the worker: its next report, without b's row,
    // frees b's grants.
    take("new", 0, vec![row(a.row, 0, 4, 8)]).await;
    assert_eq!(old_acquire(20).await, 11);
    // The old worker's 11 rows (one per grant) count for the new one.
    let c = take("new", 5, vec![row(a.row, 0, 4, 8)]).await;
    assert_eq!((c.granted, c.row), (0, None));
    assert!(c.retry_in > Duration::ZERO, "{c:?}");
    // All of the new worker's jobs ended: its row is gone (a cap only: it counts for nothing).
    take("new", 0, vec![row(a.row, 0, 0, 8)]).await;
    assert_eq!(
        env.scalar("SELECT count(*) FROM flow_grants WHERE worker_id = 'new'")
            .await,
        0
    );
    assert_eq!(
        take("new", 10, vec![]).await.granted,
        4,
        "15 less the old worker's 11"
    );
}

#[tokio::test]
async fn jobs_show_names_the_cluster_wide_cap_a_job_waits_for() {
    let env = TestEnv::new(&rust_queue("work", "global_concurrency = 1\n")).await;
    let (h, runs) = interval_recorder(3000);
    let w = env.worker(&[("h", h)]).await;
    for id in ["first", "second"] {
        env.enqueue_id("work", id, json!({})).await.unwrap();
    }
    assert!(env.wait_status("first", "processing", 10).await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(env.status_of("second").await.as_deref(), Some("queued"));
    let out = common::text(&env.cli(&["jobs", "show", "second"]));
    assert!(
        out.contains("waits for the queue's cluster-wide cap: 1 of 1 running"),
        "{out}"
    );
    assert!(env.wait_status("second", "completed", 15).await);
    assert_eq!(max_overlap(&runs.lock().unwrap()), 1);
    w.shutdown().await;
}

#[tokio::test]
async fn the_payments_example_charges_each_order_once_and_a_rollback_leaves_nothing() {
    let env = TestEnv::new(&rust_queue("work", "")).await;
    // target/<profile>/deps/flow-… → target/<profile>/examples/payments
    let exe = std::env::current_exe()
        .unwrap()
        .parent()
        .and_then(|d| d.parent())
        .unwrap()
        .join("examples/payments");
    assert!(
        exe.exists(),
        "{} is missing: build it first with `cargo build --examples` (scripts/test.sh does)",
        exe.display()
    );
    let out = tokio::process::Command::new(&exe)
        .arg("--self-test")
        .env("JOBWARDEN_DATABASE__URL", common::test_database_url())
        .env("JOBWARDEN_DATABASE__SCHEMA", &env.config.database.schema)
        .env("JOBWARDEN_NATS__URL", env.nats.url())
        .env("RUST_LOG", "warn")
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(90), out)
        .await
        .expect("the example did not finish within 90 s")
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("self-test: 20 orders accepted, 20 paid, 20 charged (20 charges in all, 20 orders stored"),
        "{text}"
    );
    // The provider's ledger is idempotent (a second run charges nothing): every call that
    // reached it is counted too, one per claim, each claim but the last ended on record.
    assert!(
        text.contains("runs: 20 provider calls, 20 claims of 20 payment jobs, 0 unexplained"),
        "{text}"
    );
}

/// The fire time a cron job's id begins with (`cron:<name>:<RFC 3339, seconds>`), in Unix
/// seconds.
fn fire_of(name: &str, id: &str) -> Option<i64> {
    let at = id.strip_prefix(&format!("cron:{name}:"))?.get(..20)?;
    Some(chrono::DateTime::parse_from_rfc3339(at).ok()?.timestamp())
}

#[tokio::test]
async fn a_cron_fire_every_2_s_is_enqueued_once_across_3_workers_with_one_killed_mid_run() {
    let app = common::RecordingApp::start().await;
    let env = TestEnv::new(&format!(
        "[queues.work]\nhandler = {{ kind = \"http\", url = \"{}\" }}\n\
         [cron.tick]\nschedule = \"*/2 * * * * *\"\nqueue = \"work\"\npayload = {{ kind = \"tick\" }}\n",
        app.url
    ))
    .await;
    let mut pods: Vec<common::ChildWorker> = (0..3)
        .map(|i| common::ChildWorker::spawn(&env.config, &format!("cron-{i}")))
        .collect();
    let completed = || async {
        env.scalar("SELECT count(*) FROM jobs WHERE id LIKE 'cron:tick:%' AND status = 'completed'")
            .await
    };
    // A few fires run while all three pods tick (one fire every 2 s).
    assert!(
        wait_for(Duration::from_secs(15), || async { completed().await >= 2 }).await,
        "no 2 cron fires completed within 15 s with 3 workers ticking"
    );
    // One of them (whichever was ticking) dies mid-run; the survivors go on.
    pods[0].kill9();
    let before = completed().await;
    assert!(
        wait_for(Duration::from_secs(15), || async {
            completed().await >= before + 4
        })
        .await,
        "fewer than 4 cron fires completed within 15 s after a worker was killed"
    );
    for p in pods.iter_mut().skip(1) {
        p.kill9();
    }
    // Runs per fire, as the application saw them: every call, not what the table kept.
    let mut calls: HashMap<String, usize> = HashMap::new();
    for s in app.starts.lock().unwrap().iter() {
        *calls.entry(s.id.clone()).or_default() += 1;
    }
    let mut per_fire: BTreeMap<String, Vec<(String, usize)>> = BTreeMap::new();
    for (id, n) in &calls {
        let fire = fire_of("tick", id)
            .and_then(|s| chrono::DateTime::from_timestamp(s, 0))
            .unwrap_or_else(|| panic!("the app ran {id}, which is no fire of schedule tick"));
        per_fire
            .entry(fire.to_rfc3339())
            .or_default()
            .push((id.clone(), *n));
    }
    let doubled: Vec<_> = per_fire
        .iter()
        .filter(|(_, jobs)| jobs.len() != 1 || jobs[0].1 != 1)
        .collect();
    println!(
        "cron: {} fires ran, {} of them not exactly once: {doubled:?}",
        per_fire.len(),
        doubled.len()
    );
    // A fire is one job whatever the pods do; its job runs once, or again only after a
    // crash jobwarden recorded (the killed pod may have held one).
    for (fire, jobs) in &per_fire {
        assert_eq!(
            jobs.len(),
            1,
            "fire {fire} ran as {} jobs {jobs:?}: the pods each enqueued it",
            jobs.len()
        );
    }
    let c = env.store.raw().await.unwrap();
    let unexplained = common::evidence::unexplained_runs(&c, &["work"], &calls)
        .await
        .unwrap();
    assert!(
        unexplained.is_empty(),
        "fires ran more often than jobwarden's record explains:\n{}",
        unexplained.join("\n")
    );
    let rows = c
        .query(
            "SELECT id, (extract(epoch FROM scheduled_at))::float8, payload, status, lease FROM jobs \
             WHERE id LIKE 'cron:tick:%' ORDER BY id",
            &[],
        )
        .await
        .unwrap();
    for r in &rows {
        let (id, lease): (String, i64) = (r.get(0), r.get(4));
        if lease == 1 && r.get::<_, String>(3) == "completed" {
            assert_eq!(
                calls.get(&id),
                Some(&1),
                "fire {id} ran {:?} times",
                calls.get(&id)
            );
        }
    }
    // The fire time is in the id (the job is due when the tick enqueued it, a moment later).
    let fires: Vec<f64> = rows
        .iter()
        .map(|r| {
            let id: String = r.get(0);
            fire_of("tick", &id).unwrap_or_else(|| panic!("{id} is no fire of tick")) as f64
        })
        .collect();
    println!(
        "cron: {} fires enqueued: {:?}",
        fires.len(),
        rows.iter()
            .map(|r| r.get::<_, String>(0))
            .collect::<Vec<_>>()
    );
    assert!(fires.len() >= 5, "only {} fires enqueued", fires.len());
    for pair in fires.windows(2) {
        let gap = pair[1] - pair[0];
        assert!(
            (gap - 2.0).abs() < 0.01,
            "fires {pair:?} are {gap} s apart: one was missed or doubled"
        );
    }
    for (r, fire) in rows.iter().zip(&fires) {
        assert_eq!(r.get::<_, Value>(2), json!({"kind": "tick"}));
        assert_eq!(fire % 2.0, 0.0, "fire off the schedule");
        // Enqueued at the next tick (every 500 ms); a loaded machine and a worker killed
        // while it held the schedule's row add a moment.
        let late = r.get::<_, f64>(1) - fire;
        assert!((0.0..3.0).contains(&late), "fire enqueued {late} s late");
    }
    // Every fire but the newest ones has run.
    let done = rows
        .iter()
        .filter(|r| r.get::<_, String>(3) == "completed")
        .count();
    assert!(
        done >= fires.len() - 2,
        "{done} of {} fires ran",
        fires.len()
    );
    // `jobwarden cron list` shows the schedule, its last fire and the next ones.
    let path = std::env::temp_dir().join(format!("jobwarden-cron-{}.toml", std::process::id()));
    std::fs::write(&path, env.config.to_redacted_toml()).unwrap();
    let out = common::text(&env.cli(&["--config", path.to_str().unwrap(), "cron", "list"]));
    let _ = std::fs::remove_file(&path);
    assert!(
        out.contains("tick") && out.contains("*/2 * * * * *"),
        "{out}"
    );
    let last = rows.last().unwrap().get::<_, String>(0);
    let last_time = last.trim_start_matches("cron:tick:").replace('T', " ");
    assert!(out.contains(last_time.trim_end_matches('Z')), "{out}");
}

#[tokio::test]
async fn after_downtime_missed_cron_fires_are_skipped_or_run_once() {
    let env = TestEnv::new(&format!(
        "{}[cron.catchup]\nschedule = \"*/10 * * * * *\"\nqueue = \"work\"\nmissed = \"run_once\"\n\
         [cron.skipper]\nschedule = \"*/10 * * * * *\"\nqueue = \"work\"\nmissed = \"skip\"\n",
        rust_queue("work", "")
    ))
    .await;
    // Both last fired 5 minutes ago; every worker was down since.
    let c = env.store.raw().await.unwrap();
    c.execute(
        "INSERT INTO cron_state (name, last_fire_at) VALUES \
         ('catchup', now() - interval '5 minutes'), ('skipper', now() - interval '5 minutes')",
        &[],
    )
    .await
    .unwrap();
    let started = chrono::Utc::now();
    let (h, _starts) = timed(1);
    let w = env.worker(&[("h", h)]).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let fires = |name: &str| {
        let c = &c;
        let name = name.to_string();
        async move {
            let rows = c
                .query(
                    "SELECT id FROM jobs WHERE id LIKE 'cron:' || $1 || ':%' ORDER BY id",
                    &[&name],
                )
                .await
                .unwrap();
            rows.iter()
                .map(|r| {
                    let id: String = r.get(0);
                    chrono::DateTime::parse_from_rfc3339(
                        id.trim_start_matches(&format!("cron:{name}:")),
                    )
                    .unwrap()
                    .with_timezone(&chrono::Utc)
                })
                .collect::<Vec<_>>()
        }
    };
    // Fires of the last two seconds may be enqueued for one schedule and not yet for the
    // other (one tick does them one after the other): compare what is older.
    let settled = chrono::Utc::now() - chrono::Duration::seconds(2);
    let catchup: Vec<_> = fires("catchup")
        .await
        .into_iter()
        .filter(|t| *t < settled)
        .collect();
    let skipper: Vec<_> = fires("skipper")
        .await
        .into_iter()
        .filter(|t| *t < settled)
        .collect();
    println!("run_once: {catchup:?}\nskip: {skipper:?}");
    // Skip: only fires within 30 s of a tick (which came after `started`) make jobs.
    let missed_before = started - chrono::Duration::seconds(31);
    assert!(
        !skipper.is_empty() && skipper.iter().all(|t| *t >= missed_before),
        "skip: missed fires should make no job, on-time ones one each: {skipper:?}"
    );
    // Run once: the same on-time fires, plus one job for all the missed ones: the latest
    // of them, the fire just before the first on-time one.
    let extra: Vec<_> = catchup.iter().filter(|t| !skipper.contains(t)).collect();
    assert!(
        skipper.iter().all(|t| catchup.contains(t)),
        "on-time fires run under both policies: {catchup:?} / {skipper:?}"
    );
    assert_eq!(
        extra.len(),
        1,
        "run_once: the 27 missed fires should make one job: {catchup:?}"
    );
    assert_eq!(
        skipper[0] - *extra[0],
        chrono::Duration::seconds(10),
        "run_once runs the latest missed fire: {catchup:?}"
    );
    w.shutdown().await;
}

/// The ids of the jobs a handler started, in order.
type Started = Arc<Mutex<Vec<String>>>;

/// A handler that runs each job `payload.ms` milliseconds; it records how many ran at once
/// and which it started.
fn counting() -> (Arc<dyn jobwarden::Handler>, Arc<AtomicUsize>, Started) {
    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let started: Started = Arc::default();
    let (m, s) = (most.clone(), started.clone());
    let h = from_fn(move |job| {
        let (running, most) = (running.clone(), m.clone());
        s.lock().unwrap().push(job.id.clone());
        async move {
            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            let ms = job.payload["ms"].as_u64().unwrap_or(0);
            if ms > 0 {
                tokio::time::sleep(Duration::from_millis(ms)).await;
            } else {
                tokio::task::yield_now().await;
            }
            running.fetch_sub(1, Ordering::SeqCst);
            Ok(None)
        }
    });
    (h, most, started)
}

/// Every job ran to completion exactly once, its attempt counted once.
async fn each_completed_once(env: &TestEnv, n: i64) {
    assert_eq!(env.count("completed").await, n);
    assert_eq!(env.scalar("SELECT count(*) FROM jobs").await, n);
    assert_eq!(
        env.scalar("SELECT count(*) FROM jobs WHERE attempts <> 1")
            .await,
        0,
        "a job's attempt was counted twice"
    );
}

/// Short jobs are claimed ahead of their slots (the next group's statement runs while the
/// last group still runs), yet never more than `concurrency` run at once.
#[tokio::test]
async fn short_jobs_are_claimed_ahead_of_their_slots_and_never_run_more_than_concurrency_at_once() {
    let env = TestEnv::new(&rust_queue("work", "concurrency = 4\n")).await;
    let (h, most, _) = counting();
    let w = env.worker(&[("h", h)]).await;
    // A backlog: the worker claims it in groups as fast as it can.
    publish_many(&env, "jobs.work", 2000, 5).await;
    assert!(env.wait_count("completed", 2000, 60).await);
    let ahead = common::stat(&w.stats.claimed_ahead);
    w.shutdown().await;
    let most = most.load(std::sync::atomic::Ordering::SeqCst);
    println!("claimed ahead of a slot: {ahead}; most running at once: {most}");
    assert!(ahead > 0, "no job was claimed ahead of its slot");
    assert!(most <= 4, "{most} jobs ran at once with 4 slots");
    each_completed_once(&env, 2000).await;
}

/// Jobs claimed ahead behind jobs that turn out long get no slot within a second: they go
/// back (attempt refunded), once — the queue claims nothing ahead from then on — and run once
/// the long ones end, never more at once than the slots.
#[tokio::test]
async fn jobs_claimed_ahead_that_get_no_slot_in_time_go_back_and_run_once_later() {
    let env = TestEnv::new(&rust_queue("work", "concurrency = 2\n")).await;
    let (h, most, _) = counting();
    let w = env.worker(&[("h", h)]).await;
    // Short jobs first: the queue claims ahead from then on.
    for _ in 0..40 {
        env.publish_raw("work", json!({"ms": 0}).to_string()).await;
    }
    assert!(env.wait_count("completed", 40, 30).await);
    // Two long jobs take both slots; the short ones behind them are claimed ahead.
    for _ in 0..2 {
        env.publish_raw("work", json!({"ms": 3500}).to_string())
            .await;
    }
    for _ in 0..6 {
        env.publish_raw("work", json!({"ms": 0}).to_string()).await;
    }
    assert!(env.wait_count("completed", 48, 30).await);
    let (ahead, released) = (
        common::stat(&w.stats.claimed_ahead),
        common::stat(&w.stats.released),
    );
    w.shutdown().await;
    println!("claimed ahead: {ahead}; given back: {released}");
    assert!(released > 0, "no job claimed ahead was given back");
    // At most the four claimed ahead (two groups of two), each once: not again every second
    // while the long jobs ran.
    assert!(
        released <= 4,
        "{released} jobs given back: some went back more than once"
    );
    let most = most.load(std::sync::atomic::Ordering::SeqCst);
    assert!(most <= 2, "{most} jobs ran at once with 2 slots");
    each_completed_once(&env, 48).await;
}

/// Runs 40 short jobs (from then on the queue claims ahead), then two long jobs that take
/// both slots, then `waiting` short jobs with ids `wait-1`, `wait-2`, …: these are claimed
/// ahead and wait for a slot. Returns once they are all claimed by this worker while none of
/// them has started.
async fn claimed_ahead_behind_long_jobs(
    env: &TestEnv,
    started: &Started,
    long_ms: u64,
    waiting: usize,
) {
    for _ in 0..40 {
        env.publish_raw("work", json!({"ms": 0}).to_string()).await;
    }
    assert!(env.wait_count("completed", 40, 30).await);
    for i in 1..=2 {
        let body = json!({"id": format!("long-{i}"), "payload": {"ms": long_ms}});
        env.publish_raw("work", body.to_string()).await;
    }
    assert!(
        wait_for(Duration::from_secs(10), || async {
            started.lock().unwrap().len() == 42
        })
        .await
    );
    for i in 1..=waiting {
        let body = json!({"id": format!("wait-{i}"), "payload": {"ms": 0}});
        env.publish_raw("work", body.to_string()).await;
    }
    let claimed = "SELECT count(*) FROM jobs WHERE id LIKE 'wait-%' AND status = 'processing'";
    assert!(
        wait_for(Duration::from_millis(900), || async {
            env.scalar(claimed).await == waiting as i64
        })
        .await,
        "the short jobs behind the long ones were not claimed ahead of a slot"
    );
    let ran: Vec<String> = started.lock().unwrap().clone();
    assert!(
        !ran.iter().any(|id| id.starts_with("wait-")),
        "a job claimed ahead ran while both slots were taken: {ran:?}"
    );
}

/// A job claimed ahead that is cancelled while it waits for a slot never runs, and costs the
/// others nothing: they run once each.
#[tokio::test]
async fn a_job_claimed_ahead_and_cancelled_while_it_waits_for_a_slot_never_runs() {
    let env = TestEnv::new(&format!(
        "heartbeat_every = \"200ms\"\n{}",
        rust_queue("work", "concurrency = 2\n")
    ))
    .await;
    let (h, most, started) = counting();
    let w = env.worker(&[("h", h)]).await;
    claimed_ahead_behind_long_jobs(&env, &started, 3000, 2).await;
    let out = env.cli(&["jobs", "cancel", "wait-1"]);
    assert!(
        common::text(&out).contains("wait-1 cancelled (it was processing"),
        "{}",
        common::text(&out)
    );
    assert!(env.wait_count("completed", 43, 30).await);
    // Let the owner hear of the cancel and the long jobs end: nothing more may run.
    tokio::time::sleep(Duration::from_secs(1)).await;
    w.shutdown().await;
    let ran = started.lock().unwrap().clone();
    assert!(
        !ran.iter().any(|id| id == "wait-1"),
        "the cancelled job ran: {ran:?}"
    );
    assert_eq!(ran.iter().filter(|id| *id == "wait-2").count(), 1);
    assert_eq!(env.status_of("wait-1").await.as_deref(), Some("cancelled"));
    assert_eq!(env.count("completed").await, 43);
    assert_eq!(
        env.scalar("SELECT count(*) FROM jobs WHERE status = 'completed' AND attempts <> 1")
            .await,
        0
    );
    let most = most.load(std::sync::atomic::Ordering::SeqCst);
    assert!(most <= 2, "{most} jobs ran at once with 2 slots");
}

/// A worker that drains while jobs claimed ahead wait for a slot gives them back at once (it
/// starts nothing new): another worker runs each of them once, its attempt counted once; the
/// long jobs that were running finish where they ran.
#[tokio::test]
async fn a_draining_worker_gives_back_the_jobs_claimed_ahead_at_once_and_each_runs_once() {
    let env = TestEnv::new(&rust_queue("work", "concurrency = 2\n")).await;
    let (h, most, started) = counting();
    let w = env.worker(&[("h", h)]).await;
    claimed_ahead_behind_long_jobs(&env, &started, 800, 4).await;
    let report = w.shutdown().await;
    let ran = started.lock().unwrap().clone();
    assert!(
        !ran.iter().any(|id| id.starts_with("wait-")),
        "a job claimed ahead started while the worker drained: {ran:?}"
    );
    assert_eq!(report.released, 4, "{report:?}");
    assert_eq!(env.status_of("long-1").await.as_deref(), Some("completed"));
    assert_eq!(env.status_of("long-2").await.as_deref(), Some("completed"));
    let (h2, most2, started2) = counting();
    let w2 = env.worker(&[("h", h2)]).await;
    assert!(env.wait_count("completed", 46, 30).await);
    w2.shutdown().await;
    let ran2 = started2.lock().unwrap().clone();
    for i in 1..=4 {
        let id = format!("wait-{i}");
        assert_eq!(ran2.iter().filter(|r| **r == id).count(), 1, "{ran2:?}");
    }
    each_completed_once(&env, 46).await;
    for most in [most, most2] {
        let most = most.load(std::sync::atomic::Ordering::SeqCst);
        assert!(most <= 2, "{most} jobs ran at once with 2 slots");
    }
}

/// A worker that stops while its claim statements wait on the database and more messages
/// wait behind them for a statement to go out (the ready buffer): the claims that commit
/// during the drain are given back (attempt refunded) before the drain returns, and counted
/// in its report; the waiting messages go back to the stream; nothing starts; and another
/// worker runs every job once.
#[tokio::test]
async fn a_worker_stopping_with_claims_in_flight_and_messages_waiting_to_be_claimed_loses_and_doubles_nothing(
) {
    let env = TestEnv::new(&rust_queue("work", "concurrency = 512\n")).await;
    let (h, _, started) = counting();
    // Claim groups of 64: the two statements in flight hold at most 128 messages, so of the
    // more than 256 the worker takes, some always wait for a statement (with groups of 256,
    // a slow machine could fit every message it took in the two).
    let mut config = env.config.clone();
    config.worker.claim_batch = 64;
    let w = env.worker_with(config, &[("h", h)]).await;
    // Hold every claim: an insert waits for this lock.
    let mut lock = env.store.raw().await.unwrap();
    let tx = lock.transaction().await.unwrap();
    tx.batch_execute("LOCK TABLE jobs IN SHARE MODE")
        .await
        .unwrap();
    publish_many(&env, "jobs.work", 600, 5).await;
    // The worker takes up to as many as it has slots for: two groups in claim statements,
    // the rest waiting for one of them to answer. (How many it has taken when it stops
    // pulling depends on how the publishes and pulls interleave: a producer that must wait
    // for a claim slot waits there, so it may hold fewer than 512.)
    let mut taken = 0;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = env.consumer_backlog("work").await.1;
        if now > 256 && now == taken {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the worker did not take more than a claim group: {now}"
        );
        taken = now;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let stopping = tokio::spawn(w.shutdown());
    tokio::time::sleep(Duration::from_millis(300)).await;
    tx.commit().await.unwrap();
    let report = stopping.await.unwrap();
    println!("given back by the drain: {report:?}");
    assert!(
        started.lock().unwrap().is_empty(),
        "a job started during the drain"
    );
    assert!(report.released > 0, "no claim was in flight: {report:?}");
    assert!(
        report.released < taken as u64,
        "every message taken ({taken}) was in a claim statement, none waiting: {report:?}"
    );
    assert_eq!(report.finished, 0, "{report:?}");
    let (h2, _, started2) = counting();
    let w2 = env.worker(&[("h", h2)]).await;
    assert!(env.wait_count("completed", 600, 60).await);
    w2.shutdown().await;
    assert_eq!(started2.lock().unwrap().len(), 600);
    each_completed_once(&env, 600).await;
    env.wait_consumer_drained("work").await;
}

/// Two workers' takes of one rate-limited queue never wait for each other's grant rows: a
/// take deletes the rows that count for nothing any more, and skips one another worker's
/// take is writing (that worker waits for the queue's row this take holds: waiting for its
/// rows was a deadlock, found by PostgreSQL after a second; version 33).
#[tokio::test]
async fn a_take_skips_the_spent_grant_rows_another_workers_take_is_writing() {
    let env = TestEnv::new(
        "[queues.work]\nconcurrency = 2\nrate_limit = \"100/1s\"\n\
         handler = { kind = \"rust\", name = \"h\" }\n",
    )
    .await;
    env.register_other("a").await;
    env.register_other("b").await;
    let c = env.store.raw().await.unwrap();
    c.execute(
        "INSERT INTO flow_grants (queue, worker_id, granted_at, started_at, done, done_at, \
         per_batch, held, running, started) \
         VALUES ('work', 'a', now() - interval '1 minute', now() - interval '1 minute', true, \
                 now() - interval '1 minute', true, 0, 0, 1)",
        &[],
    )
    .await
    .unwrap();
    // Worker a's take has written its rows and not committed yet.
    let mut a = env.store.raw().await.unwrap();
    let a_take = a.transaction().await.unwrap();
    a_take
        .execute(
            "UPDATE flow_grants SET started = started WHERE worker_id = 'a'",
            &[],
        )
        .await
        .unwrap();
    // Worker b's take meanwhile: it must not wait for a's rows.
    let mut b = env.store.raw().await.unwrap();
    let b_take = b.transaction().await.unwrap();
    b_take
        .batch_execute("SET LOCAL statement_timeout = '3s'")
        .await
        .unwrap();
    let took = std::time::Instant::now();
    let got = b_take
        .query(
            "SELECT * FROM flow_take('work', 'b', 1, NULL, 100, 1000, '{}', '{}', '{}', '{}')",
            &[],
        )
        .await;
    assert!(got.is_ok(), "b's take waited for a's rows: {got:?}");
    assert!(
        took.elapsed() < Duration::from_secs(2),
        "{:?}",
        took.elapsed()
    );
    b_take.commit().await.unwrap();
    a_take.rollback().await.unwrap();
    // The spent row goes in a later round.
    assert_eq!(
        env.scalar("SELECT count(*) FROM flow_grants WHERE worker_id = 'a'")
            .await,
        1
    );
    c.query(
        "SELECT * FROM flow_take('work', 'b', 1, NULL, 100, 1000, '{}', '{}', '{}', '{}')",
        &[],
    )
    .await
    .unwrap();
    assert_eq!(
        env.scalar("SELECT count(*) FROM flow_grants WHERE worker_id = 'a'")
            .await,
        0
    );
}
