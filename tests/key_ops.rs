//! Operating keyed queues (issue 31, items 2, 4 and 7) against real servers: per-key
//! overrides and the `jobwarden keys` commands, an ordered key's dead head retried or
//! skipped, why a parked job waits (`jobs show`), and the busiest keys (`stats`, `keys list`).

mod common;

use common::keyed::*;
use common::{text, TestEnv};
use jobwarden::config::{KeyRules, RateLimit};
use jobwarden::store::ClaimInput;
use serde_json::json;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const RUST: &str = "handler = { kind = \"rust\", name = \"h\" }\n";

fn rules(concurrency: Option<u32>) -> KeyRules {
    KeyRules {
        concurrency,
        fair: false,
        ordered: false,
        dead_blocks: false,
        rate: None,
    }
}

/// A configuration file with the queues (the servers come from the environment `env.cli`
/// sets), removed on drop.
struct ConfigFile(std::path::PathBuf);

impl ConfigFile {
    fn new(body: &str) -> ConfigFile {
        let p = std::env::temp_dir().join(format!(
            "jobwarden-key-ops-{}-{:08x}.toml",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::write(&p, body).unwrap();
        ConfigFile(p)
    }
}

impl Drop for ConfigFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Runs `jobwarden --config <file> <args>`; (exit code, stdout + stderr).
fn cli(env: &TestEnv, file: &ConfigFile, args: &[&str]) -> (i32, String) {
    let mut all = vec!["--config", file.0.to_str().unwrap()];
    all.extend_from_slice(args);
    let out = env.cli(&all);
    (out.status.code().unwrap_or(-1), text(&out))
}

const QUEUES: &str = "[queues.work]\nhandler = { kind = \"rust\", name = \"h\" }\n\
                      key_concurrency = 2\nfair_by_key = true\n\
                      [queues.plain]\nhandler = { kind = \"rust\", name = \"h\" }\n\
                      [queues.ordered]\nhandler = { kind = \"rust\", name = \"h\" }\n\
                      ordered_by_key = true\n";

/// `keys set|unset|list`: overrides are stored, merged, listed and dropped; every bad input
/// is refused with exit code 2 and a message naming the argument, the value and the fix.
#[tokio::test]
async fn keys_commands_set_list_and_unset_overrides_and_name_every_bad_input() {
    let env = TestEnv::new(QUEUES).await;
    let file = ConfigFile::new(QUEUES);
    let (code, out) = cli(
        &env,
        &file,
        &["keys", "set", "work", "customer-42", "--concurrency", "1"],
    );
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("key customer-42 of queue work: concurrency 1"),
        "{out}"
    );
    // A second set keeps what it does not name.
    let (code, out) = cli(
        &env,
        &file,
        &[
            "keys",
            "set",
            "work",
            "customer-42",
            "--rate",
            "5/1s",
            "--weight",
            "2",
        ],
    );
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("concurrency 1, rate 5/1s, weight 2"), "{out}");
    let (code, out) = cli(&env, &file, &["keys", "list", "--queue", "work", "--json"]);
    assert_eq!(code, 0, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let o = &v["overrides"][0];
    assert_eq!(o["key"], "customer-42");
    assert_eq!(o["concurrency"], 1);
    assert_eq!(o["rate"], "5/1s");
    assert_eq!(o["weight"], 2.0);
    assert!(o["set_by"].as_str().unwrap().starts_with("cli:"), "{o}");
    assert_eq!(
        env.scalar("SELECT rate_n * 100000 + rate_ms FROM key_limits WHERE key = 'customer-42'")
            .await,
        5 * 100_000 + 1000
    );
    let (code, out) = cli(&env, &file, &["keys", "list"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("customer-42") && out.contains("5/1s"), "{out}");

    // Bad input, each named.
    let long = "k".repeat(300);
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (
            vec!["keys", "set", "work", &long, "--concurrency", "1"],
            vec!["KEY", "300 bytes long, the limit is"],
        ),
        (
            vec!["keys", "set", "work", "c1", "--concurrency", "0"],
            vec!["--concurrency 0", "give at least 1"],
        ),
        (
            vec!["keys", "set", "work", "c1", "--rate", "5/0s"],
            vec!["--rate \"5/0s\"", "e.g. \"100/1m\""],
        ),
        (
            vec!["keys", "set", "work", "c1", "--rate", "fast"],
            vec!["--rate \"fast\" has no '/'"],
        ),
        (
            vec!["keys", "set", "plain", "c1", "--concurrency", "1"],
            vec!["queue plain is not keyed", "key_concurrency"],
        ),
        (
            vec!["keys", "set", "nope", "c1", "--concurrency", "1"],
            vec!["queue \"nope\" is not in the configuration", "work"],
        ),
        (
            vec!["keys", "set", "ordered", "c1", "--concurrency", "2"],
            vec!["--concurrency 2: queue ordered is ordered_by_key"],
        ),
        (
            vec!["keys", "set", "ordered", "c1", "--weight", "3"],
            vec![
                "--weight 3: queue ordered has no fair turns",
                "fair_by_key = true",
            ],
        ),
        (
            vec!["keys", "set", "work", "c1", "--weight", "0"],
            vec!["--weight 0", "above 0 and at most 1000"],
        ),
        (
            vec!["keys", "set", "work", "c1"],
            vec!["give at least one of --concurrency, --rate or --weight"],
        ),
        (
            vec!["keys", "unset", "work", "c1"],
            vec!["key \"c1\" of queue work has no overrides"],
        ),
        (
            vec!["keys", "list", "--queue", "plain"],
            vec!["queue plain is not keyed"],
        ),
    ];
    for (args, words) in cases {
        let (code, out) = cli(&env, &file, &args);
        assert_eq!(code, 2, "{args:?}: {out}");
        for w in words {
            assert!(out.contains(w), "{args:?}: {w:?} not in {out}");
        }
    }
    assert_eq!(env.scalar("SELECT count(*) FROM key_limits").await, 1);

    // The SQL door refuses the same, naming the field.
    let c = env.store.raw().await.unwrap();
    for (sql, words) in [
        (
            "SELECT * FROM set_key_limit('work', 'c1', concurrency => 0)",
            "field `concurrency` is invalid: 0 is out of range",
        ),
        (
            "SELECT * FROM set_key_limit('work', 'c1', rate => '5 per second')",
            "field `rate` is invalid: \"5 per second\" is no rate",
        ),
        (
            "SELECT * FROM set_key_limit('work', 'c1', rate => '5/10d')",
            "field `rate` is invalid: \"5/10d\" has a window of 864000000 ms",
        ),
        (
            "SELECT * FROM set_key_limit('work', '', concurrency => 1)",
            "field `key` is invalid: must not be empty",
        ),
        (
            "SELECT * FROM set_key_limit('work', 'c1')",
            "needs at least one of concurrency, rate or weight",
        ),
    ] {
        let e = c.query(sql, &[]).await.expect_err(sql);
        let msg = e
            .as_db_error()
            .map(|d| d.message().to_string())
            .unwrap_or_default();
        assert!(msg.contains(words), "{sql}: {msg}");
    }
    c.query(
        "SELECT * FROM set_key_limit('work', 'c2', rate => '100/1m', set_by => 'alice')",
        &[],
    )
    .await
    .unwrap();
    assert_eq!(
        env.scalar("SELECT rate_ms FROM key_limits WHERE key = 'c2' AND set_by = 'alice'")
            .await,
        60_000
    );

    let (code, out) = cli(&env, &file, &["keys", "unset", "work", "customer-42"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("overrides dropped"), "{out}");
    assert_eq!(
        env.scalar("SELECT count(*) FROM key_limits WHERE key = 'customer-42'")
            .await,
        0
    );
}

/// A concurrency override of 1 on one key holds it to one running job across three workers
/// taking at once, while the other keys run at the queue's 2.
#[tokio::test]
async fn a_concurrency_override_holds_its_key_while_other_keys_run_at_the_queues_limit() {
    let env = TestEnv::new(&format!("[queues.work]\n{RUST}key_concurrency = 2\n")).await;
    for w in ["w1", "w2", "w3"] {
        env.register_other(w).await;
    }
    env.store
        .key_limit_set("work", "slow", (Some(1), None, None), "test")
        .await
        .unwrap();
    let r = rules(Some(2));
    let inputs: Vec<ClaimInput> = (0..60)
        .map(|i| {
            let key = ["slow", "a", "b"][i % 3];
            keyed_input(&format!("j{i}"), Some(key))
        })
        .collect();
    park(&env.store, "w1", r, 1, &inputs).await;
    let mut most: HashMap<String, i64> = HashMap::new();
    let mut done = 0;
    let mut rounds = 0;
    while done < 60 {
        rounds += 1;
        assert!(rounds < 200, "the parked jobs were not all taken");
        let (a, b, c) = tokio::join!(
            take(&env.store, "w1", 5, r),
            take(&env.store, "w2", 5, r),
            take(&env.store, "w3", 5, r)
        );
        for (key, n) in running_per_key(&env).await {
            let m = most.entry(key).or_default();
            *m = (*m).max(n);
        }
        let taken: Vec<String> = a.into_iter().chain(b).chain(c).collect();
        done += taken.len();
        complete(&env, &taken).await;
    }
    assert_eq!(
        most["slow"], 1,
        "the overridden key ran {} at once",
        most["slow"]
    );
    assert_eq!(most["a"], 2, "{most:?}");
    assert_eq!(most["b"], 2, "{most:?}");
}

/// Start and end of every run, by key, as a handler saw them.
type Spans = Arc<Mutex<Vec<(String, String, Instant)>>>;

fn spans() -> (Arc<dyn jobwarden::Handler>, Spans) {
    let spans: Spans = Default::default();
    let s = spans.clone();
    let h = jobwarden::handler::from_fn(move |job| {
        let s = s.clone();
        async move {
            let key = job.payload["key"].as_str().unwrap_or("").to_string();
            s.lock()
                .unwrap()
                .push((key, job.id.clone(), Instant::now()));
            tokio::time::sleep(Duration::from_millis(5)).await;
            Ok(None)
        }
    });
    (h, spans)
}

async fn publish_keyed(env: &TestEnv, key: &str, n: usize) {
    for i in 0..n {
        env.publish_raw(
            "work",
            json!({"id": format!("{key}-{i}"), "key": key, "payload": {"key": key}}).to_string(),
        )
        .await;
    }
}

/// A rate override on a queue without key_rate_limit: three workers start no more than
/// 3 jobs of the key in any second, while the other keys run at once.
#[tokio::test]
async fn a_rate_override_holds_its_key_across_three_workers_while_others_run_free() {
    let env = TestEnv::new(&format!(
        "[queues.work]\n{RUST}concurrency = 8\nkey_concurrency = 4\n"
    ))
    .await;
    env.store
        .key_limit_set("work", "hot", (None, Some("3/1s"), None), "test")
        .await
        .unwrap();
    let (h, spans) = spans();
    let mut pods = Vec::new();
    for _ in 0..3 {
        pods.push(env.worker(&[("h", h.clone())]).await);
    }
    let t0 = Instant::now();
    publish_keyed(&env, "hot", 12).await;
    for k in 0..10 {
        publish_keyed(&env, &format!("cold{k}"), 3).await;
    }
    assert!(env.wait_count("completed", 42, 60).await);
    for p in pods {
        p.shutdown().await;
    }
    let spans = spans.lock().unwrap().clone();
    let mut hot: Vec<Instant> = spans.iter().filter(|s| s.0 == "hot").map(|s| s.2).collect();
    hot.sort();
    assert_eq!(hot.len(), 12);
    let worst = (0..hot.len())
        .map(|i| {
            hot[i..]
                .iter()
                .take_while(|s| s.duration_since(hot[i]) < Duration::from_secs(1))
                .count()
        })
        .max()
        .unwrap();
    let cold_done = spans
        .iter()
        .filter(|s| s.0.starts_with("cold"))
        .map(|s| s.2.duration_since(t0))
        .max()
        .unwrap();
    println!(
        "most starts of the hot key in 1 s: {worst}; cold keys all started after {cold_done:?}"
    );
    assert!(
        worst <= 3,
        "the hot key started {worst} jobs within one second (override 3/1s)"
    );
    assert_eq!(
        worst, 3,
        "the override never bound: the test proves nothing"
    );
    assert!(
        cold_done < Duration::from_secs(3),
        "the other keys waited: {cold_done:?}"
    );
}

/// Completions in order, and a switch that makes `bad` jobs succeed.
type Order = Arc<Mutex<Vec<String>>>;

fn fixable() -> (Arc<dyn jobwarden::Handler>, Order, Arc<AtomicBool>) {
    let order: Order = Default::default();
    let fixed = Arc::new(AtomicBool::new(false));
    let (o, f) = (order.clone(), fixed.clone());
    let h = jobwarden::handler::from_fn(move |job| {
        let (o, f) = (o.clone(), f.clone());
        async move {
            if job.payload["bad"] == json!(true) && !f.load(Ordering::SeqCst) {
                return Err(jobwarden::handler::JobError::permanent("bad input"));
            }
            o.lock().unwrap().push(job.id.clone());
            Ok(None)
        }
    });
    (h, order, fixed)
}

async fn publish_ordered(env: &TestEnv, queue: &str, key: &str) {
    for i in 1..=3 {
        env.publish_raw(
            queue,
            json!({"id": format!("{key}-{i}"), "key": key, "payload": {"bad": i == 1}}).to_string(),
        )
        .await;
    }
}

/// An ordered key's dead head holds the key (ordered_on_dead = "block"): `dlq retry` runs it
/// and then the key's later jobs, in order; `keys skip` lets another key's dead head go, with
/// a record of who and when, and `jobs show` says so. With "skip", the key goes on by itself
/// and `jobs show` of the dead job says how many later jobs went on.
#[tokio::test]
async fn an_ordered_keys_dead_head_is_retried_in_order_or_skipped_with_a_record() {
    let toml = format!(
        "[queues.work]\n{RUST}ordered_by_key = true\n\
         [queues.loose]\n{RUST}ordered_by_key = true\nordered_on_dead = \"skip\"\n\
         [queues.limited]\n{RUST}key_concurrency = 2\n"
    );
    let env = TestEnv::new(&toml).await;
    let file = ConfigFile::new(&toml);
    let (h, order, fixed) = fixable();
    let w = env.worker(&[("h", h)]).await;
    publish_ordered(&env, "work", "A").await;
    publish_ordered(&env, "work", "B").await;
    assert!(env.wait_status("A-1", "dead", 20).await);
    assert!(env.wait_status("B-1", "dead", 20).await);
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(
        env.scalar("SELECT count(*) FROM jobs WHERE key IN ('A', 'B') AND status = 'completed'")
            .await,
        0,
        "a later job ran past its key's dead head"
    );
    // While they wait, /metrics counts them per queue (no per-key series).
    let ops = w.ops_addr.expect("ops listener");
    let seen: Arc<Mutex<String>> = Default::default();
    let counted = common::wait_for(Duration::from_secs(10), || {
        let seen = seen.clone();
        async move {
            let body = reqwest::get(format!("http://{ops}/metrics"))
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            let value = |name: &str| {
                body.lines()
                    .find_map(|l| l.strip_prefix(&format!("{name}{{queue=\"work\"}} ")))
                    .and_then(|v| v.trim().parse::<f64>().ok())
                    .unwrap_or(0.0)
            };
            let ok = value("jobwarden_keyed_parked") >= 4.0
                && value("jobwarden_keys_waiting") >= 2.0
                && !body.contains("key=\"");
            *seen.lock().unwrap() = body;
            ok
        }
    })
    .await;
    let seen = seen.lock().unwrap().clone();
    assert!(counted, "no keyed gauges while jobs were parked: {seen}");
    let (_, shown) = cli(&env, &file, &["jobs", "show", "A-1"]);
    assert!(
        shown.contains("holds the later jobs of ordered key A"),
        "{shown}"
    );
    let (_, shown) = cli(&env, &file, &["jobs", "show", "A-2"]);
    assert!(
        shown.contains("waiting: key A is ordered and job A-1 is ahead of it (dead)"),
        "{shown}"
    );

    // Retried: it runs, then the key's later jobs, in order.
    fixed.store(true, Ordering::SeqCst);
    let (code, out) = cli(&env, &file, &["dlq", "retry", "A-1"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        env.wait_status("A-3", "completed", 20).await,
        "key A never went on"
    );
    let a: Vec<String> = order
        .lock()
        .unwrap()
        .iter()
        .filter(|id| id.starts_with("A-"))
        .cloned()
        .collect();
    assert_eq!(a, ["A-1", "A-2", "A-3"]);

    // Skipped: the key's later jobs run, the head stays dead with a record.
    let (code, out) = cli(&env, &file, &["keys", "skip", "B-1"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("job B-1 skipped in the order of key B"),
        "{out}"
    );
    assert!(
        env.wait_status("B-3", "completed", 20).await,
        "key B never went on"
    );
    assert_eq!(env.status_of("B-1").await.as_deref(), Some("dead"));
    let b: Vec<String> = order
        .lock()
        .unwrap()
        .iter()
        .filter(|id| id.starts_with("B-"))
        .cloned()
        .collect();
    assert_eq!(b, ["B-2", "B-3"]);
    assert_eq!(
        env.scalar("SELECT count(*) FROM key_skips WHERE job_id = 'B-1' AND key = 'B' AND skipped_by LIKE 'cli:%'")
            .await,
        1
    );
    let (_, shown) = cli(&env, &file, &["jobs", "show", "B-1"]);
    assert!(
        shown.contains("skipped in the order of key B by cli:")
            && shown.contains("(2 of them started)"),
        "{shown}"
    );
    // What cannot be skipped, each said.
    for (id, words) in [
        ("B-1", "was skipped in the order of key B already, by cli:"),
        ("B-2", "job B-2 is completed, not dead"),
        ("nope", "no job with id \"nope\""),
    ] {
        let (code, out) = cli(&env, &file, &["keys", "skip", id]);
        assert_eq!(code, 2, "{out}");
        assert!(out.contains(words), "{id}: {out}");
    }
    env.enqueue_id("plain-q", "nokey", json!({})).await.unwrap();
    env.store
        .raw()
        .await
        .unwrap()
        .execute("UPDATE jobs SET status = 'dead' WHERE id = 'nokey'", &[])
        .await
        .unwrap();
    let (code, out) = cli(&env, &file, &["keys", "skip", "nokey"]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("job nokey has no key"), "{out}");
    // The record goes with its job (retention, `dlq purge`): the table does not grow with
    // history.
    env.store
        .raw()
        .await
        .unwrap()
        .execute("DELETE FROM jobs WHERE id = 'B-1'", &[])
        .await
        .unwrap();
    assert_eq!(env.scalar("SELECT count(*) FROM key_skips").await, 0);

    // ordered_on_dead = "skip": the key goes on by itself; the dead job says so.
    fixed.store(false, Ordering::SeqCst);
    // A keyed queue that is not ordered: its dead jobs hold nothing back.
    env.publish_raw(
        "limited",
        json!({"id": "L-1", "key": "L", "payload": {"bad": true}}).to_string(),
    )
    .await;
    assert!(env.wait_status("L-1", "dead", 20).await);
    let (code, out) = cli(&env, &file, &["keys", "skip", "L-1"]);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("queue limited is not ordered by key") && out.contains("nothing to skip"),
        "{out}"
    );
    publish_ordered(&env, "loose", "C").await;
    assert!(env.wait_status("C-3", "completed", 20).await);
    assert_eq!(env.status_of("C-1").await.as_deref(), Some("dead"));
    let (_, shown) = cli(&env, &file, &["jobs", "show", "C-1"]);
    assert!(
        shown.contains(
            "key C went on without it (ordered_on_dead = \"skip\"): 2 of its later jobs started"
        ),
        "{shown}"
    );
    w.shutdown().await;
}

/// `jobs show` says why a parked job waits: its key's running jobs at the limit, its key's
/// starts at the rate, an ordered key's job ahead of it (retrying or dead), or its turn.
#[tokio::test]
async fn jobs_show_says_why_a_parked_job_waits() {
    let env = TestEnv::new(&format!("[queues.work]\n{RUST}key_concurrency = 2\n")).await;
    env.register_other("w1").await;
    let explain = |id: &'static str| {
        let store = env.store.clone();
        async move { store.job_explain(id).await.unwrap().unwrap() }
    };

    // The key's limit.
    let capped = rules(Some(2));
    env.store.key_rules_declare("work", capped).await.unwrap();
    let inputs: Vec<ClaimInput> = (1..=3)
        .map(|i| keyed_input(&format!("c{i}"), Some("customer-42")))
        .collect();
    park(&env.store, "w1", capped, 1, &inputs).await;
    assert_eq!(take(&env.store, "w1", 5, capped).await.len(), 2);
    let why = explain("c3").await;
    assert!(
        why.starts_with("waiting: key customer-42 has 2 running (limit 2)"),
        "{why}"
    );
    // An override counts, and so does the CLI's view of it.
    env.store
        .key_limit_set("work", "customer-42", (Some(3), None, None), "test")
        .await
        .unwrap();
    let why = explain("c3").await;
    assert!(why.starts_with("waiting: its turn (0 keys ahead)"), "{why}");
    let out = env.cli(&["jobs", "show", "c3"]);
    assert!(text(&out).contains("waiting: its turn"), "{}", text(&out));
    complete(
        &env,
        &["c1".to_string(), "c2".to_string(), "c3".to_string()],
    )
    .await;

    // The key's rate.
    let rated = KeyRules {
        rate: Some("2/1h".parse::<RateLimit>().unwrap()),
        ..rules(None)
    };
    env.store.key_rules_declare("work", rated).await.unwrap();
    let inputs: Vec<ClaimInput> = (1..=3)
        .map(|i| keyed_input(&format!("r{i}"), Some("hot")))
        .collect();
    park(&env.store, "w1", rated, 10, &inputs).await;
    assert_eq!(take(&env.store, "w1", 5, rated).await.len(), 2);
    let why = explain("r3").await;
    assert!(
        why.starts_with("waiting: key hot started 2 jobs in the last 1h (limit 2/1h)"),
        "{why}"
    );

    // An ordered key: a retry ahead, then a dead job ahead.
    let ordered = KeyRules {
        concurrency: Some(1),
        ordered: true,
        dead_blocks: true,
        ..rules(None)
    };
    env.store.key_rules_declare("work", ordered).await.unwrap();
    let inputs: Vec<ClaimInput> = (1..=2)
        .map(|i| keyed_input(&format!("o{i}"), Some("ord")))
        .collect();
    park(&env.store, "w1", ordered, 20, &inputs).await;
    assert_eq!(take(&env.store, "w1", 5, ordered).await, ["o1"]);
    let c = env.store.raw().await.unwrap();
    c.execute(
        "UPDATE jobs SET status = 'scheduled', scheduled_at = now() + interval '1 h' WHERE id = 'o1'",
        &[],
    )
    .await
    .unwrap();
    let why = explain("o2").await;
    assert!(
        why.starts_with("waiting: key ord is ordered and job o1 is ahead of it (retrying)"),
        "{why}"
    );
    c.execute("UPDATE jobs SET status = 'dead' WHERE id = 'o1'", &[])
        .await
        .unwrap();
    let why = explain("o2").await;
    assert!(
        why.starts_with("waiting: key ord is ordered and job o1 is ahead of it (dead)"),
        "{why}"
    );

    // Its turn: other keys' first jobs come before it (hot's and ord's waiting ones, and
    // t-a's and t-b's, parked before it).
    let plain = rules(None);
    env.store.key_rules_declare("work", plain).await.unwrap();
    let inputs: Vec<ClaimInput> = ["t-a", "t-b", "t-c"]
        .iter()
        .map(|k| keyed_input(&format!("{k}-1"), Some(k)))
        .collect();
    park(&env.store, "w1", plain, 30, &inputs).await;
    let why = explain("t-c-1").await;
    assert!(why.starts_with("waiting: its turn (4 keys ahead)"), "{why}");

    // With fair turns a parked job has no turn of its own: its key's next turn counts (a key
    // that comes when the clock has moved on waits behind one parked before).
    c.batch_execute("DELETE FROM jobs WHERE parked; DELETE FROM job_keys")
        .await
        .unwrap();
    let fair = KeyRules {
        fair: true,
        ..plain
    };
    env.store.key_rules_declare("work", fair).await.unwrap();
    let inputs: Vec<ClaimInput> = ["f-a", "f-b"]
        .iter()
        .map(|k| keyed_input(&format!("{k}-1"), Some(k)))
        .collect();
    park(&env.store, "w1", fair, 40, &inputs[..1]).await;
    c.execute("UPDATE flow_queues SET vturn = vturn + 1", &[])
        .await
        .unwrap();
    park(&env.store, "w1", fair, 41, &inputs[1..]).await;
    let why = explain("f-b-1").await;
    assert!(why.starts_with("waiting: its turn (1 keys ahead)"), "{why}");
}

/// `stats` and `keys list` name the busiest keys of a keyed queue, the longest backlog
/// first, with their running jobs.
#[tokio::test]
async fn stats_and_keys_list_show_the_busiest_keys() {
    let env = TestEnv::new(&format!("[queues.work]\n{RUST}key_concurrency = 1\n")).await;
    let file = ConfigFile::new(&format!("[queues.work]\n{RUST}key_concurrency = 1\n"));
    env.register_other("w1").await;
    let r = rules(Some(1));
    let mut inputs = Vec::new();
    for (key, n) in [("big", 6), ("mid", 4), ("small", 2)] {
        for i in 0..n {
            inputs.push(keyed_input(&format!("{key}{i}"), Some(key)));
        }
    }
    park(&env.store, "w1", r, 1, &inputs).await;
    assert_eq!(take(&env.store, "w1", 10, r).await.len(), 3);
    let out = env.cli(&["stats"]);
    let s = text(&out);
    assert!(out.status.success(), "{s}");
    let table = &s[s.find("busiest keys").expect(&s)..];
    let rows: Vec<Vec<&str>> = table
        .lines()
        .skip(2)
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows[0], ["work", "big", "5", "1"], "{table}");
    assert_eq!(rows[1], ["work", "mid", "3", "1"], "{table}");
    assert_eq!(rows[2], ["work", "small", "1", "1"], "{table}");
    let out = env.cli(&["stats", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["busiest_keys"][0]["key"], "big");
    assert_eq!(v["busiest_keys"][0]["parked"], 5);
    let (code, out) = cli(
        &env,
        &file,
        &["keys", "list", "--queue", "work", "--top", "2", "--json"],
    );
    assert_eq!(code, 0, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let keys: Vec<&str> = v["busiest"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["big", "mid"]);
}

/// The operators' answers on many parked jobs over many keys: 4,000 in the suite (the
/// answers' contents checked), 200,000 over 100,000 keys by hand for what they cost
/// (`KEY_OPS_PARKED=200000 scripts/test.sh --test key_ops operators -- --nocapture`; the
/// figures are in docs/operations.md §8e). No timed assertion: it prints.
#[tokio::test]
async fn the_operators_answers_on_many_parked_jobs() {
    let parked: usize = std::env::var("KEY_OPS_PARKED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4_000)
        .max(2_000);
    let env = TestEnv::new(&format!("[queues.work]\n{RUST}key_concurrency = 2\n")).await;
    env.register_other("w1").await;
    let r = rules(Some(2));
    env.store.key_rules_declare("work", r).await.unwrap();
    let t = Instant::now();
    for b in 0..parked / 2000 {
        let inputs: Vec<ClaimInput> = (0..2000)
            .map(|i| {
                let n = b * 2000 + i;
                let key = format!("customer-{}", (n * 7919) % 100_000);
                keyed_input(&format!("p{n}"), Some(&key))
            })
            .collect();
        park(&env.store, "w1", r, 1 + b as i64 * 2000, &inputs).await;
    }
    let parked = parked / 2000 * 2000;
    println!("parked {parked} jobs in {:?}", t.elapsed());
    let c = env.store.raw().await.unwrap();
    // As autovacuum leaves them (the visibility map set: index-only scans).
    for t in ["jobs", "job_keys"] {
        c.batch_execute(&format!("VACUUM ANALYZE {t}"))
            .await
            .unwrap();
    }
    c.batch_execute("SELECT 1").await.unwrap();
    assert_eq!(take(&env.store, "w1", 50, r).await.len(), 50);
    let time = |what: &str, t: Instant| println!("{what}: {:?}", t.elapsed());
    for _ in 0..3 {
        let t = Instant::now();
        let top = env.store.key_busiest(None, 10).await.unwrap();
        time("busiest keys (top 10)", t);
        assert_eq!(top.len(), 10);
        let t = Instant::now();
        let last = format!("p{}", parked - 1);
        let why = env.store.job_explain(&last).await.unwrap().unwrap();
        time("jobs show's explanation of the last parked job", t);
        assert!(why.starts_with("waiting: its turn ("), "{why}");
        let t = Instant::now();
        env.store.depth().await.unwrap();
        time(
            "the metrics' depth reading (with parked and keys_waiting)",
            t,
        );
    }
}
