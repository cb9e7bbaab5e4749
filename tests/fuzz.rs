//! Fuzzing the ways in: arbitrary bodies, headers, ids and numbers through the decoder, the
//! envelope → row → message round trip and the settle decision (pure, many cases), then
//! batches of them through a real worker against real servers (fewer cases). The property,
//! at every level: **every input is either refused at the door with a named error, or
//! reaches a terminal state once, and no other job is delayed by it** (invariants 9 and 13).
//!
//! The corpus in `tests/corpus/messages/` (bodies that once broke something, or sit on an
//! edge) runs every time, first. Case counts: `PROPTEST_CASES` for the pure properties
//! (default 512), `FUZZ_BATCHES` for the real-server batches (default 3, of about 60
//! messages each). The suite's short run draws the same cases every time (a fixed seed); a
//! long run by hand draws new ones (any `PROPTEST_CASES`, or `FUZZ_RANDOM=1`):
//!
//! ```sh
//! PROPTEST_CASES=100000 FUZZ_BATCHES=50 cargo test --release --test fuzz -- --nocapture
//! ```

mod common;

use common::generators::{config, id_text, spec};
use common::TestEnv;
use jobwarden::backoff::{settle, Backoff, Outcome, Settlement, LONGEST_DELAY};
use jobwarden::contract::{self, Door};
use jobwarden::handler::{from_fn, JobError};
use jobwarden::job::{self, Envelope, MessageOrigin};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const LIMIT: usize = 64 * 1024;

fn origin(msg_id: Option<&str>) -> MessageOrigin<'_> {
    MessageOrigin {
        queue: "email",
        stream: "JOBS",
        stream_seq: 7,
        stored_ns: 1_763_828_428_160_350_775,
        msg_id,
    }
}

/// The corpus: every file of `tests/corpus/messages/`, by name.
fn corpus() -> Vec<(String, Vec<u8>)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/messages");
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    out.sort();
    assert!(out.len() >= 20, "the corpus has {} bodies", out.len());
    out
}

/// Bodies: arbitrary bytes, random specs (envelopes and plain payloads of every kind), and
/// specs with a few bytes changed.
fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        2 => prop::collection::vec(any::<u8>(), 0..200),
        6 => spec(0, false).prop_map(|v| {
            // A message carries no queue (the subject names it): most lose it, so the rest
            // are envelopes; a few keep it and are plain payloads.
            let mut v = v;
            if let Value::Object(m) = &mut v {
                if m.len() % 5 != 0 {
                    m.remove("queue");
                }
            }
            v.to_string().into_bytes()
        }),
        2 => (spec(0, false), prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4))
            .prop_map(|(v, edits)| {
                let mut b = v.to_string().into_bytes();
                for (at, byte) in edits {
                    let i = at.index(b.len().max(1));
                    if i < b.len() { b[i] = byte; } else { b.push(byte); }
                }
                b
            }),
    ]
}

/// A refusal's text names what is wrong: a field, or the body as a whole.
fn named(e: &job::InvalidMessage) -> bool {
    let t = e.to_string();
    t.contains("field `") || t.starts_with("message body")
}

/// What the scheduler publishes for a job stored from `job` (see `worker::scheduler`).
fn republished(job: &job::NewJob, max_attempts: i32) -> Envelope {
    Envelope {
        id: Some(job.id.clone()),
        payload: job.payload.clone(),
        priority: Some(job.priority),
        max_attempts: Some(max_attempts),
        timeout_ms: job.timeout_ms().map(|t| t as u64),
        idempotency_key: None,
        run_at_ms: None,
        backoff: None,
    }
}

