//! Jobs as the worker sees them: status names, the message envelope, and its validation.
//!
//! Everything here is pure (no I/O), so every rule about what a message may contain is unit
//! tested below. The wire format is documented in `docs/message-format.md` and
//! `docs/message.schema.json`.
//!
//! A message body is either an *envelope* — a JSON object with a `payload` field and optional
//! `id`, `priority`, `max_attempts`, `timeout`, `idempotency_key`, `run_at` — or, for the
//! simplest producer, any other JSON object, which is taken whole as the payload.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::fmt;
use std::time::Duration;

/// Longest job id we accept (ids appear in URLs, logs and message ids).
pub const MAX_ID_LEN: usize = crate::contract::MAX_ID_BYTES;
/// Longest idempotency key.
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = crate::contract::MAX_KEY_BYTES;
/// Default priority when a message names none (0 runs first, 9 last).
pub const DEFAULT_PRIORITY: i16 = crate::contract::DEFAULT_PRIORITY;

/// The states of a job. The names are the seed design's, so SQL written against them works.
///
/// ```text
///  enqueue ─▶ queued ─claim─▶ processing ─ok─▶ completed
///               ▲                │  │ └─ error, attempts left ─▶ scheduled ─(due)─▶ queued
///               └── reclaimed ───┘  └─ attempts exhausted / permanent ─▶ dead
///  run_at in the future: enqueue ─▶ scheduled;   any non-terminal ─cancel─▶ cancelled
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobStatus {
    /// Waits for the jobs it depends on (`depends_on`); not published yet.
    Waiting,
    Queued,
    Scheduled,
    Processing,
    /// Its handler deferred it: it awaits a completion or failure from outside (with the
    /// attempt's token) until its deadline (completion from outside).
    Awaiting,
    Completed,
    Dead,
    Cancelled,
}

impl JobStatus {
    pub const ALL: [JobStatus; 8] = [
        JobStatus::Waiting,
        JobStatus::Queued,
        JobStatus::Scheduled,
        JobStatus::Processing,
        JobStatus::Awaiting,
        JobStatus::Completed,
        JobStatus::Dead,
        JobStatus::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Waiting => "waiting",
            JobStatus::Queued => "queued",
            JobStatus::Scheduled => "scheduled",
            JobStatus::Processing => "processing",
            JobStatus::Awaiting => "awaiting",
            JobStatus::Completed => "completed",
            JobStatus::Dead => "dead",
            JobStatus::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<JobStatus> {
        JobStatus::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// A terminal job never runs again (unless an operator retries a dead one).
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobStatus::Completed | JobStatus::Dead | JobStatus::Cancelled
        )
    }

    /// The transitions the state diagram allows; the SQL in `store` only ever makes these.
    pub fn can_become(self, next: JobStatus) -> bool {
        use JobStatus::*;
        matches!(
            (self, next),
            (Queued, Processing)
                | (Scheduled, Queued)
                | (Scheduled, Processing)
                | (Processing, Completed)
                | (Processing, Scheduled)
                | (Processing, Queued)
                | (Processing, Dead)
                | (Processing, Awaiting)
                | (Awaiting, Completed)
                | (Awaiting, Scheduled)
                | (Awaiting, Dead)
                | (Dead, Queued)
                | (Queued | Scheduled | Processing | Awaiting, Cancelled)
        )
    }
}

impl fmt::Display for JobStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A job decoded from a message and validated, ready to be claimed.
#[derive(Debug, Clone, PartialEq)]
pub struct NewJob {
    pub id: String,
    pub queue: String,
    pub payload: Value,
    pub priority: i16,
    /// The message's envelope named the priority (else it is the subject's).
    pub priority_named: bool,
    pub max_attempts: Option<i32>,
    pub timeout: Option<Duration>,
    pub idempotency_key: Option<String>,
    /// Unix milliseconds; a job whose run_at is in the future waits as `scheduled`.
    pub run_at_ms: Option<i64>,
    /// Overrides the queue's backoff for this job.
    pub backoff: Option<crate::backoff::Backoff>,
    /// Jobs to create when this one completes (checked specs, see [`Then`]).
    pub then: Option<Value>,
    /// Not started by this instant (Unix ms), it never runs: `expires_at_ms`, or
    /// `expires_in` counted from when the stream stored the message.
    pub expires_at_ms: Option<i64>,
    /// What groups the job with others (a customer, a tenant): the envelope's `key`, or
    /// where the queue's `key_from` says a message carries it (checked by the contract).
    pub key: Option<String>,
    /// Debounce, throttle, unique_for as `jobs.gate` stores them (whole ms; `None`: none, the
    /// common case): the job's own fields, else its queue's (see
    /// [`crate::contract::Gate::applied`]).
    pub gate: Option<Value>,
    /// The batch a message's job is a member of (its envelope's `batch`, schema version 34).
    pub batch: Option<crate::contract::BatchDecl>,
}

