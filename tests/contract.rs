//! One contract at every door (invariant 13): the job contract's Rust checks
//! (`jobwarden::contract`) and the SQL function `job_check()` that `enqueue()` runs give the
//! same verdict on the same random job specs, naming the same field; so do their duration
//! readers and id checks. Then the examples the contract was made for, against real servers.
//!
//! `PROPTEST_CASES` sets how many random cases each property runs (default 512 here; run
//! `PROPTEST_CASES=20000 cargo test --release --test contract` by hand for a long run).

mod common;

use common::test_database_url;
use common::testkit::unique_name;
use jobwarden::contract::{self, Door};
use jobwarden::store::Store;
use proptest::prelude::*;
use serde_json::{json, Map, Value};
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

// ---- generators -------------------------------------------------------------------------

/// Characters of every class the contract knows: allowed ASCII, punctuation that matters in
/// URLs and HTML, letters of other scripts, emoji, and each kind it refuses.
fn id_char() -> impl Strategy<Value = char> {
    prop_oneof![
        6 => prop::char::range('a', 'z'),
        2 => prop::char::range('0', '9'),
        3 => prop::sample::select(vec!['-', '_', '.', ':', '%', '+', '@', '=', '~', '!', '*', '\'', '"', '<', '>', '&', ';', ',', '(', ')', '[', ']', '{', '}', '|', '\\', '^', '`', '$']),
        2 => prop::sample::select(vec!['é', 'ß', 'Ж', '日', '本', 'ع', '🦀', '😀', 'µ', '\u{10FFFD}']),
        1 => prop::sample::select(vec![
            ' ', '\t', '\n', '\r', '\u{7F}', '\u{85}', '\u{A0}', '\u{AD}', '\u{200B}', '\u{200E}',
            '\u{2028}', '\u{202E}', '\u{2066}', '\u{3000}', '\u{FEFF}', '/', '?', '#', '\u{1}',
            '\u{1F}', '\u{9F}', '\u{61C}', '\u{180E}', '\u{205F}', '\u{FFF9}'
        ]),
    ]
}

fn id_text() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => prop::collection::vec(id_char(), 0..12).prop_map(|c| c.into_iter().collect()),
        1 => prop::sample::select(vec![".".to_string(), "..".into(), "...".into(), "".into()]),
        // Around the byte limit, in one- to four-byte characters.
        2 => (prop::sample::select(vec!['a', 'é', '日', '🦀']), 45usize..205).prop_map(|(c, n)| {
            let mut s = String::new();
            while s.len() + c.len_utf8() <= n { s.push(c); }
            s
        }),
    ]
}

fn whole_ish() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => (-3i64..15).prop_map(Value::from),
        2 => prop::sample::select(vec![0i64, 1, 999, 1000, 1001, 604_800_000, 604_800_001, 315_360_000_000, 315_360_000_001, 253_402_300_799_999, 253_402_300_800_000, i64::MAX, i64::MIN]).prop_map(Value::from),
        1 => Just(json!(u64::MAX)),
        2 => prop::sample::select(vec![2.0f64, 2.5, -0.0, 1e3, 9.5, 1e300, 5e-324]).prop_map(|f| json!(f)),
        1 => prop::sample::select(vec![json!("5"), json!(true), Value::Null, json!([1]), json!({})]),
    ]
}

fn duration_text() -> impl Strategy<Value = String> {
    let unit = prop::sample::select(vec![
        "ns", "us", "µs", "ms", "s", "sec", "secs", "m", "min", "mins", "h", "hr", "hours", "d",
        "days", "w", "weeks", "M", "months", "y", "yr", "years", "", "x", "S", "Ms", "mss",
    ]);
    let number = prop_oneof![
        4 => (0u64..5000).prop_map(|n| n.to_string()),
        1 => (0u64..100, 0u32..1_000_000_000, 0usize..11).prop_map(|(i, f, d)| {
            let f = format!("{f:09}");
            format!("{i}.{}{}", &f[..d.min(9)], "0".repeat(d.saturating_sub(9)))
        }),
        1 => prop::sample::select(vec!["3650", "3651", "10", "87600", "1000000", "99999999999999999999", "123456789012345678901", "", ".", "1.", ".5", "-1"]).prop_map(String::from),
    ];
    let term = (
        number,
        prop::sample::select(vec!["", " ", "\t", "  "]),
        unit,
    )
        .prop_map(|(n, sp, u)| format!("{n}{sp}{u}"));
    prop_oneof![
        8 => (prop::collection::vec(term, 1..4), prop::sample::select(vec!["", " ", "\t"]))
            .prop_map(|(terms, sep)| terms.join(sep)),
        1 => prop::sample::select(vec!["", " ", "1s\n", "1,5s", "1e3s", "1h 30m", "1.5s", "0s", "0.000000001s", "1 2s", "1s2"]).prop_map(String::from),
        1 => "[ -~]{0,70}",
    ]
}