/// The pure property for one body (the corpus and the generator share it).
fn decode_property(body: &[u8], msg_id: Option<&str>) -> Result<(), TestCaseError> {
    match job::decode(body, &origin(msg_id), LIMIT) {
        Err(e) => prop_assert!(named(&e), "unnamed refusal: {}", e),
        Ok(job) => {
            // What it accepts obeys the contract…
            prop_assert!(contract::check_id(&job.id).is_ok(), "{:?}", job.id);
            prop_assert!(contract::check_payload(&job.payload, "payload", None).is_ok());
            prop_assert!((0..=9).contains(&job.priority));
            prop_assert!(
                job.key
                    .as_deref()
                    .is_none_or(|k| contract::check_job_key(k).is_ok()),
                "{:?}",
                job.key
            );
            // …round-trips through the row and the message the scheduler makes of it…
            let envelope = republished(&job, job.max_attempts.unwrap_or(5));
            let Value::Object(obj) = serde_json::to_value(&envelope).unwrap() else {
                unreachable!()
            };
            prop_assert!(
                contract::check_spec(&obj, Door::Message, None).is_ok(),
                "the scheduler would refuse {:?}",
                obj
            );
            let header = format!("{}:3", job.id);
            prop_assert!(async_nats::HeaderValue::from_str(&header).is_ok());
            let again = job::decode(
                &serde_json::to_vec(&envelope).unwrap(),
                &origin(Some(&header)),
                LIMIT,
            )
            .map_err(|e| TestCaseError::fail(format!("republished message refused: {e}")))?;
            prop_assert_eq!(&again.id, &job.id);
            prop_assert_eq!(&again.payload, &job.payload);
            prop_assert_eq!(again.priority, job.priority);
            prop_assert_eq!(again.timeout, job.timeout);
            // …with a backoff every reader of the row reads back the same…
            if let Some(b) = job.backoff {
                let stored = serde_json::to_value(b).unwrap();
                let read: Backoff = serde_json::from_value(stored.clone()).unwrap();
                prop_assert_eq!(read, b);
                prop_assert_eq!(contract::check_backoff(&stored, "backoff").unwrap(), b);
            }
            // …and `then` specs stored in a form the contract accepts as they are.
            if let Some(then) = &job.then {
                let mut wrapper = serde_json::Map::new();
                wrapper.insert("payload".into(), json!({}));
                wrapper.insert("then".into(), then.clone());
                let checked = contract::check_spec(&wrapper, Door::Message, None).unwrap();
                prop_assert_eq!(checked.then.as_ref(), Some(then));
            }
        }
    }
    Ok(())
}

#[test]
fn the_corpus_decodes_or_is_refused_by_name() {
    for (name, body) in corpus() {
        decode_property(&body, None).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn every_body_decodes_to_a_valid_round_tripping_job_or_is_refused_by_name(
        body in body(),
        msg_id in prop::option::of(id_text()),
    ) {
        decode_property(&body, msg_id.as_deref())?;
    }

    #[test]
    fn every_settle_decision_is_computable(
        b in common::generators::backoff(),
        attempt in prop_oneof![1u32..5, Just(u32::MAX - 1), 0u32..2000],
        max in prop_oneof![1u32..5, 1u32..1001],
        kind in 0u8..5,
        deadline_ms in 1u64..=jobwarden::contract::MAX_DEFER_MS as u64,
        retry_after_ms in prop::option::of(prop_oneof![0u64..10_000, Just(u64::MAX)]),
        unit in 0.0f64..1.0,
    ) {
        // Only backoffs the contract accepts reach the settle path.
        let Ok(backoff) = contract::check_backoff(&b, "backoff") else { return Ok(()); };
        let outcome = match kind {
            0 => Outcome::Success(Some(json!({"ok": true}))),
            1 => Outcome::Permanent { error: "no".into() },
            2 => Outcome::Released,
            3 => Outcome::Deferred { deadline: Duration::from_millis(deadline_ms) },
            _ => Outcome::Retry { error: "again".into(), retry_after: retry_after_ms.map(Duration::from_millis) },
        };
        match settle(outcome, attempt, max, &backoff, unit) {
            Settlement::RetryAfter { delay, .. } => {
                prop_assert!(attempt < max);
                prop_assert!(delay <= LONGEST_DELAY);
                let _ = std::time::Instant::now() + delay;
            }
            Settlement::Dead { error } => prop_assert!(!error.is_empty()),
            Settlement::Await { deadline, retry } => {
                prop_assert_eq!(deadline, Duration::from_millis(deadline_ms));
                prop_assert!(retry <= LONGEST_DELAY);
                let _ = std::time::Instant::now() + deadline + retry;
            }
            Settlement::Complete(_) | Settlement::Release => {}
        }
    }

    #[test]
    fn stored_headers_are_read_without_panics_and_keep_nothing_a_client_cannot(
        raw in prop::collection::vec(prop_oneof![any::<u8>(), Just(b'\r'), Just(b'\n'), Just(b':')], 0..120),
    ) {
        let mut bytes = b"NATS/1.0\r\n".to_vec();
        bytes.extend(raw);
        let (headers, _why) = jobwarden::broker::parse_stored_headers(&bytes);
        for (_, values) in headers.iter() {
            for v in values {
                prop_assert!(!v.as_str().contains(['\r', '\n']));
            }
        }
    }
}

// ---- through a real worker -------------------------------------------------------------

const QUEUE: &str = r#"
[queues.email]
concurrency = 16
max_attempts = 2
timeout = "5s"
backoff = { kind = "fixed", base = "50ms" }
handler = { kind = "rust", name = "h" }
"#;

#[derive(Default)]
struct Record {
    runs: HashMap<String, u32>,
    successes: HashMap<String, u32>,
}

/// Does what the payload says (`"do": "retry" | "perm" | "slow"`), else succeeds.
fn handler(record: Arc<Mutex<Record>>) -> Arc<dyn jobwarden::Handler> {
    from_fn(move |job| {
        let record = record.clone();
        async move {
            *record
                .lock()
                .unwrap()
                .runs
                .entry(job.id.clone())
                .or_default() += 1;
            let what = job.payload.get("do").and_then(Value::as_str).unwrap_or("");
            match what {
                "retry" => return Err(JobError::retry("asked to")),
                "perm" => return Err(JobError::permanent("asked to")),
                "slow" => tokio::time::sleep(Duration::from_millis(50)).await,
                _ => {}
            }
            *record
                .lock()
                .unwrap()
                .successes
                .entry(job.id.clone())
                .or_default() += 1;
            Ok(None)
        }
    })
}

/// One message of a batch: its lane, headers and body.
#[derive(Clone)]
struct Message {
    band: Option<u8>,
    msg_id: Option<String>,
    traceparent: Option<String>,
    body: Vec<u8>,
}

impl std::fmt::Debug for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Message")
            .field("band", &self.band)
            .field("msg_id", &self.msg_id)
            .field("traceparent", &self.traceparent)
            .field("body", &String::from_utf8_lossy(&self.body))
            .finish()
    }
}