impl NewJob {
    /// A job with only an id, a queue and a payload: the defaults for everything else.
    pub fn plain(id: String, queue: String, payload: Value) -> NewJob {
        NewJob {
            id,
            queue,
            payload,
            priority: DEFAULT_PRIORITY,
            priority_named: false,
            max_attempts: None,
            timeout: None,
            idempotency_key: None,
            run_at_ms: None,
            backoff: None,
            then: None,
            expires_at_ms: None,
            key: None,
            gate: None,
            batch: None,
        }
    }

    /// The per-job timeout as PostgreSQL stores it (milliseconds, `int4`).
    pub fn timeout_ms(&self) -> Option<i32> {
        self.timeout
            .map(|d| d.as_millis().min(i32::MAX as u128) as i32)
    }

    /// The per-job backoff as PostgreSQL stores it (`jsonb`).
    pub fn backoff_json(&self) -> Option<Value> {
        self.backoff
            .as_ref()
            .map(|b| serde_json::to_value(b).expect("a backoff serialises"))
    }
}

/// What the producer side writes (CLI, Rust client, docs). Fields mirror `NewJob`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Envelope {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    pub payload: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<i16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<i32>,
    /// Milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// Unix milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_at_ms: Option<i64>,
    /// Overrides the queue's backoff, e.g. `{"kind":"exponential","base":"1s","max":"1m"}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backoff: Option<crate::backoff::Backoff>,
}

/// Why a message could not become a job. The text names the field and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidMessage {
    #[error(
        "message body is not valid JSON ({0}); publish a JSON object, e.g. {{\"payload\": {{…}}}}"
    )]
    NotJson(String),
    #[error("message body is JSON {0}, not an object; publish a JSON object, e.g. {{\"payload\": {{…}}}}")]
    NotObject(&'static str),
    /// A field the contract refuses (`crate::contract`): the same words at every door.
    #[error(transparent)]
    Refused(#[from] crate::contract::Refused),
    #[error("message body is {size} bytes, over the limit of {limit} bytes (worker.max_payload_bytes); store large data elsewhere and pass a reference")]
    TooLarge { size: usize, limit: usize },
    #[error("queue `{0}` is not configured on this worker; add a [queues.{0}] section to the configuration")]
    UnknownQueue(String),
}

/// The envelope fields; an object with `payload` and only these keys is an envelope.
fn is_envelope(obj: &Map<String, Value>) -> bool {
    let fields = crate::contract::Door::Message.fields();
    obj.contains_key("payload") && obj.keys().all(|k| fields.contains(&k.as_str()))
}

/// Validates a job id (see [`crate::contract::check_id`]).
pub fn validate_id(id: &str) -> Result<(), String> {
    crate::contract::check_id(id)
}

/// Validates a queue name (see [`crate::contract::check_queue`]).
pub fn validate_queue_name(q: &str) -> Result<(), String> {
    crate::contract::check_queue(q)
}

/// Where a message came from, for deriving an id when the body carries none.
#[derive(Debug, Clone)]
pub struct MessageOrigin<'a> {
    pub queue: &'a str,
    pub stream: &'a str,
    pub stream_seq: u64,
    /// When the stream stored the message, in nanoseconds since the Unix epoch (the same
    /// value in every delivery of it, and in a direct read of the stream).
    pub stored_ns: i128,
    /// The `Nats-Msg-Id` header, if the producer set one.
    pub msg_id: Option<&'a str>,
}

