//! One contract at every door (invariant 13): the job contract's Rust checks
//! (`jobwarden::contract`) and the SQL function `job_check()` that `enqueue()` runs give the
//! same verdict on the same random job specs, naming the same field; so do their duration
//! readers and id checks. Then the examples the contract was made for, against real servers.
//!
//! `PROPTEST_CASES` sets how many random cases each property runs (default 512, the same ones
//! every run; any `PROPTEST_CASES` or `FUZZ_RANDOM=1` draws new ones); run
//! `PROPTEST_CASES=20000 cargo test --release --test contract` by hand for a long run).

mod common;

use common::generators::{batch_value, config, duration_text, id_text, spec, FIELDS};
use common::test_database_url;
use common::testkit::unique_name;
use jobwarden::contract::{self, Door};
use jobwarden::store::Store;
use proptest::prelude::*;
use serde_json::{Map, Value};
use std::sync::OnceLock;

/// One migrated schema shared by the properties of this file (its functions are pure).
struct Db {
    rt: tokio::runtime::Runtime,
    store: Store,
}

fn db() -> &'static Db {
    static DB: OnceLock<Db> = OnceLock::new();
    DB.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let store = rt.block_on(async {
            let text = format!(
                "[database]\nurl = \"{}\"\nschema = \"{}\"\n[nats]\nurl = \"nats://127.0.0.1:1\"\n[queues.email]\nhandler = {{ kind = \"http\", url = \"http://127.0.0.1:1/\" }}\n",
                test_database_url(),
                unique_name("contract")
            );
            let config = jobwarden::config::Config::from_toml(&text).unwrap();
            let store = Store::connect(&config.database).await.unwrap();
            drop_leftovers(&store).await;
            store.migrate().await.unwrap();
            store
        });
        Db { rt, store }
    })
}

/// The schema lives as long as the test process; schemas of earlier runs whose process is
/// gone are dropped here.
async fn drop_leftovers(store: &Store) {
    let c = store.raw().await.unwrap();
    let rows = c
        .query(
            "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'contract\\_%'",
            &[],
        )
        .await
        .unwrap();
    for r in rows {
        let name: String = r.get(0);
        let pid = name.split('_').nth(1).and_then(|p| p.parse::<u32>().ok());
        if pid.is_some_and(|p| !std::path::Path::new(&format!("/proc/{p}")).exists()) {
            let _ = c
                .batch_execute(&format!("DROP SCHEMA \"{name}\" CASCADE"))
                .await;
        }
    }
}

/// What a door made of a spec: accepted, or refused naming a field (`None`: a refusal that
/// names no field, e.g. "a job is a JSON object").
#[derive(Debug, PartialEq)]
enum Verdict {
    Accepted,
    Refused(Option<String>),
}

fn field_of(message: &str) -> Option<String> {
    let at = message.find("field `")? + 7;
    let end = message[at..].find('`')?;
    Some(message[at..at + end].to_string())
}

fn rust_verdict(text: &str, door: Door, limit: Option<usize>) -> Verdict {
    let Ok(Value::Object(obj)) = serde_json::from_str::<Value>(text) else {
        return Verdict::Refused(None);
    };
    match contract::check_spec(&obj, door, limit) {
        Ok(_) => Verdict::Accepted,
        Err(e) => Verdict::Refused(Some(e.field().to_string())),
    }
}