fn backoff() -> impl Strategy<Value = Value> {
    let kind = prop_oneof![
        5 => prop::sample::select(vec!["fixed", "linear", "exponential"]).prop_map(Value::from),
        1 => prop::sample::select(vec![json!("random"), json!(5), Value::Null]),
    ];
    let dur = prop_oneof![4 => duration_text().prop_map(Value::from), 1 => Just(json!(1000)), 1 => Just(Value::Null)];
    let jitter = prop_oneof![3 => (0.0f64..1.2).prop_map(|j| json!(j)), 1 => Just(json!("0.1")), 1 => Just(Value::Null)];
    (
        kind,
        dur.clone(),
        prop::option::of(dur),
        prop::option::of(jitter),
        prop::option::of(Just(json!(1))),
    )
        .prop_map(|(kind, base, max, jitter, extra)| {
            let mut m = Map::new();
            m.insert("kind".into(), kind);
            m.insert("base".into(), base);
            if let Some(max) = max {
                m.insert("max".into(), max);
            }
            if let Some(j) = jitter {
                m.insert("jitter".into(), j);
            }
            if let Some(x) = extra {
                m.insert("factor".into(), x);
            }
            Value::Object(m)
        })
}

/// A payload: small objects (under 60 bytes as compact JSON) or large ones (over 400), so a
/// limit of 200 bytes judges them alike however PostgreSQL spaces its text; and non-objects.
fn payload() -> impl Strategy<Value = Value> {
    prop_oneof![
        6 => prop::collection::btree_map("[a-z]{1,3}", prop_oneof![(0i64..100).prop_map(Value::from), "[a-z ]{0,5}".prop_map(Value::from), Just(Value::Null)], 0..3)
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        1 => (420usize..600).prop_map(|n| json!({"blob": "x".repeat(n)})),
        1 => prop::sample::select(vec![json!([1]), json!("x"), json!(3), Value::Null]),
    ]
}

const FIELDS: &[&str] = &[
    "id",
    "queue",
    "payload",
    "priority",
    "max_attempts",
    "timeout_ms",
    "idempotency_key",
    "run_at_ms",
    "delay_ms",
    "backoff",
    "then",
    "depends_on",
];

fn field_value(field: &'static str, depth: u32) -> BoxedStrategy<Value> {
    match field {
        "id" | "idempotency_key" => prop_oneof![6 => id_text().prop_map(Value::from), 1 => whole_ish()].boxed(),
        "queue" => prop_oneof![
            5 => prop::sample::select(vec!["email", "a", "pdf-2", "Q_1"]).prop_map(Value::from),
            2 => "[a-zA-Z0-9_.\\- é]{0,8}".prop_map(Value::from),
            1 => (60usize..70).prop_map(|n| Value::from("q".repeat(n))),
            1 => Just(json!(7)),
        ].boxed(),
        "payload" => payload().boxed(),
        "backoff" => prop_oneof![5 => backoff(), 1 => Just(json!("1s"))].boxed(),
        "depends_on" => prop_oneof![
            4 => prop::collection::vec(prop_oneof![6 => id_text().prop_map(Value::from), 1 => Just(Value::Null)], 0..4).prop_map(Value::from),
            1 => Just(json!("a")),
            1 => (99usize..103).prop_map(|n| Value::from((0..n).map(|i| format!("p{i}")).collect::<Vec<_>>())),
        ].boxed(),
        "then" if depth < 3 => prop_oneof![
            4 => prop::collection::vec(spec(depth + 1, true), 0..3).prop_map(Value::from),
            1 => Just(json!({"queue": "a"})),
            // Too deep, or too many.
            1 => Just(deep_then(contract::MAX_THEN_DEPTH + 1)),
            1 => (99usize..102).prop_map(|n| Value::from(vec![json!({"queue": "q", "payload": {}}); n])),
        ].boxed(),
        "then" => Just(json!([])).boxed(),
        _ => whole_ish().boxed(),
    }
}

fn deep_then(levels: usize) -> Value {
    let mut v = json!({"queue": "q", "payload": {}});
    for _ in 1..levels {
        v = json!({"queue": "q", "payload": {}, "then": [v]});
    }
    json!([v])
}

/// A random spec: mostly a valid core (queue and payload) with random other fields, some of
/// them unknown or missing.
fn spec(depth: u32, then_like: bool) -> BoxedStrategy<Value> {
    let extra = prop::sample::subsequence(FIELDS.to_vec(), 0..5);
    let unknown = prop::option::weighted(
        0.05,
        prop::sample::select(vec!["qeue", "zzz", "Payload", "a"]),
    );
    (extra, unknown, any::<bool>(), any::<bool>())
        .prop_flat_map(move |(fields, unknown, drop_queue, drop_payload)| {
            let values: Vec<BoxedStrategy<(String, Value)>> = fields
                .into_iter()
                .map(|f| {
                    field_value(f, depth)
                        .prop_map(move |v| (f.to_string(), v))
                        .boxed()
                })
                .collect();
            values.prop_map(move |pairs| {
                let mut m = Map::new();
                if !drop_queue || then_like {
                    m.insert("queue".into(), json!("email"));
                }
                if !drop_payload || then_like {
                    m.insert("payload".into(), json!({"n": 1}));
                }
                for (k, v) in pairs {
                    m.insert(k, v);
                }
                if let Some(u) = unknown {
                    m.insert(u.into(), json!(1));
                }
                Value::Object(m)
            })
        })
        .boxed()
}

fn door() -> impl Strategy<Value = Door> {
    prop::sample::select(vec![Door::Message, Door::Then, Door::Enqueue])
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(512),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
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
    for f in FIELDS {
        assert!(fields.contains(*f), "no spec refused for {f}: {fields:?}");
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