/// The id a message itself gets when the body carries none: `<stream>-<sequence>-<stored
/// time in ns>`. Every delivery of one message maps to the same row; a stream deleted and
/// created again (or restored from a backup) starts its sequences over, but never at the same
/// instant, so a new message never lands on an old job's row.
pub fn message_id(origin: &MessageOrigin<'_>) -> String {
    // Every message without an id of its own comes here: the string is sized once and the
    // numbers written by `itoa` (`format!` cost ~2,000 instructions per id, mostly growing
    // its buffer and the formatting machinery; this costs a tenth of that).
    let mut seq = itoa::Buffer::new();
    let mut ns = itoa::Buffer::new();
    let (seq, ns) = (seq.format(origin.stream_seq), ns.format(origin.stored_ns));
    let mut id = String::with_capacity(origin.stream.len() + seq.len() + ns.len() + 2);
    id.push_str(origin.stream);
    id.push('-');
    id.push_str(seq);
    id.push('-');
    id.push_str(ns);
    id
}

/// The id a message without an `id` field gets: its `Nats-Msg-Id` when present (a producer
/// that dedups by message id means the same job), else [`message_id`].
pub fn derived_id(origin: &MessageOrigin<'_>) -> String {
    match origin.msg_id {
        Some(m) if validate_id(m).is_ok() => m.to_string(),
        _ => message_id(origin),
    }
}

/// The longest timeout a job may ask for in its message (`timeout_ms`).
pub const MAX_TIMEOUT: Duration = Duration::from_millis(crate::contract::MAX_TIMEOUT_MS as u64);

/// Decodes and validates a message body. `max_bytes` is the configured payload limit.
pub fn decode(
    body: &[u8],
    origin: &MessageOrigin<'_>,
    max_bytes: usize,
) -> Result<NewJob, InvalidMessage> {
    if body.len() > max_bytes {
        return Err(InvalidMessage::TooLarge {
            size: body.len(),
            limit: max_bytes,
        });
    }
    let value: Value =
        serde_json::from_slice(body).map_err(|e| InvalidMessage::NotJson(e.to_string()))?;
    let Value::Object(obj) = value else {
        return Err(InvalidMessage::NotObject(crate::contract::json_kind(
            &value,
        )));
    };
    if !is_envelope(&obj) {
        let job = NewJob::plain(
            derived_id(origin),
            origin.queue.to_string(),
            Value::Object(obj),
        );
        check_storable(&job.payload)?;
        return Ok(job);
    }
    // The whole body was measured above: the payload is not measured again.
    let spec = crate::contract::check_spec(&obj, crate::contract::Door::Message, None)?;
    Ok(NewJob {
        id: spec.id.unwrap_or_else(|| derived_id(origin)),
        queue: origin.queue.to_string(),
        payload: spec.payload,
        priority: spec.priority.unwrap_or(DEFAULT_PRIORITY),
        priority_named: spec.priority.is_some(),
        max_attempts: spec.max_attempts,
        timeout: spec.timeout_ms.map(|ms| Duration::from_millis(ms as u64)),
        run_at_ms: spec.run_at_ms,
        backoff: spec.backoff,
        then: spec.then,
        expires_at_ms: spec.expires_at_ms.or_else(|| {
            spec.expires_in_ms
                .map(|ms| stored_ms(origin).saturating_add(ms))
        }),
        gate: spec
            .gate
            .applied(&Default::default(), false, spec.idempotency_key.is_some()),
        idempotency_key: spec.idempotency_key,
        key: spec.key,
        batch: spec.batch,
    })
}

/// The batch a body names when the body itself is refused (a member with a field the
/// contract refuses): its `batch`, if that much is readable, so the member is kept as a dead
/// member of its batch and the batch does not wait for it for ever.
pub fn batch_of_refused(body: &[u8]) -> Option<crate::contract::BatchDecl> {
    let value: Value = serde_json::from_slice(body).ok()?;
    let b = value.as_object()?.get("batch")?;
    crate::contract::check_batch(b, None, "batch").ok()
}

/// When the stream stored a message, in Unix milliseconds.
pub fn stored_ms(origin: &MessageOrigin<'_>) -> i64 {
    (origin.stored_ns / 1_000_000).clamp(0, i128::from(i64::MAX)) as i64
}