fn sql(
    query: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<Vec<tokio_postgres::Row>, String> {
    let d = db();
    d.rt.block_on(async {
        let c = d.store.raw().await.unwrap();
        c.batch_execute(&format!("SET search_path TO \"{}\"", d.store.schema()))
            .await
            .unwrap();
        c.query(query, params).await.map_err(|e| {
            e.as_db_error()
                .map(|db| db.message().to_string())
                .unwrap_or_else(|| e.to_string())
        })
    })
}

fn sql_verdict(text: &str, door: Door, limit: Option<usize>) -> Verdict {
    let limit = limit.map(|l| l as i64);
    match sql(
        "SELECT job_check($1::text::jsonb, $2, $3)",
        &[&text, &door.as_str(), &limit],
    ) {
        Ok(_) => Verdict::Accepted,
        Err(message) => Verdict::Refused(field_of(&message)),
    }
}

fn door() -> impl Strategy<Value = Door> {
    prop::sample::select(vec![Door::Message, Door::Then, Door::Enqueue])
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn rust_and_sql_give_every_spec_the_same_verdict(spec in spec(0, false), door in door(), limited in any::<bool>()) {
        let text = spec.to_string();
        let limit = limited.then_some(200);
        let rust = rust_verdict(&text, door, limit);
        let sql = sql_verdict(&text, door, limit);
        prop_assert_eq!(&rust, &sql, "door {} spec {}", door, text);
    }

    /// A message's `batch` (version 34) alone, so that each of its rules is reached often.
    #[test]
    fn rust_and_sql_judge_a_messages_batch_alike(batch in batch_value(), limited in any::<bool>()) {
        let text = serde_json::json!({"payload": {}, "batch": batch}).to_string();
        let limit = limited.then_some(200);
        let rust = rust_verdict(&text, Door::Message, limit);
        let sql = sql_verdict(&text, Door::Message, limit);
        prop_assert_eq!(&rust, &sql, "spec {}", text);
    }

    /// The bulk door (`enqueue_many()`, version 29) judges each member as one enqueue: a
    /// spec the contract refuses is refused naming `jobs[1].<field>`; one it accepts is
    /// stored (then rolled back), or refused only for a parent that does not exist.
    #[test]
    fn enqueue_many_judges_each_member_as_the_contract_does(spec in spec(0, false)) {
        let text = spec.to_string();
        let rust = rust_verdict(&text, Door::Enqueue, None);
        let bulk = format!(
            "DO $jw$ BEGIN PERFORM * FROM enqueue_many(jsonb_build_array('{}'::jsonb)); \
             RAISE EXCEPTION 'jw: accepted'; END $jw$",
            text.replace('\'', "''")
        );
        let message = sql(&bulk, &[]).expect_err("the DO block always raises");
        match rust {
            Verdict::Accepted => prop_assert!(
                message == "jw: accepted" || message.contains("which does not exist"),
                "spec {} accepted by the contract, refused in bulk: {}", text, message
            ),
            Verdict::Refused(Some(f)) => prop_assert_eq!(
                field_of(&message), Some(format!("jobs[1].{f}")), "spec {}: {}", text, message
            ),
            Verdict::Refused(None) => prop_assert_ne!(message, "jw: accepted"),
        }
    }

    /// The batch door (`enqueue_batch()`, version 32) judges a member as the bulk door does
    /// (`jobs[1].<field>`) and a callback as one enqueue (`batch.on_complete.<field>`; a
    /// callback may depend on nothing).
    #[test]
    fn enqueue_batch_judges_members_and_callbacks_as_the_contract_does(spec in spec(0, false)) {
        let text = spec.to_string();
        let rust = rust_verdict(&text, Door::Enqueue, None);
        let run = |batch: String| {
            sql(
                &format!(
                    "DO $jw$ BEGIN PERFORM enqueue_batch('{}'::jsonb); \
                     RAISE EXCEPTION 'jw: accepted'; END $jw$",
                    batch.replace('\'', "''")
                ),
                &[],
            )
            .expect_err("the DO block always raises")
        };
        let member = run(format!(r#"{{"jobs": [{text}]}}"#));
        let callback = run(format!(
            r#"{{"jobs": [{{"queue": "q", "payload": {{}}}}], "on_complete": {text}}}"#
        ));
        match rust {
            Verdict::Accepted => {
                prop_assert!(
                    member == "jw: accepted" || member.contains("which does not exist"),
                    "spec {} accepted by the contract, refused as a member: {}", text, member
                );
                if spec.get("depends_on").is_none() {
                    prop_assert_eq!(&callback, "jw: accepted", "spec {}", text);
                }
                // The same callback waiting for a parent is refused.
                let mut waits = spec.clone();
                waits["depends_on"] = serde_json::json!(["p-1"]);
                let refused = run(format!(
                    r#"{{"jobs": [{{"queue": "q", "payload": {{}}}}], "on_complete": {waits}}}"#
                ));
                prop_assert!(
                    refused.contains("depends on nothing else"),
                    "spec {} with depends_on taken as a callback: {}", waits, refused
                );
            }
            Verdict::Refused(Some(f)) => {
                prop_assert_eq!(
                    field_of(&member), Some(format!("jobs[1].{f}")), "spec {}: {}", text, member
                );
                prop_assert_eq!(
                    field_of(&callback), Some(format!("batch.on_complete.{f}")),
                    "spec {}: {}", text, callback
                );
            }
            Verdict::Refused(None) => {
                prop_assert_ne!(member, "jw: accepted");
                prop_assert_ne!(callback, "jw: accepted");
            }
        }
    }

    #[test]
    fn rust_and_sql_read_durations_alike(text in duration_text()) {
        let rust = contract::parse_duration_ns(&text);
        let sql = sql("SELECT contract_duration_ns($1, 'd')::text", &[&text])
            .map(|rows| rows[0].get::<_, String>(0));
        match (&rust, &sql) {
            (Ok(ns), Ok(s)) => prop_assert_eq!(ns.to_string(), s.clone(), "{:?}", text),
            (Err(_), Err(_)) => {}
            _ => prop_assert!(false, "{:?}: rust {:?}, sql {:?}", text, rust, sql),
        }
    }

    #[test]
    fn rust_and_sql_judge_ids_and_keys_alike(text in id_text()) {
        let id_rust = contract::check_id(&text).is_ok();
        let id_sql = sql("SELECT contract_check_id($1, 'id')", &[&text]).is_ok();
        prop_assert_eq!(id_rust, id_sql, "id {:?}", text);
        let key_rust = contract::check_key(&text).is_ok();
        let key_sql = sql("SELECT contract_check_key($1, 'k')", &[&text]).is_ok();
        prop_assert_eq!(key_rust, key_sql, "key {:?}", text);
        // A job's key follows the rules of an id, in its own words.
        let job_key_rust = contract::check_job_key(&text);
        let job_key_sql = sql("SELECT contract_check_job_key($1, 'key')", &[&text]);
        prop_assert_eq!(job_key_rust.is_ok(), job_key_sql.is_ok(), "job key {:?}", text);
        prop_assert_eq!(job_key_rust.is_ok(), id_rust, "job key and id {:?}", text);
        if let (Err(rust), Err(sql)) = (&job_key_rust, &job_key_sql) {
            prop_assert_eq!(sql.clone(), format!("jobwarden: field `key` is invalid: {rust}"));
        }
    }
}

/// The generators reach both verdicts at every door, and refusals of many fields: a property
/// whose inputs were all refused for one reason would compare nothing.
#[test]
fn the_generators_reach_acceptance_and_refusal_of_every_field() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let strategy = (spec(0, false), door());
    let mut accepted = 0;
    let mut fields = std::collections::BTreeSet::new();
    for _ in 0..2000 {
        let (spec, door) = strategy.new_tree(&mut runner).unwrap().current();
        match rust_verdict(&spec.to_string(), door, Some(200)) {
            Verdict::Accepted => accepted += 1,
            Verdict::Refused(Some(f)) => {
                fields.insert(f.split(['[', '.']).next().unwrap().to_string());
            }
            Verdict::Refused(None) => {}
        }
    }
    assert!(
        (100..1900).contains(&accepted),
        "accepted {accepted} of 2000"
    );
    for f in FIELDS.iter().chain(&["batch"]) {
        assert!(fields.contains(*f), "no spec refused for {f}: {fields:?}");
    }
    // Every field is accepted in some spec too (a field only ever refused tests nothing).
    let mut taken = std::collections::BTreeSet::new();
    for _ in 0..4000 {
        let (spec, door) = strategy.new_tree(&mut runner).unwrap().current();
        if rust_verdict(&spec.to_string(), door, Some(200)) == Verdict::Accepted {
            if let Some(m) = spec.as_object() {
                taken.extend(m.keys().cloned());
            }
        }
    }
    for f in ["expires_at_ms", "expires_in", "key", "batch"] {
        assert!(taken.contains(f), "no spec accepted with {f}: {taken:?}");
    }
}

#[test]
fn the_same_error_text_at_both_doors() {
    for (text, door) in [
        (
            r#"{"queue":"email","payload":{},"id":"x\ny"}"#,
            Door::Enqueue,
        ),
        (r#"{"payload":{},"priority":12}"#, Door::Message),
        (r#"{"queue":"a b","payload":{}}"#, Door::Then),
        (
            r#"{"queue":"q","payload":{},"timeout_ms":604800001}"#,
            Door::Enqueue,
        ),
        (
            r#"{"payload":{},"backoff":{"kind":"fixed","base":"1000000y"}}"#,
            Door::Message,
        ),
        (
            r#"{"payload":{},"then":[{"queue":"q","payload":{},"zz":1}]}"#,
            Door::Message,
        ),
        (r#"{"payload":{},"id":".."}"#, Door::Message),
        // A job's key: the rules of an id, in its own words, at every door.
        (r#"{"payload":{},"key":".."}"#, Door::Message),
        (r#"{"payload":{},"key":""}"#, Door::Message),
        (r#"{"queue":"q","payload":{},"key":"a b"}"#, Door::Enqueue),
        (r#"{"queue":"q","payload":{},"key":"a/b"}"#, Door::Then),
        (r#"{"queue":"q","payload":{},"key":7}"#, Door::Enqueue),
        (
            r#"{"payload":{},"then":[{"queue":"q","payload":{},"key":"x\u200by"}]}"#,
            Door::Message,
        ),
        // Debounce, throttle, unique_for (version 23): the windows and the rules between them.
        (r#"{"payload":{},"key":"k","debounce":"0s"}"#, Door::Message),
        (
            r#"{"payload":{},"key":"k","throttle":"11y"}"#,
            Door::Message,
        ),
        (r#"{"payload":{},"key":"k","debounce":5}"#, Door::Message),
        (
            r#"{"payload":{},"key":"k","debounce":"5s","debounce_max_wait":"1s"}"#,
            Door::Message,
        ),
        (
            r#"{"payload":{},"key":"k","debounce_max_wait":"1s"}"#,
            Door::Message,
        ),
        (
            r#"{"payload":{},"key":"k","debounce":"1s","throttle":"1s"}"#,
            Door::Message,
        ),
        (
            r#"{"queue":"q","payload":{},"debounce":"1s"}"#,
            Door::Enqueue,
        ),
        (r#"{"queue":"q","payload":{},"throttle":"1s"}"#, Door::Then),
        (r#"{"payload":{},"unique_for":"1h"}"#, Door::Message),
        // A message's batch (version 34), and the doors that take none.
        (r#"{"payload":{},"batch":"b"}"#, Door::Message),
        (r#"{"payload":{},"batch":{"size":2}}"#, Door::Message),
        (r#"{"payload":{},"batch":{"id":"b"}}"#, Door::Message),
        (
            r#"{"payload":{},"batch":{"id":"b","size":0}}"#,
            Door::Message,
        ),
        (
            r#"{"payload":{},"batch":{"id":"b","size":2.5}}"#,
            Door::Message,
        ),
        (
            r#"{"payload":{},"batch":{"id":"a b","size":2}}"#,
            Door::Message,
        ),
        (
            r#"{"payload":{},"batch":{"id":"b","size":2,"name":"x"}}"#,
            Door::Message,
        ),
        (
            r#"{"payload":{},"batch":{"id":"b","size":2,"on_complete":[]}}"#,
            Door::Message,
        ),
        (
            r#"{"payload":{},"batch":{"id":"b","size":2,"on_success":{"payload":{}}}}"#,
            Door::Message,
        ),
        (
            r#"{"payload":{},"batch":{"id":"b","size":2,"on_complete":{"queue":"r","payload":{},"depends_on":[]}}}"#,
            Door::Message,
        ),
        (
            r#"{"payload":{},"batch":{"id":"b","size":2,"on_complete":{"queue":"r","payload":{},"then":[{"queue":"s"}]}}}"#,
            Door::Message,
        ),
        (
            r#"{"queue":"q","payload":{},"batch":{"id":"b","size":2}}"#,
            Door::Enqueue,
        ),
        (r#"{"payload":{},"zzz":1}"#, Door::Message),
    ] {
        let obj: Map<String, Value> = serde_json::from_str(text).unwrap();
        let rust = contract::check_spec(&obj, door, None)
            .unwrap_err()
            .to_string();
        let sql = sql(
            "SELECT job_check($1::text::jsonb, $2)",
            &[&text, &door.as_str()],
        )
        .unwrap_err();
        assert_eq!(sql, format!("jobwarden: {rust}"), "{text}");
    }
}