fn message() -> impl Strategy<Value = Message> {
    let behaviour = prop::sample::select(vec!["ok", "ok", "retry", "perm", "slow"]);
    let body = prop_oneof![
        3 => body(),
        // Well-formed jobs, some with odd fields: they must run.
        2 => (behaviour, prop::option::of(0i64..10), prop::option::of(1i64..4)).prop_map(|(b, p, a)| {
            let mut v = json!({"payload": {"do": b}});
            if let Some(p) = p { v["priority"] = json!(p); }
            if let Some(a) = a { v["max_attempts"] = json!(a); }
            v.to_string().into_bytes()
        }),
    ];
    (
        prop::option::weighted(0.3, 0u8..10),
        prop::option::weighted(0.3, id_text()),
        prop::option::weighted(
            0.2,
            prop_oneof![
                "[ -~]{0,60}",
                Just("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".to_string())
            ],
        ),
        body,
    )
        .prop_map(|(band, msg_id, traceparent, body)| Message {
            band,
            msg_id,
            traceparent,
            body,
        })
}

/// Publishes a message as any producer would; the stream sequence, or `None` when the
/// client itself refuses it (a header value it cannot send).
async fn publish(env: &TestEnv, m: &Message) -> Option<u64> {
    let subject = match m.band {
        Some(b) => format!("jobs.email.{b}"),
        None => "jobs.email".to_string(),
    };
    let mut headers = async_nats::HeaderMap::new();
    for (name, value) in [("Nats-Msg-Id", &m.msg_id), ("traceparent", &m.traceparent)] {
        if let Some(v) = value {
            headers.insert(name, async_nats::HeaderValue::from_str(v).ok()?);
        }
    }
    let ack = env
        .broker
        .js
        .publish_with_headers(subject, headers, m.body.clone().into())
        .await
        .unwrap()
        .await
        .unwrap();
    (!ack.duplicate).then_some(ack.sequence)
}