/// PostgreSQL's jsonb cannot hold the NUL character (`\u0000`) in any string; such a payload
/// would fail at insert time, so we reject it here with a clear reason instead.
pub fn check_storable(payload: &Value) -> Result<(), InvalidMessage> {
    Ok(crate::contract::check_payload(payload, "payload", None)?)
}

/// A job to create when its parent completes: the `then` of an enqueue.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Then {
    pub queue: String,
    pub payload: Value,
    /// Default: `<parent id>.<n>` (n from 1), so it is created once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i16>,
    /// Default 5 (as SQL `enqueue()`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Wait this long after the parent completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<crate::backoff::Backoff>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub then: Vec<Then>,
    /// Not started this long after it is created (when its parent completed), it never
    /// runs, e.g. "1h" (the contract's duration text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_in: Option<String>,
    /// The job's key (per-key limits, fair turns, order; debounce and throttle group by it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Collapse the key's jobs within this quiet window into the last, e.g. "5s" (the
    /// contract's duration text; needs `key`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub debounce: Option<String>,
    /// Run a debounced key's job after this long at the latest, however busy the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub debounce_max_wait: Option<String>,
    /// At most one job of the key per window; the others end `cancelled` (needs `key`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throttle: Option<String>,
    /// Hold `idempotency_key` this long only (needs it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unique_for: Option<String>,
}

impl Then {
    pub fn new(queue: &str, payload: Value) -> Then {
        Then {
            queue: queue.to_string(),
            payload,
            ..Then::default()
        }
    }

    /// Adds a job to run after this one.
    pub fn then(mut self, next: Then) -> Then {
        self.then.push(next);
        self
    }
}

