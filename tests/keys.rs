//! A key per job against real servers (issue 31, item 1): the key a job carries arrives in
//! `jobs.key` whichever door it came in by — a message's envelope, a queue's `key_from` (a
//! payload field or a header), SQL `enqueue()`, the CLI, the Rust client (and its outbox),
//! a `then` child, a cron fire — and the operator sees it; a bad key is refused at every
//! door naming the field `key` (a message's is recorded as a dead job with the reason, never
//! run, never lost); a bad `key_from` is refused when the configuration loads.

mod common;

use common::{recording, text, wait_for, TestEnv};
use jobwarden::client::{Client, ClientError, EnqueueOptions};
use serde_json::json;
use std::time::Duration;

const EMAIL: &str =
    "[queues.email]\nconcurrency = 4\nhandler = { kind = \"rust\", name = \"work\" }\n";

/// The key stored with job `id` (`None`: no key); panics when there is no such job.
async fn key_of(env: &TestEnv, id: &str) -> Option<String> {
    let c = env.store.raw().await.unwrap();
    c.query_one("SELECT key FROM jobs WHERE id = $1", &[&id])
        .await
        .unwrap_or_else(|e| panic!("job {id}: {e}"))
        .get(0)
}

/// The `last_error` of every dead job, sorted.
async fn dead_reasons(env: &TestEnv) -> Vec<String> {
    let c = env.store.raw().await.unwrap();
    c.query(
        "SELECT last_error FROM jobs WHERE status = 'dead' ORDER BY last_error",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// A message's envelope carries the key into the row it creates (through the claim's fast
/// insert and through the full claim alike, and into the dead job a message is kept as),
/// and a `then` spec gives its child its own key; `jobs show` (text and JSON), `jobs list
/// --key` and the dashboard's job page show it.
#[tokio::test]
async fn an_envelopes_key_and_its_then_childs_arrive_in_jobs_key_and_are_shown() {
    let env = TestEnv::new(&format!("{EMAIL}[dashboard]\nlisten = \"127.0.0.1:0\"\n")).await;
    let (work, _seen) = recording();
    let w = env.worker(&[("work", work)]).await;
    env.publish_raw(
        "email",
        r#"{"id":"env-1","payload":{"n":1},"key":"customer-42","then":[{"queue":"email","payload":{},"id":"child-1","key":"customer-43"},{"queue":"email","payload":{},"id":"child-2"}]}"#,
    )
    .await;
    env.publish_raw("email", r#"{"id":"env-none","payload":{}}"#)
        .await;
    for id in ["env-1", "child-1", "child-2", "env-none"] {
        assert!(env.wait_status(id, "completed", 20).await, "{id}");
    }
    assert_eq!(key_of(&env, "env-1").await.as_deref(), Some("customer-42"));
    assert_eq!(
        key_of(&env, "child-1").await.as_deref(),
        Some("customer-43")
    );
    // A child names its own key or has none (a key is the job's, not its chain's).
    assert_eq!(key_of(&env, "child-2").await, None);
    assert_eq!(key_of(&env, "env-none").await, None);

    // A row the full claim creates (its message probably existed: an idempotency key sends
    // it there) carries the key too.
    env.publish_raw(
        "email",
        r#"{"id":"env-2","payload":{},"key":"customer-44","idempotency_key":"once"}"#,
    )
    .await;
    assert!(env.wait_status("env-2", "completed", 20).await);
    assert_eq!(key_of(&env, "env-2").await.as_deref(), Some("customer-44"));

    // A message kept as a dead job (its envelope names another priority than its subject's)
    // keeps its key, so a retry runs the job it was.
    env.publish_raw(
        "email",
        r#"{"id":"env-3","payload":{},"priority":0,"key":"customer-45"}"#,
    )
    .await;
    assert!(env.wait_count("dead", 1, 20).await);
    assert_eq!(
        env.scalar(
            "SELECT count(*) FROM jobs WHERE status = 'dead' AND key = 'customer-45' \
             AND last_error LIKE 'field `priority`%'"
        )
        .await,
        1
    );

    let shown = text(&env.cli(&["jobs", "show", "env-1"]));
    assert!(
        shown.lines().any(|l| l == "key:           customer-42"),
        "{shown}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&text(&env.cli(&["jobs", "show", "env-1", "--json"]))).unwrap();
    assert_eq!(json["job"]["key"], json!("customer-42"));
    let listed = text(&env.cli(&["jobs", "list", "--key", "customer-43"]));
    assert!(
        listed.contains("child-1") && !listed.contains("env-1"),
        "{listed}"
    );
    let base = format!("http://{}", w.dashboard_addr.expect("dashboard on"));
    let page = reqwest::get(format!("{base}/job?id=env-1"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        page.contains("<dt>key</dt><dd data-field=\"key\">customer-42</dd>"),
        "{page}"
    );
    w.shutdown().await;
}

/// SQL `enqueue()` (named, and by old calls that name no key), the Rust client, its outbox
/// form and the CLI store the key they are given.
#[tokio::test]
async fn sql_the_cli_and_the_rust_client_store_the_key_they_are_given() {
    let env = TestEnv::new(EMAIL).await;
    let c = env.store.raw().await.unwrap();
    c.execute(
        "SELECT enqueue('email', '{}', id => 'sql-1', key => 'customer-1')",
        &[],
    )
    .await
    .unwrap();
    // Every old call still works, by position and by name, and means no key.
    c.execute(
        "SELECT enqueue('email', '{}', 5, NULL, 3, NULL, 'sql-old')",
        &[],
    )
    .await
    .unwrap();
    c.execute(
        "SELECT enqueue('email', '{}', id => 'sql-chain', then_jobs => \
         '[{\"queue\":\"email\",\"payload\":{},\"id\":\"sql-child\",\"key\":\"customer-9\"}]', \
         key => 'customer-8')",
        &[],
    )
    .await
    .unwrap();
    let client = Client::new(env.store.clone(), env.broker.clone());
    client
        .enqueue(
            "email",
            json!({}),
            EnqueueOptions {
                id: Some("client-1".into()),
                key: Some("customer-2".into()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let mut conn = env.store.raw().await.unwrap();
    let tx = conn.transaction().await.unwrap();
    client
        .enqueue_in(
            &*tx,
            "email",
            json!({}),
            EnqueueOptions {
                id: Some("outbox-1".into()),
                key: Some("customer-3".into()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let out = env.cli(&[
        "enqueue",
        "email",
        "{}",
        "--id",
        "cli-1",
        "--key",
        "-customer-4",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    for (id, key) in [
        ("sql-1", Some("customer-1")),
        ("sql-old", None),
        ("sql-chain", Some("customer-8")),
        ("client-1", Some("customer-2")),
        ("outbox-1", Some("customer-3")),
        ("cli-1", Some("-customer-4")),
    ] {
        assert_eq!(key_of(&env, id).await.as_deref(), key, "{id}");
    }
    // The chain's child is created when its parent completed, with its own key.
    let (work, _seen) = recording();
    let w = env.worker(&[("work", work)]).await;
    assert!(env.wait_status("sql-child", "completed", 20).await);
    assert_eq!(
        key_of(&env, "sql-child").await.as_deref(),
        Some("customer-9")
    );
    assert!(env.wait_status("client-1", "completed", 20).await);
    assert_eq!(
        key_of(&env, "client-1").await.as_deref(),
        Some("customer-2")
    );
    w.shutdown().await;
}

/// A cron schedule's `key` is every fire's; a bad one is refused when the configuration
/// loads, naming the setting.
#[tokio::test]
async fn a_cron_schedules_key_is_every_fires_key() {
    let env = TestEnv::new(EMAIL).await;
    let cfg = jobwarden::cron::CronConfig {
        schedule: "* * * * * *".parse().unwrap(),
        timezone: Default::default(),
        queue: "email".into(),
        payload: json!({}),
        priority: Default::default(),
        missed: jobwarden::cron::Missed::Skip,
        expires_in: None,
        key: Some("reports".into()),
    };
    let schedule = jobwarden::cron::Schedule::new("tick", &cfg).unwrap();
    env.store.cron_tick(&schedule).await.unwrap();
    assert!(
        wait_for(Duration::from_secs(5), || async {
            env.store.cron_tick(&schedule).await.unwrap();
            env.scalar("SELECT count(*) FROM jobs WHERE id LIKE 'cron:tick:%'")
                .await
                > 0
        })
        .await
    );
    assert_eq!(
        env.scalar(
            "SELECT count(*) FROM jobs WHERE id LIKE 'cron:tick:%' AND key IS DISTINCT FROM 'reports'"
        )
        .await,
        0
    );
    let bad = jobwarden::config::Config::from_toml(&format!(
        "{EMAIL}[cron.t]\nschedule = \"* * * * *\"\nqueue = \"email\"\nkey = \"daily report\"\n"
    ))
    .map(|_| ())
    .unwrap_err()
    .to_string();
    assert!(
        bad.contains("cron.t.key: field `key` is invalid: contains U+0020"),
        "{bad}"
    );
}

const KEYED: &str = "[queues.orders]\nconcurrency = 4\nkey_from = \"payload:/customer/id\"\n\
                     handler = { kind = \"rust\", name = \"work\" }\n\
                     [queues.hooks]\nconcurrency = 4\nkey_from = \"header:X-Customer\"\n\
                     handler = { kind = \"rust\", name = \"work\" }\n";

/// Publishes `body` to `jobs.<queue>` with header `X-Customer: <customer>`.
async fn publish_for(env: &TestEnv, queue: &str, customer: &str, body: &str) {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("X-Customer", customer);
    env.broker
        .js
        .publish_with_headers(format!("jobs.{queue}"), headers, body.to_string().into())
        .await
        .expect("publish")
        .await
        .expect("publish ack");
}

/// A queue's `key_from` takes a message's key from its payload (a string as it is, an
/// integer as its decimal text; nothing there or null: no key) or from a header; an
/// envelope's own `key` wins. Jobs of other doors name their key themselves: a job enqueued
/// through SQL into such a queue keeps the key it was given (or none), whatever its payload
/// holds where key_from looks — even a value key_from would refuse.
#[tokio::test]
async fn key_from_takes_the_key_from_the_payload_or_a_header_and_the_envelope_wins() {
    let env = TestEnv::new(KEYED).await;
    let (work, seen) = recording();
    let w = env.worker(&[("work", work)]).await;
    for body in [
        r#"{"id":"p-str","payload":{"customer":{"id":"c-1"}}}"#,
        r#"{"id":"p-int","payload":{"customer":{"id":42}}}"#,
        r#"{"id":"p-null","payload":{"customer":{"id":null}}}"#,
        r#"{"id":"p-none","payload":{"other":1}}"#,
        r#"{"id":"p-own","payload":{"customer":{"id":"c-1"}},"key":"own-1"}"#,
    ] {
        env.publish_raw("orders", body).await;
    }
    // A plain payload: the pointer looks into the whole body.
    env.publish_raw("orders", r#"{"customer":{"id":"c-plain"},"tag":"plain"}"#)
        .await;
    publish_for(&env, "hooks", "c-9", r#"{"id":"h-1","payload":{}}"#).await;
    publish_for(
        &env,
        "hooks",
        "c-9",
        r#"{"id":"h-own","payload":{},"key":"own-2"}"#,
    )
    .await;
    env.publish_raw("hooks", r#"{"id":"h-none","payload":{}}"#)
        .await;
    let c = env.store.raw().await.unwrap();
    c.execute(
        "SELECT enqueue('orders', '{\"customer\":{\"id\":{\"deep\":1}}}', id => 'sql-bad-pointer')",
        &[],
    )
    .await
    .unwrap();
    c.execute(
        "SELECT enqueue('orders', '{\"customer\":{\"id\":\"c-other\"}}', id => 'sql-own', key => 'own-3')",
        &[],
    )
    .await
    .unwrap();
    assert!(env.wait_count("completed", 11, 20).await, "{:?}", seen);
    let plain: String = c
        .query_one("SELECT id FROM jobs WHERE payload ->> 'tag' = 'plain'", &[])
        .await
        .unwrap()
        .get(0);
    for (id, key) in [
        ("p-str", Some("c-1")),
        ("p-int", Some("42")),
        ("p-null", None),
        ("p-none", None),
        ("p-own", Some("own-1")),
        (plain.as_str(), Some("c-plain")),
        ("h-1", Some("c-9")),
        ("h-own", Some("own-2")),
        ("h-none", None),
        ("sql-bad-pointer", None),
        ("sql-own", Some("own-3")),
    ] {
        assert_eq!(key_of(&env, id).await.as_deref(), key, "{id}");
    }
    assert_eq!(env.count("dead").await, 0, "{:?}", dead_reasons(&env).await);
    w.shutdown().await;
}

/// Messages a worker fetched and never claimed (it was killed) are adopted by another
/// worker with the key its queue's `key_from` finds (the rows adoption makes are the
/// claim's), long before JetStream would deliver them again (ack_wait is 10 minutes).
#[tokio::test]
async fn an_adopted_message_keeps_the_key_key_from_finds() {
    let env = TestEnv::new(
        "adopt_after = \"300ms\"\n[queues.work]\nkey_from = \"payload:/customer\"\n\
         handler = { kind = \"exec\", command = [\"true\"] }\n",
    )
    .await;
    let bodies: Vec<String> = (0..3)
        .map(|i| format!(r#"{{"id":"stranded-{i}","payload":{{"customer":"c-{i}"}}}}"#))
        .chain([r#"{"id":"stranded-own","payload":{"customer":"c-x"},"key":"own"}"#.into()])
        .collect();
    common::strand_in_a_killed_worker(&env, &env.config, &bodies).await;
    let b = env.worker_with(env.config.clone(), &[]).await;
    assert!(env.wait_count("completed", 4, 20).await);
    assert_eq!(
        env.scalar("SELECT count(DISTINCT job_id) FROM job_attempts WHERE outcome = 'adopted'")
            .await,
        4,
        "not adopted"
    );
    for (id, key) in [
        ("stranded-0", "c-0"),
        ("stranded-1", "c-1"),
        ("stranded-2", "c-2"),
        ("stranded-own", "own"),
    ] {
        assert_eq!(key_of(&env, id).await.as_deref(), Some(key), "{id}");
    }
    b.shutdown().await;
}

/// Bad keys at every door: an error naming the field `key` and what is wrong, and nothing
/// enqueued. A message's is recorded as a dead job with that reason and its body (never
/// run, never lost); for a key a queue's `key_from` found, the reason names the setting
/// and what it found there.
#[tokio::test]
async fn bad_keys_are_refused_at_every_door_naming_the_field() {
    let env = TestEnv::new(&format!("{EMAIL}{KEYED}")).await;
    let c = env.store.raw().await.unwrap();
    // SQL.
    for (call, field, words) in [
        (
            "SELECT enqueue('email', '{}', id => 'x1', key => '')".to_string(),
            "key",
            "must not be empty",
        ),
        (
            format!(
                "SELECT enqueue('email', '{{}}', id => 'x2', key => '{}')",
                "k".repeat(201)
            ),
            "key",
            "is 201 bytes long, the limit is 200",
        ),
        (
            "SELECT enqueue('email', '{}', id => 'x3', key => 'a b')".to_string(),
            "key",
            "contains U+0020",
        ),
        (
            "SELECT enqueue('email', '{}', id => 'x4', key => '..')".to_string(),
            "key",
            "cannot be a key",
        ),
        (
            "SELECT enqueue('email', '{}', id => 'x5', then_jobs => \
             '[{\"queue\":\"email\",\"payload\":{},\"key\":5}]')"
                .to_string(),
            "then[1].key",
            "must be a string, found a number",
        ),
    ] {
        let e = c.execute(call.as_str(), &[]).await.unwrap_err();
        let msg = e.as_db_error().map(|d| d.message().to_string()).unwrap();
        assert!(
            msg.contains(&format!("field `{field}`")) && msg.contains(words),
            "{call}: {msg}"
        );
    }
    // The Rust client (and so its outbox).
    let client = Client::new(env.store.clone(), env.broker.clone());
    for (key, words) in [(".", "cannot be a key"), ("x\ny", "contains U+000A")] {
        let e = client
            .enqueue(
                "email",
                json!({}),
                EnqueueOptions {
                    id: Some("x6".into()),
                    key: Some(key.into()),
                    ..Default::default()
                },
            )
            .await
            .unwrap_err();
        assert!(
            matches!(&e, ClientError::Refused(r) if r.field() == "key")
                && e.to_string().contains(words),
            "{e}"
        );
    }
    // The CLI: exit 2, led by the option.
    let out = env.cli(&["enqueue", "email", "{}", "--id", "x7", "--key", "a/b"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("--key: field `key` is invalid: contains '/'"),
        "{}",
        text(&out)
    );
    assert_eq!(
        env.scalar("SELECT count(*) FROM jobs").await,
        0,
        "a refused job was stored"
    );

    // Messages: recorded dead with the reason, never run.
    let (work, seen) = recording();
    let w = env.worker(&[("work", work)]).await;
    let long = "k".repeat(201);
    for body in [
        format!(r#"{{"id":"m-long","payload":{{"m":1}},"key":"{long}"}}"#),
        r#"{"id":"m-space","payload":{"m":2},"key":"a b"}"#.to_string(),
        r#"{"id":"m-dot","payload":{"m":3},"key":"."}"#.to_string(),
        r#"{"id":"m-type","payload":{"m":4},"key":42}"#.to_string(),
    ] {
        env.publish_raw("email", body).await;
    }
    for body in [
        r#"{"id":"k-object","payload":{"customer":{"id":{"x":1}}}}"#,
        r#"{"id":"k-bool","payload":{"customer":{"id":true}}}"#,
        r#"{"id":"k-float","payload":{"customer":{"id":1.5}}}"#,
        r#"{"id":"k-bad","payload":{"customer":{"id":"a#b"}}}"#,
    ] {
        env.publish_raw("orders", body).await;
    }
    publish_for(&env, "hooks", "..", r#"{"id":"k-header","payload":{}}"#).await;
    // A good one in each queue: the worker goes on.
    env.publish_raw("email", r#"{"id":"ok-1","payload":{},"key":"fine"}"#)
        .await;
    env.publish_raw(
        "orders",
        r#"{"id":"ok-2","payload":{"customer":{"id":"c"}}}"#,
    )
    .await;
    assert!(
        wait_for(Duration::from_secs(20), || async {
            env.count("dead").await == 9 && env.count("completed").await == 2
        })
        .await,
        "{:?}",
        dead_reasons(&env).await
    );
    let reasons = dead_reasons(&env).await;
    for words in [
        "field `key` is invalid: is 201 bytes long, the limit is 200",
        "field `key` is invalid: contains U+0020",
        "field `key` is invalid: \".\" cannot be a key",
        "field `key` must be a string, found a number",
        "field `key` is invalid: queues.orders.key_from = \"payload:/customer/id\" found an object",
        "field `key` is invalid: queues.orders.key_from = \"payload:/customer/id\" found a boolean",
        "field `key` is invalid: queues.orders.key_from = \"payload:/customer/id\" found the number 1.5, which is not an integer",
        "field `key` is invalid: queues.orders.key_from = \"payload:/customer/id\" found a text that is no valid key (contains '#'",
        "field `key` is invalid: queues.hooks.key_from = \"header:X-Customer\" found a text that is no valid key (\"..\" cannot be a key",
    ] {
        assert!(
            reasons.iter().any(|r| r.starts_with(words)),
            "no reason {words:?} in {reasons:#?}"
        );
    }
    // Each kept its body (under its own message id), and none ran.
    assert_eq!(
        env.scalar(
            "SELECT count(*) FROM jobs WHERE status = 'dead' AND attempts = 0 \
             AND payload ? 'invalid_body' AND key IS NULL"
        )
        .await,
        9
    );
    let ran = seen.lock().unwrap().clone();
    assert_eq!(ran.len(), 2, "{ran:?}");
    w.shutdown().await;
}

/// A `key_from` that does not say where the key is, or says it wrongly, is refused when the
/// configuration loads: each named by its setting, with the value and the right form.
#[test]
fn a_bad_key_from_is_refused_at_load_naming_the_setting_the_value_and_the_form() {
    let errs = jobwarden::config::Config::from_toml(
        "[queues.a]\nkey_from = \"customer.id\"\nhandler = { kind = \"rust\", name = \"w\" }\n\
         [queues.b]\nkey_from = \"payload:customer/id\"\nhandler = { kind = \"rust\", name = \"w\" }\n\
         [queues.c]\nkey_from = \"header:X Customer\"\nhandler = { kind = \"rust\", name = \"w\" }\n\
         [queues.d]\nkey_from = \"payload:\"\nhandler = { kind = \"rust\", name = \"w\" }\n\
         [queues.e]\nkey_from = 5\nhandler = { kind = \"rust\", name = \"w\" }\n",
    )
    .unwrap_err()
    .0;
    let all = errs.join("\n");
    for named in [
        "queues.a.key_from: \"customer.id\" does not say where the key is",
        "queues.b.key_from: \"payload:customer/id\" is not a JSON pointer",
        "queues.c.key_from: \"header:X Customer\" does not name a header",
        "queues.d.key_from: \"payload:\" names the whole payload",
        "queues.e.key_from",
    ] {
        assert!(all.contains(named), "{named} not in:\n{all}");
    }
    for e in errs.iter().filter(|e| !e.starts_with("queues.e.")) {
        assert!(
            e.contains("e.g. \"payload:/customer/id\"") && e.contains("\"header:X-Customer\""),
            "{e}"
        );
    }
    assert_eq!(errs.len(), 5, "{all}");
    let ok = jobwarden::config::Config::from_toml(
        "[queues.a]\nkey_from = \"payload:/customer/id\"\nhandler = { kind = \"rust\", name = \"w\" }\n",
    )
    .unwrap();
    assert!(ok
        .to_redacted_toml()
        .contains("key_from = \"payload:/customer/id\""));
}