#[tokio::test]
async fn every_message_is_refused_by_name_or_ends_once_and_delays_no_other_job() {
    let env = TestEnv::new(QUEUE).await;
    let record = Arc::new(Mutex::new(Record::default()));
    let worker = env.worker(&[("h", handler(record.clone()))]).await;
    let batches: usize = std::env::var("FUZZ_BATCHES")
        .ok()
        .and_then(|b| b.parse().ok())
        .unwrap_or(3);
    let mut runner = TestRunner::new(config());
    let strategy = prop::collection::vec(message(), 50..70);
    let db = env.store.raw().await.unwrap();
    let schema = env.config.database.schema.clone();
    for batch in 0..=batches {
        // Batch 0 is the corpus, on the bare subject.
        let messages: Vec<Message> = if batch == 0 {
            corpus()
                .into_iter()
                .map(|(_, body)| Message {
                    band: None,
                    msg_id: None,
                    traceparent: None,
                    body,
                })
                .collect()
        } else {
            strategy.new_tree(&mut runner).unwrap().current()
        };
        let mut sent = Vec::new();
        for m in &messages {
            if let Some(seq) = publish(&env, m).await {
                sent.push((seq, m.clone()));
            }
        }
        // Canaries behind them: ordinary jobs that must run once each, unhindered.
        let canaries: Vec<String> = (0..10).map(|i| format!("canary-{batch}-{i}")).collect();
        for c in &canaries {
            env.publish_raw(
                "email",
                json!({"id": c, "payload": {"do": "ok"}}).to_string(),
            )
            .await;
        }
        let all_done = common::wait_for(Duration::from_secs(90), || async {
            let busy: i64 = db
                .query_one(
                    &format!("SELECT count(*) FROM \"{schema}\".jobs WHERE queue = 'email' AND (status IN ('queued', 'processing') OR (status = 'scheduled' AND scheduled_at < now() + interval '1 minute'))"),
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            let (pending, unacked) = env.consumer_backlog("email").await;
            busy == 0 && pending == 0 && unacked == 0
        })
        .await;
        assert!(all_done, "batch {batch}: jobs or messages still in flight");
        let (runs, successes) = {
            let r = record.lock().unwrap();
            (r.runs.clone(), r.successes.clone())
        };
        for c in &canaries {
            assert_eq!(successes.get(c), Some(&1), "batch {batch}: canary {c}");
        }
        // Every message: refused by name (a dead job under its own id, with the reason), or
        // its job ended (completed once, or dead), or it waits for a run_at it asked for.
        for (seq, m) in &sent {
            let rows = db
                .query(
                    &format!(
                        "SELECT id, status, last_error, attempts, scheduled_at > now() + interval '1 minute' \
                         FROM \"{schema}\".jobs WHERE queue = 'email' AND (id ~ $1 OR id = $2 OR id = $3)"
                    ),
                    &[
                        // The message's own id exactly (a `then` job's id begins with its
                        // parent's, and is another job: it may wait on a queue no one serves).
                        &format!("^JOBS-{seq}-[0-9]+$"),
                        // A header value reaches the worker trimmed, as NATS clients read it.
                        &m.msg_id.as_deref().map(str::trim).unwrap_or_default().to_string(),
                        &serde_json::from_slice::<Value>(&m.body).ok().and_then(|v| v.get("id").and_then(Value::as_str).map(String::from)).unwrap_or_default(),
                    ],
                )
                .await
                .unwrap();
            assert!(
                !rows.is_empty(),
                "batch {batch}: message {seq} left no trace: {m:?}"
            );
            for r in &rows {
                let (id, status, error, attempts, later): (
                    String,
                    String,
                    Option<String>,
                    i32,
                    bool,
                ) = (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4));
                match status.as_str() {
                    "completed" => assert_eq!(
                        successes.get(&id),
                        Some(&1),
                        "{id}: completed, ran {:?}",
                        successes.get(&id)
                    ),
                    "dead" => assert!(
                        error.as_deref().is_some_and(|e| !e.is_empty()),
                        "{id}: dead without a reason"
                    ),
                    "scheduled" => assert!(later, "{id}: scheduled and due, yet not published"),
                    // Ended before it ran, with the reason: its expiry had passed (or a
                    // throttle or debounce of its key took it, schema version 23).
                    "cancelled" => assert!(
                        error
                            .as_deref()
                            .is_some_and(|e| ["expired:", "throttled:", "debounced:"]
                                .iter()
                                .any(|p| e.starts_with(p)))
                            && runs.get(&id).copied().unwrap_or(0) == 0,
                        "batch {batch}: {id} cancelled ({error:?}), ran {:?}",
                        runs.get(&id)
                    ),
                    other => panic!("batch {batch}: {id} is {other} (message {seq}: {m:?})"),
                }
                assert!(
                    runs.get(&id).copied().unwrap_or(0) <= attempts.max(0) as u32 + 1,
                    "{id}: ran more often than its attempts"
                );
                assert!(
                    successes.get(&id).copied().unwrap_or(0) <= 1,
                    "{id}: completed twice"
                );
            }
        }
    }
    assert_eq!(jobwarden::worker::Stats::get(&worker.stats.overlapping), 0);
    worker.shutdown().await;
}
