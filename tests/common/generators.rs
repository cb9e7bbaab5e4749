//! Random job specs, ids, numbers, durations and payloads for the property tests
//! (`tests/contract.rs`, `tests/fuzz.rs`): every class of value the job contract knows,
//! valid and not, near each limit.

use proptest::prelude::*;
use serde_json::{json, Map, Value};

/// Characters of every class the contract knows: allowed ASCII, punctuation that matters in
/// URLs and HTML, letters of other scripts, emoji, and each kind it refuses.
pub fn id_char() -> impl Strategy<Value = char> {
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

pub fn id_text() -> impl Strategy<Value = String> {
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

pub fn whole_ish() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => (-3i64..15).prop_map(Value::from),
        2 => prop::sample::select(vec![0i64, 1, 999, 1000, 1001, 604_800_000, 604_800_001, 315_360_000_000, 315_360_000_001, 253_402_300_799_999, 253_402_300_800_000, i64::MAX, i64::MIN]).prop_map(Value::from),
        1 => Just(json!(u64::MAX)),
        2 => prop::sample::select(vec![2.0f64, 2.5, -0.0, 1e3, 9.5, 1e300, 5e-324]).prop_map(|f| json!(f)),
        1 => prop::sample::select(vec![json!("5"), json!(true), Value::Null, json!([1]), json!({})]),
    ]
}

pub fn duration_text() -> impl Strategy<Value = String> {
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

pub fn backoff() -> impl Strategy<Value = Value> {
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
pub fn payload() -> impl Strategy<Value = Value> {
    prop_oneof![
        6 => prop::collection::btree_map("[a-z]{1,3}", prop_oneof![(0i64..100).prop_map(Value::from), "[a-z ]{0,5}".prop_map(Value::from), Just(Value::Null)], 0..3)
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        1 => (420usize..600).prop_map(|n| json!({"blob": "x".repeat(n)})),
        1 => prop::sample::select(vec![json!([1]), json!("x"), json!(3), Value::Null]),
    ]
}

/// Every field a spec may have (the widest door's).
pub const FIELDS: &[&str] = jobwarden::contract::ENQUEUE_FIELDS;

pub fn field_value(field: &'static str, depth: u32) -> BoxedStrategy<Value> {
    match field {
        "id" | "idempotency_key" | "key" => prop_oneof![6 => id_text().prop_map(Value::from), 1 => whole_ish()].boxed(),
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
            1 => Just(deep_then(jobwarden::contract::MAX_THEN_DEPTH + 1)),
            1 => (99usize..102).prop_map(|n| Value::from(vec![json!({"queue": "q", "payload": {}}); n])),
        ].boxed(),
        "then" => Just(json!([])).boxed(),
        // Durations, some under a millisecond or over the longest delay, and non-strings.
        "expires_in" => prop_oneof![
            4 => duration_text().prop_map(Value::from),
            1 => prop::sample::select(vec!["0s", "999us", "1ms", "11y", "3650d"]).prop_map(Value::from),
            1 => whole_ish(),
        ].boxed(),
        _ => whole_ish().boxed(),
    }
}

pub fn deep_then(levels: usize) -> Value {
    let mut v = json!({"queue": "q", "payload": {}});
    for _ in 1..levels {
        v = json!({"queue": "q", "payload": {}, "then": [v]});
    }
    json!([v])
}

/// A random spec: mostly a valid core (queue and payload) with random other fields, some of
/// them unknown or missing.
pub fn spec(depth: u32, then_like: bool) -> BoxedStrategy<Value> {
    let extra = prop::sample::subsequence(FIELDS.to_vec(), 0..5);
    let unknown = prop::option::weighted(
        0.05,
        prop::sample::select(vec!["qeue", "zzz", "Payload", "a"]),
    );
    // A message's batch (version 34), at the top only (a callback is a spec too).
    let batch = if depth == 0 {
        prop::option::weighted(0.15, batch_value()).boxed()
    } else {
        Just(None).boxed()
    };
    (extra, unknown, any::<bool>(), any::<bool>(), batch)
        .prop_flat_map(move |(fields, unknown, drop_queue, drop_payload, batch)| {
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
                if let Some(b) = &batch {
                    m.insert("batch".into(), b.clone());
                }
                Value::Object(m)
            })
        })
        .boxed()
}

/// A message's `batch`: mostly well formed (an id, a size, callbacks that are specs), with
/// each part wrong in turn.
pub fn batch_value() -> BoxedStrategy<Value> {
    let callback = prop_oneof![
        3 => Just(None),
        3 => spec(1, true).prop_map(Some),
        1 => Just(Some(json!("x"))),
        1 => Just(Some(json!({"queue": "r", "payload": {}, "depends_on": ["p"]}))),
    ];
    let id = prop_oneof![5 => Just(json!("b-1")), 3 => id_text().prop_map(Value::from), 1 => whole_ish()];
    let size = prop_oneof![
        4 => (0i64..4).prop_map(Value::from),
        2 => whole_ish(),
        1 => prop::sample::select(vec![100_000_000i64, 100_000_001]).prop_map(Value::from),
    ];
    prop_oneof![
        8 => (id, size, callback.clone(), callback, prop::option::weighted(0.05, Just(json!(1))), prop::option::weighted(0.05, Just(()))).prop_map(
            |(id, size, on_complete, on_success, extra, drop)| {
                let mut m = Map::new();
                if drop.is_none() {
                    m.insert("id".into(), id);
                }
                m.insert("size".into(), size);
                if let Some(c) = on_complete {
                    m.insert("on_complete".into(), c);
                }
                if let Some(c) = on_success {
                    m.insert("on_success".into(), c);
                }
                if let Some(x) = extra {
                    m.insert("name".into(), x);
                }
                Value::Object(m)
            }
        ),
        1 => prop::sample::select(vec![json!("b"), json!([]), Value::Null]),
    ]
    .boxed()
}

/// The properties' configuration. The suite's short run is the same every time (a fixed
/// seed: CI never fails on a case no one can replay); a long run by hand — `PROPTEST_CASES`
/// set, or `FUZZ_RANDOM=1` — draws new cases each time, and a failure prints the seed.
pub fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok());
    let random = cases.is_some() || std::env::var_os("FUZZ_RANDOM").is_some();
    ProptestConfig {
        cases: cases.unwrap_or(512),
        failure_persistence: None,
        rng_seed: if random {
            proptest::test_runner::RngSeed::Random
        } else {
            proptest::test_runner::RngSeed::Fixed(0x6a6f_6277_6172_6465)
        },
        ..ProptestConfig::default()
    }
}