/// Checks `then` specs (recursively) by the job contract ([`crate::contract`]), as SQL
/// `enqueue()` and the workers' decoder do, so an enqueue is refused before anything is
/// stored.
pub fn check_then(specs: &[Then]) -> Result<(), crate::contract::Refused> {
    let then = serde_json::to_value(specs).expect("then specs serialise");
    let mut wrapper = serde_json::Map::new();
    wrapper.insert("payload".into(), Value::Object(Default::default()));
    wrapper.insert("then".into(), then);
    crate::contract::check_spec(&wrapper, crate::contract::Door::Message, None).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn origin() -> MessageOrigin<'static> {
        MessageOrigin {
            queue: "email",
            stream: "JOBS",
            stream_seq: 42,
            stored_ns: 1_763_828_428_160_350_775,
            msg_id: None,
        }
    }

    #[test]
    fn then_chains_are_envelopes_and_depends_on_is_refused_with_the_way_to_do_it() {
        let body = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/docs/examples/envelope-then.json"
        ))
        .unwrap();
        let job = decode(&body, &origin(), 1 << 20).unwrap();
        assert_eq!(job.id, "order-42");
        assert_eq!(job.payload["order"], json!(42));
        let then = job.then.unwrap();
        assert_eq!(then[0]["queue"], json!("pdf"));
        assert_eq!(then[0]["then"][0]["queue"], json!("email"));

        let err = decode(
            br#"{"payload":{},"then":[{"queue":"bad queue!","payload":{}}]}"#,
            &origin(),
            1024,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("field `then[1].queue`"), "{err}");
        let err = decode(
            br#"{"payload":{},"then":[{"queue":"pdf"}]}"#,
            &origin(),
            1024,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("payload"), "{err}");
        let err = decode(br#"{"payload":{},"depends_on":["a"]}"#, &origin(), 1024)
            .unwrap_err()
            .to_string();
        assert!(err.contains("--depends-on"), "{err}");
    }

    #[test]
    fn every_example_body_in_the_docs_decodes_and_every_invalid_one_is_refused() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/examples");
        let mut seen = 0;
        for (sub, valid) in [("", true), ("invalid", false)] {
            for entry in std::fs::read_dir(dir.join(sub)).unwrap().flatten() {
                let path = entry.path();
                if path.extension().and_then(|e| e.to_str()) != Some("json") {
                    continue;
                }
                let body = std::fs::read(&path).unwrap();
                let got = decode(&body, &origin(), 1 << 20);
                assert_eq!(got.is_ok(), valid, "{}: {got:?}", path.display());
                seen += 1;
            }
        }
        assert!(seen >= 6, "examples found: {seen}");
    }

    #[test]
    fn plain_object_is_the_payload_with_a_derived_id() {
        let job = decode(br#"{"to":"a@b.c"}"#, &origin(), 1024).unwrap();
        assert_eq!(job.id, "JOBS-42-1763828428160350775");
        // The same sequence in a stream created again is another message.
        let again = MessageOrigin {
            stored_ns: 1_763_900_000_000_000_000,
            ..origin()
        };
        assert_ne!(derived_id(&again), job.id);
        // Past 2262 the stored time no longer fits an i64: written in full all the same.
        let late = MessageOrigin {
            stored_ns: i128::from(i64::MAX) + 1,
            ..origin()
        };
        assert_eq!(message_id(&late), "JOBS-42-9223372036854775808");
        assert_eq!(job.payload, json!({"to":"a@b.c"}));
        assert_eq!(job.priority, DEFAULT_PRIORITY);
    }

    #[test]
    fn msg_id_header_becomes_the_id() {
        let o = MessageOrigin {
            msg_id: Some("order-7"),
            ..origin()
        };
        assert_eq!(decode(br#"{"a":1}"#, &o, 1024).unwrap().id, "order-7");
    }

    #[test]
    fn envelope_fields_are_read() {
        let body = br#"{"id":"j1","payload":{"x":1},"priority":0,"max_attempts":4,"timeout_ms":1500,"idempotency_key":"k","run_at_ms":5}"#;
        let job = decode(body, &origin(), 1024).unwrap();
        assert_eq!(job.id, "j1");
        assert_eq!(job.payload, json!({"x":1}));
        assert_eq!(job.priority, 0);
        assert_eq!(job.max_attempts, Some(4));
        assert_eq!(job.timeout, Some(Duration::from_millis(1500)));
        assert_eq!(job.idempotency_key.as_deref(), Some("k"));
        assert_eq!(job.run_at_ms, Some(5));
        let body = br#"{"payload":{},"backoff":{"kind":"linear","base":"2s"}}"#;
        let b = decode(body, &origin(), 1024).unwrap().backoff.unwrap();
        assert_eq!(b.delay(3), Duration::from_secs(6));
        let e = decode(
            br#"{"payload":{},"backoff":{"kind":"random"}}"#,
            &origin(),
            1024,
        )
        .unwrap_err();
        assert!(e.to_string().contains("`backoff.kind` is invalid"), "{e}");
        let e = decode(
            br#"{"payload":{},"backoff":{"kind":"fixed","base":"1s","jitter":3}}"#,
            &origin(),
            1024,
        )
        .unwrap_err();
        assert!(e.to_string().contains("jitter"), "{e}");
    }

    #[test]
    fn object_with_payload_and_other_keys_is_a_plain_payload() {
        let job = decode(br#"{"payload":1,"user":"x"}"#, &origin(), 1024).unwrap();
        assert_eq!(job.payload, json!({"payload":1,"user":"x"}));
    }

    #[test]
    fn bad_bodies_name_the_problem() {
        let e = decode(b"not json", &origin(), 1024).unwrap_err();
        assert!(matches!(e, InvalidMessage::NotJson(_)), "{e}");
        let e = decode(b"[1,2]", &origin(), 1024).unwrap_err();
        assert_eq!(e, InvalidMessage::NotObject("an array"));
        let e = decode(br#"{"payload":{},"priority":"high"}"#, &origin(), 1024).unwrap_err();
        assert!(
            e.to_string().contains("`priority` must be a whole number"),
            "{e}"
        );
        let e = decode(br#"{"payload":{},"priority":12}"#, &origin(), 1024).unwrap_err();
        assert!(e.to_string().contains("from 0 to 9"), "{e}");
        let e = decode(br#"{"payload":{},"id":7}"#, &origin(), 1024).unwrap_err();
        assert!(e.to_string().contains("`id` must be a string"), "{e}");
        let long = format!(
            r#"{{"payload":{{}},"id":"{}"}}"#,
            "x".repeat(MAX_ID_LEN + 1)
        );
        let e = decode(long.as_bytes(), &origin(), 4096).unwrap_err();
        assert!(e.to_string().contains("the limit is 200"), "{e}");
        let e = decode(br#"{"a":"0123456789"}"#, &origin(), 10).unwrap_err();
        assert!(matches!(
            e,
            InvalidMessage::TooLarge {
                size: 18,
                limit: 10
            }
        ));
        assert!(
            decode(br#"{"a":"0123456789"}"#, &origin(), 18).is_ok(),
            "a body of exactly the limit is accepted"
        );
        let e = decode(br#"{"a":"nul\u0000here"}"#, &origin(), 1024).unwrap_err();
        assert!(e.to_string().contains("NUL"), "{e}");
        let e = decode(
            br#"{"payload":{},"run_at_ms":1700000000000000000}"#,
            &origin(),
            1024,
        )
        .unwrap_err();
        assert!(e.to_string().contains("`run_at_ms` is invalid"), "{e}");
        let e = decode(
            br#"{"payload":{},"idempotency_key":"a\u0000b"}"#,
            &origin(),
            1024,
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("control or invisible characters"),
            "{e}"
        );
    }

    #[test]
    fn ids_are_checked() {
        assert!(validate_id("abc-1:2").is_ok());
        assert!(validate_id("").is_err());
        assert!(validate_id("a b").is_err());
        assert!(validate_id("a/b").is_err());
        assert!(validate_queue_name("email").is_ok());
        assert!(validate_queue_name("e.mail").is_err());
        assert!(validate_queue_name("").is_err());
    }

    #[test]
    fn state_diagram() {
        use JobStatus::*;
        assert!(Queued.can_become(Processing));
        assert!(Processing.can_become(Completed));
        assert!(Processing.can_become(Dead));
        assert!(Processing.can_become(Scheduled));
        assert!(Scheduled.can_become(Queued));
        assert!(!Completed.can_become(Processing));
        assert!(!Dead.can_become(Processing));
        assert!(!Cancelled.can_become(Queued));
        assert!(!Queued.can_become(Completed));
        for s in JobStatus::ALL {
            assert_eq!(JobStatus::parse(s.as_str()), Some(s));
            assert_eq!(s.to_string(), s.as_str(), "written as SQL names it");
            assert_eq!(s.is_terminal(), matches!(s, Completed | Dead | Cancelled));
        }
    }

    #[test]
    fn a_nats_msg_id_names_the_job_only_when_it_is_a_valid_job_id() {
        let with = |msg_id| MessageOrigin {
            msg_id: Some(msg_id),
            ..origin()
        };
        assert_eq!(derived_id(&with("order-42")), "order-42");
        // Not an id the contract accepts (a space, a slash, too long): the message's own.
        let long = "x".repeat(MAX_ID_LEN + 1);
        for bad in ["order 42", "a/b", long.as_str()] {
            assert_eq!(derived_id(&with(bad)), message_id(&origin()), "{bad:?}");
        }
        assert_eq!(derived_id(&origin()), "JOBS-42-1763828428160350775");
    }

    #[test]
    fn a_jobs_timeout_and_backoff_are_stored_as_their_columns_hold_them() {
        let mut job = NewJob::plain("j".into(), "q".into(), json!({}));
        assert_eq!((job.timeout_ms(), job.backoff_json()), (None, None));
        job.timeout = Some(Duration::from_millis(1500));
        assert_eq!(job.timeout_ms(), Some(1500));
        // An int4 holds at most i32::MAX ms (24.8 days): a longer timeout is clamped to it.
        job.timeout = Some(Duration::from_secs(30 * 86_400));
        assert_eq!(job.timeout_ms(), Some(i32::MAX));
        job.backoff = Some(crate::backoff::Backoff {
            kind: crate::backoff::BackoffKind::Linear,
            base: Duration::from_secs(2),
            max: Duration::from_secs(60),
            jitter: 0.25,
        });
        assert_eq!(
            job.backoff_json(),
            Some(json!({"kind": "linear", "base": "2s", "max": "1m", "jitter": 0.25}))
        );
    }
}
