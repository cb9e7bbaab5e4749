//! The job contract: what a job is, in one place.
//!
//! Every way a job comes in — a NATS message, SQL `enqueue()`, the `then` specs of a chain,
//! a cron definition, the CLI, the Rust client, a retry from the dashboard — accepts exactly
//! the jobs this module accepts and refuses the rest with the same named error, before
//! anything is stored (invariant 13). The rules and their limits are the constants below;
//! the SQL side is rendered from the very same constants (`migrations/V14__one_contract.sql`
//! is a template whose `{{NAME}}` placeholders [`render_sql`] fills), and a property test
//! (`tests/contract.rs`) gives the same random specs to [`check_spec`] and to the SQL
//! function `job_check()` and requires the same verdict, naming the same field.
//!
//! A job is described as a JSON object, a *spec*, with the envelope's field names:
//!
//! | field | type | range |
//! |---|---|---|
//! | `id` | string | 1 to [`MAX_ID_BYTES`] bytes, none of [`ID_FORBIDDEN`], not `.` or `..` |
//! | `queue` | string | 1 to [`MAX_QUEUE_BYTES`] ASCII letters, digits, `_`, `-` |
//! | `payload` | object | no NUL character in any string; at most the payload limit |
//! | `priority` | whole number | [`MIN_PRIORITY`] (first) to [`MAX_PRIORITY`] |
//! | `max_attempts` | whole number | 1 to [`MAX_ATTEMPTS`] |
//! | `timeout_ms` | whole number | 1 to [`MAX_TIMEOUT_MS`] |
//! | `idempotency_key` | string | 1 to [`MAX_KEY_BYTES`] bytes, none of [`KEY_FORBIDDEN`] |
//! | `run_at_ms` | whole number | 0 to [`MAX_RUN_AT_MS`] (Unix ms, up to the end of 9999) |
//! | `delay_ms` | whole number | 0 to [`MAX_DELAY_MS`] |
//! | `expires_at_ms` | whole number | 0 to [`MAX_RUN_AT_MS`] (Unix ms): not started by then, it never runs |
//! | `expires_in` | duration text | above zero, up to [`MAX_DELAY_MS`], from when it is enqueued |
//! | `backoff` | object | `kind`, `base`, `max`, `jitter`; durations up to [`MAX_DELAY_MS`] |
//! | `then` | array of specs | at most [`MAX_THEN_JOBS`] in all, [`MAX_THEN_DEPTH`] deep |
//! | `depends_on` | array of ids | at most [`MAX_DEPENDS_ON`] |
//! | `key` | string | the rules of an `id` (a customer, a tenant: what groups the job with others) |
//!
//! Which fields a door takes is its [`Door`]: a message carries no `queue` (its subject
//! names it) and no `depends_on` (a job that waits must be stored before anything runs it);
//! a `then` spec needs a `queue` and takes `delay_ms` instead of `run_at_ms` (and
//! `expires_in`, counted from its creation, but no `expires_at_ms`).
//!
//! **Every accepted value is computable**: no delay, backoff or time the contract accepts can
//! overflow a `Duration`, an `Instant`, a PostgreSQL `interval` or `timestamptz` anywhere
//! downstream (the longest delay, ten years, added to the latest `run_at` stays inside
//! PostgreSQL's range; see the tests). **Every accepted id round-trips** through a
//! `Nats-Msg-Id` header (no CR or LF), a URL path segment (percent-encoded; `.` and `..` are
//! refused because URL parsers collapse them), HTML, a log line and a CLI argument.

use serde_json::{Map, Value};
use std::fmt;

/// Longest job id, in bytes (ids appear in URLs, logs, headers and message ids).
pub const MAX_ID_BYTES: usize = 200;
/// Longest idempotency key, in bytes.
pub const MAX_KEY_BYTES: usize = 200;
/// Longest queue name (it becomes one NATS subject token and part of a consumer name).
pub const MAX_QUEUE_BYTES: usize = 64;
/// Priorities: 0 runs first, 9 last.
pub const MIN_PRIORITY: i16 = 0;
pub const MAX_PRIORITY: i16 = 9;
/// The priority of a job that names none (and of the bare subject `jobs.<queue>`).
pub const DEFAULT_PRIORITY: i16 = 5;

/// A priority the contract accepts: [`MIN_PRIORITY`] (runs first) to [`MAX_PRIORITY`].
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(try_from = "i64", into = "i16")]
pub struct Priority(i16);

impl Priority {
    pub const DEFAULT: Priority = Priority(DEFAULT_PRIORITY);

    /// The priority `p`, or why it is none (the text every door gives).
    pub fn new(p: i64) -> Result<Priority, String> {
        if (i64::from(MIN_PRIORITY)..=i64::from(MAX_PRIORITY)).contains(&p) {
            Ok(Priority(p as i16))
        } else {
            Err(format!(
                "{p} is not a whole number from {MIN_PRIORITY} to {MAX_PRIORITY}"
            ))
        }
    }

    pub fn get(self) -> i16 {
        self.0
    }

    /// Every priority, the first to run first.
    pub fn all() -> impl Iterator<Item = Priority> {
        (MIN_PRIORITY..=MAX_PRIORITY).map(Priority)
    }
}

impl Default for Priority {
    fn default() -> Self {
        Priority::DEFAULT
    }
}

impl TryFrom<i64> for Priority {
    type Error = String;
    fn try_from(p: i64) -> Result<Self, String> {
        Priority::new(p)
    }
}

impl From<Priority> for i16 {
    fn from(p: Priority) -> i16 {
        p.0
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}
/// Most attempts a job may have.
pub const MAX_ATTEMPTS: i32 = 1000;
/// Attempts of a job enqueued through SQL (or a `then` spec) that names none.
pub const DEFAULT_SQL_MAX_ATTEMPTS: i32 = 5;
/// Longest per-job timeout: 7 days (a longer one can be set as the queue's timeout).
pub const MAX_TIMEOUT_MS: i64 = 7 * DAY_MS;
/// Longest delay anything may ask for: a `delay`, a `then` spec's `delay_ms`, a backoff's
/// `base` or `max`, a handler's `Retry-After`. Ten years: `now() + MAX_DELAY_MS` fits a
/// `timestamptz` until the year 9989, and every `Duration` and `Instant` sum with it.
pub const MAX_DELAY_MS: i64 = crate::backoff::LONGEST_DELAY_MS;
/// The largest message body a worker takes unless `worker.max_payload_bytes` says otherwise.
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 1024 * 1024;
/// Latest `run_at`: the last millisecond of the year 9999, the last instant PostgreSQL's
/// `timestamptz` formats with four digits (and `chrono` and JavaScript handle).
pub const MAX_RUN_AT_MS: i64 = 253_402_300_799_999;
/// Most jobs one `then` tree may create, counting every level.
pub const MAX_THEN_JOBS: usize = 100;
/// Deepest `then` nesting (`then` inside `then` …).
pub const MAX_THEN_DEPTH: usize = 8;
/// Most parents one job may wait for.
pub const MAX_DEPENDS_ON: usize = 100;
/// Most jobs one bulk enqueue (`enqueue_many()`) takes; more go in several calls, in one
/// transaction if they must be atomic.
pub const MAX_ENQUEUE_MANY: usize = 100_000;
/// Longest batch id, in bytes: its callbacks' ids add `.on_complete` or `.on_success` to it.
pub const MAX_BATCH_ID_BYTES: usize = MAX_ID_BYTES - 16;
/// Most members a batch published over NATS may declare (`batch.size`).
pub const MAX_BATCH_SIZE: i64 = 100_000_000;
/// The fields of a message's `batch` object.
pub const BATCH_FIELDS: &[&str] = &["id", "size", "on_complete", "on_success"];
/// Largest result a job may store, as JSON text: a completion from outside with a larger one
/// is refused, a handler's larger result is replaced by `{"omitted": "<why>"}`.
pub const MAX_RESULT_BYTES: usize = crate::backoff::MAX_RESULT_BYTES;
/// Longest deadline a deferring handler may give (`Jobwarden-Defer`, `job.defer()`): 30 days.
pub const MAX_DEFER_MS: i64 = 30 * DAY_MS;
/// Longest duration text in a backoff (`"1h 30m"`), in bytes.
pub const MAX_DURATION_TEXT: usize = 64;
/// Most digits after a duration's decimal point (nanoseconds).
pub const MAX_DURATION_DECIMALS: usize = 9;
/// Most digits before it.
pub const MAX_DURATION_DIGITS: usize = 20;
/// A backoff that names no `max`.
pub const DEFAULT_BACKOFF_MAX_MS: i64 = 3_600_000;

const DAY_MS: i64 = 86_400_000;

/// Characters no job id may hold, as inclusive ranges: control characters (a CR or LF would
/// break a header line or a log line), whitespace (ids are single words on a command line),
/// invisible formatting characters (an id that looks like another in a log or on a page), and
/// `/`, `?`, `#` (ids are path segments of the local API's URLs).
pub const ID_FORBIDDEN: &[(char, char)] = &[
    ('\u{0}', '\u{20}'),      // C0 controls and the space
    ('#', '#'),               // URL fragment
    ('/', '/'),               // URL path separator
    ('?', '?'),               // URL query
    ('\u{7F}', '\u{A0}'),     // DEL, C1 controls (incl. NEL), no-break space
    ('\u{AD}', '\u{AD}'),     // soft hyphen
    ('\u{61C}', '\u{61C}'),   // Arabic letter mark
    ('\u{1680}', '\u{1680}'), // Ogham space mark
    ('\u{180E}', '\u{180E}'), // Mongolian vowel separator
    ('\u{2000}', '\u{200F}'), // spaces, zero-width characters, LRM/RLM
    ('\u{2028}', '\u{202F}'), // line/paragraph separators, bidi embeddings, narrow nbsp
    ('\u{205F}', '\u{206F}'), // math space, word joiner, invisible operators, bidi isolates
    ('\u{3000}', '\u{3000}'), // ideographic space
    ('\u{FEFF}', '\u{FEFF}'), // byte order mark
    ('\u{FFF9}', '\u{FFFB}'), // interlinear annotations
];

/// A W3C `traceparent` header (`00-<32 hex>-<16 hex>-<2 hex>`, lower case, ids not all
/// zero), or `None`: one that is not is dropped, as the W3C says (it is passed on to the
/// application and kept with the job, so it must never carry anything else).
pub fn traceparent(value: &str) -> Option<&str> {
    let parts: Vec<&str> = value.split('-').collect();
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let ok = parts.len() == 4
        && hex(parts[0], 2)
        && parts[0] != "ff"
        && hex(parts[1], 32)
        && hex(parts[2], 16)
        && hex(parts[3], 2)
        && parts[1].bytes().any(|b| b != b'0')
        && parts[2].bytes().any(|b| b != b'0');
    ok.then_some(value)
}

/// Characters no idempotency key may hold: the same, except that the space and the
/// URL characters are allowed (keys travel in headers and logs, never in a URL or as a word).
pub const KEY_FORBIDDEN: &[(char, char)] = &[
    ('\u{0}', '\u{1F}'),
    ('\u{7F}', '\u{9F}'),
    ('\u{AD}', '\u{AD}'),
    ('\u{61C}', '\u{61C}'),
    ('\u{180E}', '\u{180E}'),
    ('\u{200B}', '\u{200F}'),
    ('\u{2028}', '\u{202E}'),
    ('\u{2060}', '\u{206F}'),
    ('\u{FEFF}', '\u{FEFF}'),
    ('\u{FFF9}', '\u{FFFB}'),
];

/// Units of a backoff duration and their length in nanoseconds (the units `humantime`
/// reads, so a configuration's durations and a message's read alike).
pub const DURATION_UNITS: &[(&str, u128)] = &[
    ("nanos", 1),
    ("nsec", 1),
    ("ns", 1),
    ("usec", 1_000),
    ("us", 1_000),
    ("µs", 1_000),
    ("millis", 1_000_000),
    ("msec", 1_000_000),
    ("ms", 1_000_000),
    ("seconds", NS_S),
    ("second", NS_S),
    ("secs", NS_S),
    ("sec", NS_S),
    ("s", NS_S),
    ("minutes", 60 * NS_S),
    ("minute", 60 * NS_S),
    ("mins", 60 * NS_S),
    ("min", 60 * NS_S),
    ("m", 60 * NS_S),
    ("hours", 3600 * NS_S),
    ("hour", 3600 * NS_S),
    ("hrs", 3600 * NS_S),
    ("hr", 3600 * NS_S),
    ("h", 3600 * NS_S),
    ("days", 86_400 * NS_S),
    ("day", 86_400 * NS_S),
    ("d", 86_400 * NS_S),
    ("weeks", 604_800 * NS_S),
    ("week", 604_800 * NS_S),
    ("wks", 604_800 * NS_S),
    ("wk", 604_800 * NS_S),
    ("w", 604_800 * NS_S),
    ("months", 2_630_016 * NS_S),
    ("month", 2_630_016 * NS_S),
    ("M", 2_630_016 * NS_S),
    ("years", 31_557_600 * NS_S),
    ("year", 31_557_600 * NS_S),
    ("yrs", 31_557_600 * NS_S),
    ("yr", 31_557_600 * NS_S),
    ("y", 31_557_600 * NS_S),
];
const NS_S: u128 = 1_000_000_000;

/// Every field of a spec, as SQL `enqueue()`, the CLI, the Rust client and cron take them.
pub const ENQUEUE_FIELDS: &[&str] = &[
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
    "expires_at_ms",
    "expires_in",
    "key",
    "debounce",
    "debounce_max_wait",
    "throttle",
    "unique_for",
];

/// The fields later versions of the schema added, with the version that added each. A
/// migration renders the field lists as they were at its own version (`V14_…`, `V18_…`,
/// `V20_…` placeholders): an applied migration must render the same text again (refinery
/// refuses a database whose applied migration changed), so a new field is added here, with
/// a new migration, and never changes an older one's lists.
const ADDED_FIELDS: &[(&str, u32)] = &[
    ("expires_at_ms", 18),
    ("expires_in", 18),
    ("key", 20),
    ("debounce", 23),
    ("debounce_max_wait", 23),
    ("throttle", 23),
    ("unique_for", 23),
    ("batch", 34),
];

/// The schema versions whose migrations render the field lists (see [`ADDED_FIELDS`]).
const FIELD_LIST_VERSIONS: &[u32] = &[14, 18, 20, 23, 34];

/// Where a spec comes in: which fields it may carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Door {
    /// A NATS message's envelope: the subject names the queue; nothing waits for parents.
    Message,
    /// A `then` spec: names its queue; `delay_ms` after its parent completes.
    Then,
    /// SQL `enqueue()`, the CLI, the Rust client, cron: everything.
    Enqueue,
}

impl Door {
    /// The fields this door takes.
    pub fn fields(self) -> &'static [&'static str] {
        match self {
            Door::Message => &[
                "id",
                "payload",
                "priority",
                "max_attempts",
                "timeout_ms",
                "idempotency_key",
                "run_at_ms",
                "backoff",
                "then",
                "depends_on",
                "expires_at_ms",
                "expires_in",
                "key",
                "debounce",
                "debounce_max_wait",
                "throttle",
                "unique_for",
                "batch",
            ],
            Door::Then => &[
                "queue",
                "payload",
                "id",
                "priority",
                "max_attempts",
                "timeout_ms",
                "delay_ms",
                "idempotency_key",
                "backoff",
                "then",
                "expires_in",
                "key",
                "debounce",
                "debounce_max_wait",
                "throttle",
                "unique_for",
            ],
            Door::Enqueue => ENQUEUE_FIELDS,
        }
    }

    /// The name the SQL function `job_check()` knows it by.
    /// The fields this door took at schema version `version` (a migration's rendering).
    pub fn fields_as_of(self, version: u32) -> Vec<&'static str> {
        self.fields()
            .iter()
            .filter(|f| {
                ADDED_FIELDS
                    .iter()
                    .all(|(added, since)| added != *f || *since <= version)
            })
            .copied()
            .collect()
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Door::Message => "message",
            Door::Then => "then",
            Door::Enqueue => "enqueue",
        }
    }
}

/// Why a spec was refused: the field (a path, e.g. `then[2].priority`) and what is wrong with
/// it. Its text is the same whichever door refused it (the SQL function raises the same
/// words).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("field `{field}` must be {expected}, found {found}")]
    WrongType {
        field: String,
        expected: &'static str,
        found: &'static str,
    },
    #[error("field `{field}` is invalid: {reason}")]
    BadValue { field: String, reason: String },
    #[error("field `{field}` is required")]
    Missing { field: String },
    #[error("field `{field}` is not a field of {what}; the fields are {fields}")]
    Unknown {
        field: String,
        what: &'static str,
        fields: String,
    },
}

impl Refused {
    /// The field refused (a path, e.g. `then[2].priority`).
    pub fn field(&self) -> &str {
        match self {
            Refused::WrongType { field, .. }
            | Refused::BadValue { field, .. }
            | Refused::Missing { field }
            | Refused::Unknown { field, .. } => field,
        }
    }

    pub(crate) fn bad(field: &str, reason: impl Into<String>) -> Refused {
        Refused::BadValue {
            field: field.to_string(),
            reason: reason.into(),
        }
    }

    fn wrong(field: &str, expected: &'static str, found: &Value) -> Refused {
        Refused::WrongType {
            field: field.to_string(),
            expected,
            found: json_kind(found),
        }
    }
}

/// The kind of a JSON value, as error messages name it.
pub fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn forbidden_in(c: char, table: &[(char, char)]) -> bool {
    table.iter().any(|&(lo, hi)| (lo..=hi).contains(&c))
}

/// How a character is named in an error: printable ones quoted, the rest by code point (a
/// raw CR in an error message would itself break a log line).
fn char_name(c: char) -> String {
    if forbidden_in(c, ID_FORBIDDEN) && !matches!(c, '#' | '/' | '?') {
        format!("U+{:04X}", c as u32)
    } else {
        format!("'{c}'")
    }
}

/// Checks a job id; the reason names what is wrong.
pub fn check_id(id: &str) -> Result<(), String> {
    if id.is_empty() {
        return Err("must not be empty".into());
    }
    if id.len() > MAX_ID_BYTES {
        return Err(format!(
            "is {} bytes long, the limit is {MAX_ID_BYTES}",
            id.len()
        ));
    }
    if let Some(c) = id.chars().find(|&c| forbidden_in(c, ID_FORBIDDEN)) {
        return Err(format!(
            "contains {}; an id may not hold control characters, whitespace, invisible \
             characters, / ? or #",
            char_name(c)
        ));
    }
    if id == "." || id == ".." {
        return Err(format!(
            "{id:?} cannot be an id (URL paths collapse it); add a letter or digit"
        ));
    }
    Ok(())
}

/// Checks a batch id: an id (it is part of its callbacks' ids), short enough for
/// `<batch>.on_complete`.
pub fn check_batch_id(id: &str) -> Result<(), String> {
    check_id(id)?;
    if id.len() > MAX_BATCH_ID_BYTES {
        return Err(format!(
            "is {} bytes long, the limit for a batch id is {MAX_BATCH_ID_BYTES} (its callbacks' \
             ids add \".on_complete\" to it)",
            id.len()
        ));
    }
    Ok(())
}

/// Checks a queue name: it becomes one NATS subject token and part of a consumer name.
pub fn check_queue(q: &str) -> Result<(), String> {
    let ok_chars = q
        .bytes()
        .all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-');
    if q.is_empty() || q.len() > MAX_QUEUE_BYTES || !ok_chars {
        return Err(format!(
            "queue name {q:?} must be 1 to {MAX_QUEUE_BYTES} ASCII letters, digits, '_' or '-', \
             e.g. \"email\""
        ));
    }
    Ok(())
}

/// Checks an idempotency key.
pub fn check_key(k: &str) -> Result<(), String> {
    if k.is_empty() || k.len() > MAX_KEY_BYTES {
        return Err(format!(
            "is {} bytes long; a key is 1 to {MAX_KEY_BYTES} bytes",
            k.len()
        ));
    }
    if let Some(c) = k.chars().find(|&c| forbidden_in(c, KEY_FORBIDDEN)) {
        return Err(format!(
            "contains {}; a key may not hold control or invisible characters",
            char_name(c)
        ));
    }
    Ok(())
}

/// Checks a job's `key` (a customer, a tenant: what groups a job with others). A key appears
/// wherever an id does — dashboard URLs, CLI arguments, log lines, headers — so it follows
/// the rules of an id ([`check_id`]: 1 to [`MAX_ID_BYTES`] bytes, none of [`ID_FORBIDDEN`],
/// not `.` or `..`), in its own words. (Not an idempotency key: see [`check_key`].)
pub fn check_job_key(k: &str) -> Result<(), String> {
    if k.is_empty() {
        return Err(format!(
            "must not be empty; a key is 1 to {MAX_ID_BYTES} bytes, e.g. \"customer-42\" \
             (leave the field out for a job without a key)"
        ));
    }
    if k.len() > MAX_ID_BYTES {
        return Err(format!(
            "is {} bytes long, the limit is {MAX_ID_BYTES}; a key names a group of jobs \
             (e.g. \"customer-42\"), not their data",
            k.len()
        ));
    }
    if let Some(c) = k.chars().find(|&c| forbidden_in(c, ID_FORBIDDEN)) {
        return Err(format!(
            "contains {}; a key may not hold control characters, whitespace, invisible \
             characters, / ? or # (keys appear in URLs, command lines and logs)",
            char_name(c)
        ));
    }
    if k == "." || k == ".." {
        return Err(format!(
            "{k:?} cannot be a key (URL paths collapse it); add a letter or digit"
        ));
    }
    Ok(())
}

/// A JSON number that is a whole number (`5`, `5.0`, `5e0`) as an i64, else `None`.
pub fn whole_number(v: &Value) -> Option<i64> {
    let Value::Number(n) = v else { return None };
    if let Some(i) = n.as_i64() {
        return Some(i);
    }
    if n.as_u64().is_some() {
        return None; // above i64::MAX: out of every range
    }
    let f = n.as_f64()?;
    (f.is_finite() && f.fract() == 0.0 && f.abs() < 9.0e18).then_some(f as i64)
}

fn whole_in(
    obj: &Map<String, Value>,
    at: &str,
    field: &str,
    lo: i64,
    hi: i64,
) -> Result<Option<i64>, Refused> {
    let path = join(at, field);
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v @ Value::Number(n)) => match whole_number(v) {
            Some(i) if (lo..=hi).contains(&i) => Ok(Some(i)),
            _ => Err(Refused::bad(
                &path,
                format!("{n} is not a whole number from {lo} to {hi}"),
            )),
        },
        Some(other) => Err(Refused::wrong(&path, "a whole number", other)),
    }
}

fn string<'a>(
    obj: &'a Map<String, Value>,
    at: &str,
    field: &str,
) -> Result<Option<&'a str>, Refused> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(Refused::wrong(&join(at, field), "a string", other)),
    }
}

fn join(at: &str, field: &str) -> String {
    if at.is_empty() {
        field.to_string()
    } else {
        format!("{at}.{field}")
    }
}

/// Reads a backoff duration: terms of a number (up to [`MAX_DURATION_DIGITS`] digits, and
/// up to [`MAX_DURATION_DECIMALS`] after a point) and a unit of [`DURATION_UNITS`], with
/// spaces or tabs around them (`"1h 30m"`, `"1.5s"`, `"250ms"`). Returns nanoseconds
/// (a fraction of a nanosecond is dropped). The SQL function `contract_duration_ns()` reads
/// the same grammar.
pub fn parse_duration_ns(text: &str) -> Result<u128, String> {
    if text.len() > MAX_DURATION_TEXT {
        return Err(format!(
            "is {} bytes long; write a duration of at most {MAX_DURATION_TEXT} bytes, e.g. \"1h 30m\"",
            text.len()
        ));
    }
    let b = text.as_bytes();
    let mut i = 0;
    let mut total: u128 = 0;
    let mut terms = 0;
    let blank = |c: u8| c == b' ' || c == b'\t';
    loop {
        while i < b.len() && blank(b[i]) {
            i += 1;
        }
        if i == b.len() {
            break;
        }
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        let int = &text[start..i];
        let mut frac = "";
        if i < b.len() && b[i] == b'.' {
            let f = i + 1;
            i = f;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
            frac = &text[f..i];
            if frac.is_empty() {
                return Err(format!(
                    "{text:?} is not a duration: a digit must follow the point"
                ));
            }
        }
        if int.is_empty() {
            return Err(format!(
                "{text:?} is not a duration: expected a number, e.g. \"1s\", \"250ms\" or \"1h 30m\""
            ));
        }
        if int.len() > MAX_DURATION_DIGITS || frac.len() > MAX_DURATION_DECIMALS {
            return Err(format!(
                "{text:?} has a number with too many digits (at most {MAX_DURATION_DIGITS}, and \
                 {MAX_DURATION_DECIMALS} after the point)"
            ));
        }
        while i < b.len() && blank(b[i]) {
            i += 1;
        }
        let u = i;
        while i < text.len()
            && !text[i..]
                .starts_with(|c: char| c.is_ascii_digit() || c == ' ' || c == '\t' || c == '.')
        {
            i += text[i..].chars().next().map_or(1, char::len_utf8);
        }
        let unit = &text[u..i];
        let Some(&(_, per)) = DURATION_UNITS.iter().find(|(name, _)| *name == unit) else {
            return Err(format!(
                "{text:?} is not a duration: unknown unit {unit:?}; use ns, us, ms, s, m, h, d, \
                 w, M (months) or y, e.g. \"1h 30m\""
            ));
        };
        let whole: u128 = int.parse().expect("digits");
        let num: u128 = if frac.is_empty() {
            0
        } else {
            frac.parse().expect("digits")
        };
        let den = 10u128.pow(frac.len() as u32);
        total += whole * per + num * per / den;
        terms += 1;
    }
    if terms == 0 {
        return Err("is empty; write a duration, e.g. \"1s\", \"250ms\" or \"1h 30m\"".into());
    }
    Ok(total)
}

/// Checks a backoff object and returns it as jobwarden stores it.
pub fn check_backoff(v: &Value, path: &str) -> Result<crate::backoff::Backoff, Refused> {
    use crate::backoff::{Backoff, BackoffKind};
    use std::time::Duration;
    let Value::Object(b) = v else {
        return Err(Refused::wrong(
            path,
            "an object, e.g. {\"kind\":\"exponential\",\"base\":\"1s\",\"max\":\"10m\"}",
            v,
        ));
    };
    if let Some(k) = b
        .keys()
        .find(|k| !["kind", "base", "max", "jitter"].contains(&k.as_str()))
    {
        return Err(Refused::Unknown {
            field: join(path, k),
            what: "a backoff",
            fields: "kind, base, max, jitter".into(),
        });
    }
    let kind = match b.get("kind") {
        None | Some(Value::Null) => {
            return Err(Refused::Missing {
                field: join(path, "kind"),
            })
        }
        Some(Value::String(k)) => match k.as_str() {
            "fixed" => BackoffKind::Fixed,
            "linear" => BackoffKind::Linear,
            "exponential" => BackoffKind::Exponential,
            other => {
                return Err(Refused::bad(
                    &join(path, "kind"),
                    format!("{other:?} is not a backoff kind; use fixed, linear or exponential"),
                ))
            }
        },
        Some(other) => return Err(Refused::wrong(&join(path, "kind"), "a string", other)),
    };
    let limit_ns = MAX_DELAY_MS as u128 * 1_000_000;
    let duration = |name: &str| -> Result<Option<u128>, Refused> {
        let at = join(path, name);
        match b.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => {
                let ns = parse_duration_ns(s).map_err(|e| Refused::bad(&at, e))?;
                if ns > limit_ns {
                    return Err(Refused::bad(
                        &at,
                        format!(
                            "{s:?} is longer than {} days, the longest delay",
                            MAX_DELAY_MS / DAY_MS
                        ),
                    ));
                }
                Ok(Some(ns))
            }
            Some(other) => Err(Refused::wrong(&at, "a duration string, e.g. \"1s\"", other)),
        }
    };
    let Some(base) = duration("base")? else {
        return Err(Refused::Missing {
            field: join(path, "base"),
        });
    };
    let max = duration("max")?.unwrap_or(DEFAULT_BACKOFF_MAX_MS as u128 * 1_000_000);
    let jitter = match b.get("jitter") {
        None | Some(Value::Null) => 0.0,
        Some(Value::Number(n)) => match n.as_f64() {
            Some(j) if (0.0..=1.0).contains(&j) => j,
            _ => {
                return Err(Refused::bad(
                    &join(path, "jitter"),
                    format!("{n} is not a fraction from 0 to 1"),
                ))
            }
        },
        Some(other) => return Err(Refused::wrong(&join(path, "jitter"), "a number", other)),
    };
    if base == 0 && kind != BackoffKind::Fixed {
        return Err(Refused::bad(
            &join(path, "base"),
            "must be above zero for a linear or exponential backoff",
        ));
    }
    if max < base {
        return Err(Refused::bad(
            &join(path, "max"),
            "must not be below base (a backoff without max has a max of 1h)",
        ));
    }
    let ns = |n: u128| Duration::from_nanos(n as u64);
    Ok(Backoff {
        kind,
        base: ns(base),
        max: ns(max),
        jitter,
    })
}

/// PostgreSQL's jsonb cannot hold the NUL character in any string or key.
pub fn check_payload(payload: &Value, path: &str, limit: Option<usize>) -> Result<(), Refused> {
    if !payload.is_object() {
        return Err(Refused::wrong(path, "an object", payload));
    }
    if crate::jsonb::has_nul(payload) {
        return Err(Refused::bad(
            path,
            "contains the NUL character \\u0000, which PostgreSQL jsonb cannot store; encode \
             binary data as base64",
        ));
    }
    if let Some(limit) = limit {
        let size = serde_json::to_vec(payload).map_or(0, |b| b.len());
        if size > limit {
            return Err(Refused::bad(
                path,
                format!(
                    "is {size} bytes, over the limit of {limit} bytes (worker.max_payload_bytes); \
                     store large data elsewhere and pass a reference"
                ),
            ));
        }
    }
    Ok(())
}

/// A spec that passed, its values read (absent fields `None`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Spec {
    pub id: Option<String>,
    pub queue: Option<String>,
    pub payload: Value,
    pub priority: Option<i16>,
    pub max_attempts: Option<i32>,
    pub timeout_ms: Option<i32>,
    pub idempotency_key: Option<String>,
    pub run_at_ms: Option<i64>,
    pub delay_ms: Option<i64>,
    pub backoff: Option<crate::backoff::Backoff>,
    /// The `then` specs, checked, as given.
    pub then: Option<Value>,
    pub depends_on: Vec<String>,
    /// Not started by this instant (Unix ms), the job never runs: it ends `cancelled`.
    pub expires_at_ms: Option<i64>,
    /// Not started this long after it is enqueued (ms), the job never runs.
    pub expires_in_ms: Option<i64>,
    /// What groups the job with others (a customer, a tenant), e.g. `customer-42`.
    pub key: Option<String>,
    /// Debounce, throttle, unique_for (schema version 23).
    pub gate: Gate,
    /// The batch a message's job is a member of (schema version 34).
    pub batch: Option<BatchDecl>,
}

/// A message's `batch` (schema version 34): the batch its job is a member of, as every
/// member declares it — its id, how many members it has, and its callbacks (checked as an
/// enqueue's spec, stored as [`Spec::to_value`] writes it, so that two declarations that
/// mean the same compare equal).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BatchDecl {
    pub id: String,
    pub size: i32,
    pub on_complete: Option<Value>,
    pub on_success: Option<Value>,
}

impl BatchDecl {
    /// What the first member's declaration stores and every later one is compared with:
    /// `{"size", "on_complete", "on_success"}` (absent callbacks left out).
    pub fn declaration(&self) -> Value {
        let mut m = Map::new();
        m.insert("size".into(), Value::from(self.size));
        for (k, v) in [
            ("on_complete", &self.on_complete),
            ("on_success", &self.on_success),
        ] {
            if let Some(v) = v {
                m.insert(k.into(), v.clone());
            }
        }
        Value::Object(m)
    }

    /// The whole object, as a message carries it.
    pub fn to_value(&self) -> Value {
        let mut v = self.declaration();
        v["id"] = Value::from(self.id.clone());
        v
    }
}

impl Spec {
    /// The spec as it is stored (a `then` spec in its parent's row): whole numbers as
    /// integers, a backoff in the form every reader reads alike, absent fields left out.
    pub fn to_value(&self) -> Value {
        let mut m = Map::new();
        let mut put = |k: &str, v: Option<Value>| {
            if let Some(v) = v {
                m.insert(k.to_string(), v);
            }
        };
        put("id", self.id.clone().map(Value::from));
        put("queue", self.queue.clone().map(Value::from));
        put("payload", Some(self.payload.clone()));
        put("priority", self.priority.map(Value::from));
        put("max_attempts", self.max_attempts.map(Value::from));
        put("timeout_ms", self.timeout_ms.map(Value::from));
        put(
            "idempotency_key",
            self.idempotency_key.clone().map(Value::from),
        );
        put("run_at_ms", self.run_at_ms.map(Value::from));
        put("delay_ms", self.delay_ms.map(Value::from));
        put(
            "backoff",
            self.backoff
                .map(|b| serde_json::to_value(b).expect("a backoff serialises")),
        );
        put("then", self.then.clone());
        if !self.depends_on.is_empty() {
            put("depends_on", Some(Value::from(self.depends_on.clone())));
        }
        put("expires_at_ms", self.expires_at_ms.map(Value::from));
        put(
            "expires_in",
            self.expires_in_ms.map(|ms| Value::from(format!("{ms}ms"))),
        );
        put("key", self.key.clone().map(Value::from));
        let g = &self.gate;
        for (field, ms) in [
            ("debounce", g.debounce_ms),
            ("debounce_max_wait", g.max_wait_ms),
            ("throttle", g.throttle_ms),
            ("unique_for", g.unique_for_ms),
        ] {
            put(field, ms.map(|ms| Value::from(format!("{ms}ms"))));
        }
        put("batch", self.batch.as_ref().map(BatchDecl::to_value));
        Value::Object(m)
    }
}

/// Checks a spec at `door`. `payload_limit`: the most bytes a payload may have (the
/// workers' `worker.max_payload_bytes`), when the door measures it here (a message's whole
/// body is measured before it is read).
pub fn check_spec(
    obj: &Map<String, Value>,
    door: Door,
    payload_limit: Option<usize>,
) -> Result<Spec, Refused> {
    let mut budget = MAX_THEN_JOBS;
    check_at(obj, door, payload_limit, "", 0, &mut budget)
}

// Long on purpose: the contract's field rules, one arm per field, read as one table.
#[allow(clippy::too_many_lines)]
fn check_at(
    obj: &Map<String, Value>,
    door: Door,
    payload_limit: Option<usize>,
    at: &str,
    depth: usize,
    budget: &mut usize,
) -> Result<Spec, Refused> {
    let fields = door.fields();
    // Object keys are sorted: the first unknown one is named, the same in SQL.
    let mut keys: Vec<&String> = obj.keys().collect();
    keys.sort();
    if let Some(k) = keys.into_iter().find(|k| !fields.contains(&k.as_str())) {
        return Err(Refused::Unknown {
            field: join(at, k),
            what: match door {
                Door::Message => "a message's envelope",
                Door::Then => "a `then` job",
                Door::Enqueue => "an enqueued job",
            },
            fields: fields.join(", "),
        });
    }
    let queue = match string(obj, at, "queue")? {
        Some(q) => {
            check_queue(q).map_err(|e| Refused::bad(&join(at, "queue"), e))?;
            Some(q.to_string())
        }
        None if door != Door::Message => {
            return Err(Refused::Missing {
                field: join(at, "queue"),
            })
        }
        None => None,
    };
    let payload = match obj.get("payload") {
        None | Some(Value::Null) => {
            return Err(Refused::Missing {
                field: join(at, "payload"),
            })
        }
        Some(p) => {
            check_payload(p, &join(at, "payload"), payload_limit)?;
            p.clone()
        }
    };
    let id = match string(obj, at, "id")? {
        Some(id) => {
            check_id(id).map_err(|e| Refused::bad(&join(at, "id"), e))?;
            Some(id.to_string())
        }
        None => None,
    };
    let priority = whole_in(
        obj,
        at,
        "priority",
        MIN_PRIORITY.into(),
        MAX_PRIORITY.into(),
    )?;
    let max_attempts = whole_in(obj, at, "max_attempts", 1, MAX_ATTEMPTS.into())?;
    let timeout_ms = whole_in(obj, at, "timeout_ms", 1, MAX_TIMEOUT_MS)?;
    let run_at_ms = whole_in(obj, at, "run_at_ms", 0, MAX_RUN_AT_MS)?;
    let delay_ms = whole_in(obj, at, "delay_ms", 0, MAX_DELAY_MS)?;
    let idempotency_key = match string(obj, at, "idempotency_key")? {
        Some(k) => {
            check_key(k).map_err(|e| Refused::bad(&join(at, "idempotency_key"), e))?;
            Some(k.to_string())
        }
        None => None,
    };
    let backoff = match obj.get("backoff") {
        None | Some(Value::Null) => None,
        Some(b) => Some(check_backoff(b, &join(at, "backoff"))?),
    };
    let depends_on = match obj.get("depends_on") {
        None | Some(Value::Null) => Vec::new(),
        Some(_) if door == Door::Message => {
            return Err(Refused::bad(
                &join(at, "depends_on"),
                "a job that waits for others must be stored before anything runs it: enqueue \
                 it through PostgreSQL (SQL enqueue(..., depends_on => ...), the Rust client, \
                 or `jobwarden enqueue --depends-on`), not by publishing",
            ));
        }
        Some(Value::Array(parents)) => {
            let path = join(at, "depends_on");
            if parents.len() > MAX_DEPENDS_ON {
                return Err(Refused::bad(
                    &path,
                    format!(
                        "names {} jobs; a job may wait for at most {MAX_DEPENDS_ON}",
                        parents.len()
                    ),
                ));
            }
            let mut ids = Vec::with_capacity(parents.len());
            for (i, p) in parents.iter().enumerate() {
                let here = format!("{path}[{}]", i + 1);
                let Value::String(p) = p else {
                    return Err(Refused::wrong(&here, "a job id (a string)", p));
                };
                check_id(p).map_err(|e| Refused::bad(&here, e))?;
                if id.as_deref() == Some(p.as_str()) {
                    return Err(Refused::bad(&here, "a job cannot depend on itself"));
                }
                ids.push(p.clone());
            }
            ids
        }
        Some(other) => {
            return Err(Refused::wrong(
                &join(at, "depends_on"),
                "an array of job ids",
                other,
            ))
        }
    };
    let then = match obj.get("then") {
        None | Some(Value::Null) => None,
        Some(v) => {
            let path = join(at, "then");
            let Value::Array(specs) = v else {
                return Err(Refused::wrong(
                    &path,
                    "an array of jobs, e.g. [{\"queue\":\"email\",\"payload\":{}}]",
                    v,
                ));
            };
            if depth + 1 > MAX_THEN_DEPTH {
                return Err(Refused::bad(
                    &path,
                    format!("nests deeper than {MAX_THEN_DEPTH} levels of then"),
                ));
            }
            let mut kids = Vec::with_capacity(specs.len());
            for (i, s) in specs.iter().enumerate() {
                let here = format!("{path}[{}]", i + 1);
                if *budget == 0 {
                    return Err(Refused::bad(
                        &here,
                        format!("one job may create at most {MAX_THEN_JOBS} jobs through then"),
                    ));
                }
                *budget -= 1;
                let Value::Object(s) = s else {
                    return Err(Refused::wrong(&here, "an object", s));
                };
                kids.push(
                    check_at(s, Door::Then, payload_limit, &here, depth + 1, budget)?.to_value(),
                );
            }
            Some(Value::Array(kids))
        }
    };
    let (expires_at_ms, expires_in_ms) = check_expiry(obj, at)?;
    // The key (version 20), checked last in SQL too: the first field refused is the same.
    let key = match string(obj, at, "key")? {
        Some(k) => {
            check_job_key(k).map_err(|e| Refused::bad(&join(at, "key"), e))?;
            Some(k.to_string())
        }
        None => None,
    };
    // Debounce, throttle, unique_for (version 23), after the key they need.
    let gate = check_gate(obj, door, at)?;
    // The batch (version 34, a message's only: the other doors do not list it), last.
    let batch = match obj.get("batch") {
        None | Some(Value::Null) => None,
        Some(b) => Some(check_batch(b, payload_limit, &join(at, "batch"))?),
    };
    let narrow = |v: Option<i64>| v.map(|v| v as i32);
    Ok(Spec {
        id,
        queue,
        payload,
        priority: priority.map(|p| p as i16),
        max_attempts: narrow(max_attempts),
        timeout_ms: narrow(timeout_ms),
        idempotency_key,
        run_at_ms,
        delay_ms,
        backoff,
        then,
        depends_on,
        expires_at_ms,
        expires_in_ms,
        key,
        gate,
        batch,
    })
}

/// Checks a message's `batch`: `{"id", "size", "on_complete", "on_success"}` — an id of
/// [`check_batch_id`]'s rules, a size from 1 to [`MAX_BATCH_SIZE`], callbacks checked as an
/// enqueue's spec (as SQL `enqueue_batch()` checks them). The twin of SQL
/// `contract_check_batch()`.
pub fn check_batch(
    b: &Value,
    payload_limit: Option<usize>,
    at: &str,
) -> Result<BatchDecl, Refused> {
    let Value::Object(obj) = b else {
        return Err(Refused::wrong(
            at,
            "an object, e.g. {\"id\": \"newsletter-7\", \"size\": 500}",
            b,
        ));
    };
    let mut keys: Vec<&String> = obj.keys().collect();
    keys.sort();
    if let Some(k) = keys
        .into_iter()
        .find(|k| !BATCH_FIELDS.contains(&k.as_str()))
    {
        return Err(Refused::Unknown {
            field: join(at, k),
            what: "a batch",
            fields: BATCH_FIELDS.join(", "),
        });
    }
    let id = match string(obj, at, "id")? {
        Some(id) => {
            check_batch_id(id).map_err(|e| Refused::bad(&join(at, "id"), e))?;
            id.to_string()
        }
        None => {
            return Err(Refused::Missing {
                field: join(at, "id"),
            })
        }
    };
    let Some(size) = whole_in(obj, at, "size", 1, MAX_BATCH_SIZE)? else {
        return Err(Refused::Missing {
            field: join(at, "size"),
        });
    };
    let callback = |field: &str| -> Result<Option<Value>, Refused> {
        let path = join(at, field);
        match obj.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Object(spec)) => {
                let mut budget = MAX_THEN_JOBS;
                let checked = check_at(spec, Door::Enqueue, payload_limit, &path, 0, &mut budget)?;
                if spec.get("depends_on").is_some_and(|d| !d.is_null()) {
                    return Err(Refused::bad(
                        &join(&path, "depends_on"),
                        "a callback runs when its batch has ended: it depends on nothing else",
                    ));
                }
                Ok(Some(checked.to_value()))
            }
            Some(other) => Err(Refused::wrong(&path, "an object", other)),
        }
    };
    Ok(BatchDecl {
        id,
        size: size as i32,
        on_complete: callback("on_complete")?,
        on_success: callback("on_success")?,
    })
}

/// Checks a spec's expiry: `expires_at_ms` (an instant, Unix ms) or `expires_in` (a
/// duration from when the job is enqueued), never both. An instant already past is accepted:
/// the job ends expired at once, never runs, and says so (a producer's clock a little ahead,
/// or a retried publish, must not turn into an error the producer cannot act on).
/// Returns (expires_at_ms, expires_in in ms).
fn check_expiry(obj: &Map<String, Value>, at: &str) -> Result<(Option<i64>, Option<i64>), Refused> {
    let expires_at_ms = whole_in(obj, at, "expires_at_ms", 0, MAX_RUN_AT_MS)?;
    let path = join(at, "expires_in");
    let expires_in_ms = match obj.get("expires_in") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => {
            let ns = parse_duration_ns(s).map_err(|e| Refused::bad(&path, e))?;
            if ns < 1_000_000 {
                return Err(Refused::bad(
                    &path,
                    format!("{s:?} is under a millisecond; a job expires at least 1ms after it is enqueued, e.g. \"1h\""),
                ));
            }
            if ns > MAX_DELAY_MS as u128 * 1_000_000 {
                return Err(Refused::bad(
                    &path,
                    format!(
                        "{s:?} is longer than {} days, the longest delay",
                        MAX_DELAY_MS / DAY_MS
                    ),
                ));
            }
            Some((ns / 1_000_000) as i64)
        }
        Some(other) => {
            return Err(Refused::wrong(
                &path,
                "a duration string, e.g. \"1h\"",
                other,
            ))
        }
    };
    if expires_at_ms.is_some() && expires_in_ms.is_some() {
        return Err(Refused::bad(
            &path,
            "is given with expires_at_ms; give one of them: expires_at_ms (an instant, Unix ms) or expires_in (a duration from the enqueue, e.g. \"1h\")",
        ));
    }
    Ok((expires_at_ms, expires_in_ms))
}

/// What a job asks of its key's other jobs (schema version 23): `debounce` (collapse into the
/// last one, run when the key is quiet, at the latest `max_wait` after the first), `throttle`
/// (at most one per window, the rest ended visibly) and `unique_for` (its idempotency key is
/// held this long only). Whole milliseconds; `None` for none.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Gate {
    pub debounce_ms: Option<i64>,
    pub max_wait_ms: Option<i64>,
    pub throttle_ms: Option<i64>,
    pub unique_for_ms: Option<i64>,
}

impl Gate {
    /// Nothing asked.
    pub fn is_empty(&self) -> bool {
        *self == Gate::default()
    }

    /// The job's own debounce or throttle (which replace its queue's).
    pub fn names_debounce_or_throttle(&self) -> bool {
        self.debounce_ms.is_some() || self.throttle_ms.is_some()
    }

    /// What applies to a job with this gate, `queue`'s settings and whether it has a key and
    /// an idempotency key, as `jobs.gate` stores it (`None`: nothing; the gate trigger does
    /// not fire): the job's own debounce/throttle, else its queue's (for a job with a key);
    /// its own unique_for, else its queue's (for a job with an idempotency key). The twin of
    /// SQL `job_gate()`.
    pub fn applied(&self, queue: &Gate, keyed: bool, idempotent: bool) -> Option<Value> {
        let rule = if self.names_debounce_or_throttle() {
            *self
        } else if keyed {
            *queue
        } else {
            Gate::default()
        };
        let unique_for = if idempotent {
            self.unique_for_ms.or(queue.unique_for_ms)
        } else {
            None
        };
        let mut m = Map::new();
        for (k, v) in [
            ("debounce_ms", rule.debounce_ms),
            ("max_wait_ms", rule.max_wait_ms),
            ("throttle_ms", rule.throttle_ms),
            ("unique_for_ms", unique_for),
        ] {
            if let Some(v) = v {
                m.insert(k.to_string(), Value::from(v));
            }
        }
        (!m.is_empty()).then_some(Value::Object(m))
    }
}

/// A window (`debounce`, `debounce_max_wait`, `throttle`, `unique_for`): duration text from
/// 1ms to [`MAX_DELAY_MS`]; whole milliseconds. The twin of SQL `contract_window_ms()`.
pub fn check_window(text: &str, path: &str) -> Result<i64, Refused> {
    let ns = parse_duration_ns(text).map_err(|e| Refused::bad(path, e))?;
    if ns < 1_000_000 {
        return Err(Refused::bad(
            path,
            format!("{text:?} is under a millisecond; a window is at least 1ms, e.g. \"5s\" (leave the field out for none)"),
        ));
    }
    if ns > MAX_DELAY_MS as u128 * 1_000_000 {
        return Err(Refused::bad(
            path,
            format!(
                "{text:?} is longer than {} days, the longest window",
                MAX_DELAY_MS / DAY_MS
            ),
        ));
    }
    Ok((ns / 1_000_000) as i64)
}

/// The rules between the windows, for a gate read from a spec or a queue's settings (the
/// fields named by `path(field)`): debounce_max_wait only with debounce and not shorter;
/// debounce or throttle, not both.
pub fn check_gate_rules(
    g: &Gate,
    path: impl Fn(&str) -> String,
    shown: impl Fn(&str) -> String,
) -> Result<(), Refused> {
    if g.max_wait_ms.is_some() && g.debounce_ms.is_none() {
        return Err(Refused::bad(
            &path("debounce_max_wait"),
            "is given without debounce; it bounds how long a debounce may hold a job back: add \"debounce\" (e.g. \"5s\") or leave debounce_max_wait out",
        ));
    }
    if let (Some(m), Some(d)) = (g.max_wait_ms, g.debounce_ms) {
        if m < d {
            return Err(Refused::bad(
                &path("debounce_max_wait"),
                format!(
                    "{} is shorter than debounce {}; a debounced job runs at the latest max_wait after the first one came, so max_wait is at least the debounce (e.g. debounce \"5s\", debounce_max_wait \"30s\")",
                    shown("debounce_max_wait"),
                    shown("debounce")
                ),
            ));
        }
    }
    if g.debounce_ms.is_some() && g.throttle_ms.is_some() {
        return Err(Refused::bad(
            &path("throttle"),
            "is given with debounce; a key's jobs are debounced (the last one runs) or throttled (the first one runs), not both: keep one",
        ));
    }
    Ok(())
}

/// The gate fields of a spec (schema version 23): the windows and the rules between them;
/// debounce or throttle need the job's key (but a message's, which its queue's key_from may
/// give it after the decode: the worker checks that one), unique_for its idempotency key.
/// The twin of SQL `contract_check_gate()`.
fn check_gate(obj: &Map<String, Value>, door: Door, at: &str) -> Result<Gate, Refused> {
    let window = |field: &str| -> Result<Option<i64>, Refused> {
        let path = join(at, field);
        match obj.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => check_window(s, &path).map(Some),
            Some(other) => Err(Refused::wrong(
                &path,
                "a duration string, e.g. \"5s\"",
                other,
            )),
        }
    };
    let gate = Gate {
        debounce_ms: window("debounce")?,
        max_wait_ms: window("debounce_max_wait")?,
        throttle_ms: window("throttle")?,
        unique_for_ms: window("unique_for")?,
    };
    check_gate_rules(
        &gate,
        |f| join(at, f),
        |f| obj.get(f).map(ToString::to_string).unwrap_or_default(),
    )?;
    let absent = |f: &str| !matches!(obj.get(f), Some(Value::String(_)));
    if door != Door::Message && absent("key") && gate.names_debounce_or_throttle() {
        let field = if gate.debounce_ms.is_some() {
            "debounce"
        } else {
            "throttle"
        };
        return Err(Refused::bad(&join(at, field), NEEDS_KEY));
    }
    if gate.unique_for_ms.is_some() && absent("idempotency_key") {
        return Err(Refused::bad(
            &join(at, "unique_for"),
            "needs an idempotency_key: it is how long the job's idempotency key is held; add \"idempotency_key\" or leave unique_for out",
        ));
    }
    Ok(gate)
}

/// Why a debounce or throttle without a key is refused.
pub const NEEDS_KEY: &str =
    "needs a key: it applies to the jobs of one key; add \"key\" (e.g. \"customer-42\")";

/// A forbidden-character table as the body of a PostgreSQL regular-expression bracket
/// (`\uXXXX` escapes; NUL left out, as `text` cannot hold it).
fn sql_class(table: &[(char, char)]) -> String {
    let esc = |c: char| {
        let c = (c as u32).max(1);
        if c <= 0xFFFF {
            format!("\\u{c:04x}")
        } else {
            format!("\\U{c:08x}")
        }
    };
    table
        .iter()
        .map(|&(lo, hi)| {
            if lo == hi {
                esc(lo)
            } else {
                format!("{}-{}", esc(lo), esc(hi))
            }
        })
        .collect()
}

/// The values the SQL template's `{{NAME}}` placeholders take: every limit, table and field
/// list above.
pub fn sql_values() -> Vec<(String, String)> {
    let list_as_of = |d: Door, version: u32| {
        d.fields_as_of(version)
            .iter()
            .map(|f| format!("'{f}'"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let units = DURATION_UNITS
        .iter()
        .map(|(u, ns)| format!("('{u}', {ns})"))
        .collect::<Vec<_>>()
        .join(", ");
    let mut values = [
        ("MAX_ID_BYTES", MAX_ID_BYTES.to_string()),
        ("MAX_KEY_BYTES", MAX_KEY_BYTES.to_string()),
        ("MAX_QUEUE_BYTES", MAX_QUEUE_BYTES.to_string()),
        ("MIN_PRIORITY", MIN_PRIORITY.to_string()),
        ("MAX_PRIORITY", MAX_PRIORITY.to_string()),
        ("DEFAULT_PRIORITY", DEFAULT_PRIORITY.to_string()),
        ("MAX_ATTEMPTS", MAX_ATTEMPTS.to_string()),
        (
            "DEFAULT_SQL_MAX_ATTEMPTS",
            DEFAULT_SQL_MAX_ATTEMPTS.to_string(),
        ),
        ("MAX_TIMEOUT_MS", MAX_TIMEOUT_MS.to_string()),
        ("MAX_DELAY_MS", MAX_DELAY_MS.to_string()),
        ("MAX_DELAY_DAYS", (MAX_DELAY_MS / DAY_MS).to_string()),
        ("MAX_RUN_AT_MS", MAX_RUN_AT_MS.to_string()),
        ("MAX_THEN_JOBS", MAX_THEN_JOBS.to_string()),
        ("MAX_THEN_DEPTH", MAX_THEN_DEPTH.to_string()),
        ("MAX_DEPENDS_ON", MAX_DEPENDS_ON.to_string()),
        ("MAX_ENQUEUE_MANY", MAX_ENQUEUE_MANY.to_string()),
        ("MAX_BATCH_ID_BYTES", MAX_BATCH_ID_BYTES.to_string()),
        ("MAX_BATCH_SIZE", MAX_BATCH_SIZE.to_string()),
        ("MAX_RESULT_BYTES", MAX_RESULT_BYTES.to_string()),
        ("MAX_DURATION_TEXT", MAX_DURATION_TEXT.to_string()),
        ("MAX_DURATION_DECIMALS", MAX_DURATION_DECIMALS.to_string()),
        ("MAX_DURATION_DIGITS", MAX_DURATION_DIGITS.to_string()),
        ("DEFAULT_BACKOFF_MAX_MS", DEFAULT_BACKOFF_MAX_MS.to_string()),
        (
            "DEFAULT_MAX_PAYLOAD_BYTES",
            DEFAULT_MAX_PAYLOAD_BYTES.to_string(),
        ),
        ("ID_FORBIDDEN", sql_class(ID_FORBIDDEN)),
        ("KEY_FORBIDDEN", sql_class(KEY_FORBIDDEN)),
        ("DURATION_UNITS", units),
    ]
    .into_iter()
    .map(|(name, value)| (name.to_string(), value))
    .collect::<Vec<_>>();
    // Each migration that lists the fields renders them as they were at its version
    // (`V14_MESSAGE_FIELDS`…; there is no unversioned list): an applied migration must
    // render the same text again.
    for &version in FIELD_LIST_VERSIONS {
        for (door, name) in [
            (Door::Message, "MESSAGE"),
            (Door::Then, "THEN"),
            (Door::Enqueue, "ENQUEUE"),
        ] {
            values.push((
                format!("V{version}_{name}_FIELDS"),
                list_as_of(door, version),
            ));
        }
    }
    values
}

/// Fills a SQL template's `{{NAME}}` placeholders with [`sql_values`]. Panics on a
/// placeholder it does not know (a test renders every template).
pub fn render_sql(template: &str) -> String {
    let mut out = template.to_string();
    for (name, value) in sql_values() {
        out = out.replace(&format!("{{{{{name}}}}}"), &value);
    }
    if let Some(at) = out.find("{{") {
        let end = out[at..].find("}}").map_or(out.len(), |e| at + e + 2);
        panic!("unknown placeholder {} in a SQL template", &out[at..end]);
    }
    out
}

/// A forbidden-character table as the body of an ECMA-262 regular-expression bracket (the
/// JSON Schema's patterns).
fn ecma_class(table: &[(char, char)]) -> String {
    let esc = |c: char| format!("\\u{:04X}", c as u32);
    table
        .iter()
        .map(|&(lo, hi)| {
            if lo == hi {
                esc(lo)
            } else {
                format!("{}-{}", esc(lo), esc(hi))
            }
        })
        .collect()
}

/// The message body as a JSON Schema (draft 2020-12), made from the contract's constants:
/// `docs/message.schema.json` is this, written out (a test keeps them equal; run it with
/// `JOBWARDEN_WRITE_SCHEMA=1` to write the file again after a change).
// Long on purpose: one JSON Schema literal, laid out as the document it writes.
#[allow(clippy::too_many_lines)]
pub fn json_schema() -> Value {
    use serde_json::json;
    let whole = |lo: i64, hi: i64, what: &str| json!({"type": ["integer", "null"], "minimum": lo, "maximum": hi, "description": what});
    let mut units: Vec<&str> = DURATION_UNITS.iter().map(|(u, _)| *u).collect();
    units.sort_by_key(|u| std::cmp::Reverse(u.len()));
    let term = format!(
        "[0-9]{{1,{MAX_DURATION_DIGITS}}}(\\.[0-9]{{1,{MAX_DURATION_DECIMALS}}})?[ \\t]*({})",
        units.join("|")
    );
    let duration = json!({
        "type": "string",
        "maxLength": MAX_DURATION_TEXT,
        "pattern": format!("^[ \\t]*{term}([ \\t]*{term})*[ \\t]*$"),
        "description": format!(
            "A duration: terms of a number (up to {MAX_DURATION_DIGITS} digits, {MAX_DURATION_DECIMALS} after a point) and a unit, e.g. \"500ms\", \"1.5s\", \"1h 30m\"; at most {} days.",
            MAX_DELAY_MS / DAY_MS
        ),
    });
    let id = json!({
        "type": ["string", "null"],
        "minLength": 1,
        "maxLength": MAX_ID_BYTES,
        "pattern": format!("^[^{}]+$", ecma_class(ID_FORBIDDEN)),
        "not": {"enum": [".", ".."]},
        "description": format!(
            "Job id: 1 to {MAX_ID_BYTES} bytes (UTF-8; maxLength counts characters); no control characters, whitespace, invisible formatting characters, '/', '?' or '#'; not '.' or '..'. Unique: a second message with an id that exists never creates a second job. Absent: the Nats-Msg-Id header when it is a valid id, else <STREAM>-<stream sequence>-<stored ns>."
        ),
    });
    let key = json!({
        "type": ["string", "null"],
        "minLength": 1,
        "maxLength": MAX_KEY_BYTES,
        "pattern": format!("^[^{}]+$", ecma_class(KEY_FORBIDDEN)),
        "description": format!("1 to {MAX_KEY_BYTES} bytes without control or invisible characters. Unique per queue: a later message with the same key in the same queue is dropped."),
    });
    let job_key = json!({
        "type": ["string", "null"],
        "minLength": 1,
        "maxLength": MAX_ID_BYTES,
        "pattern": format!("^[^{}]+$", ecma_class(ID_FORBIDDEN)),
        "not": {"enum": [".", ".."]},
        "description": format!(
            "What groups the job with others (a customer, a tenant), e.g. \"customer-42\". The rules of an id: 1 to {MAX_ID_BYTES} bytes (UTF-8); no control characters, whitespace, invisible formatting characters, '/', '?' or '#'; not '.' or '..'. Absent: the queue's key_from (a payload field or a header), if the queue names one. Not an idempotency key: many jobs share a key."
        ),
    });
    let backoff = json!({
        "description": "This job's retry backoff, instead of its queue's. The delay after failed attempt n is base (fixed), base*n (linear) or base*2^(n-1) (exponential), capped at max, then spread by ±jitter/2.",
        "type": ["object", "null"],
        "additionalProperties": false,
        "required": ["kind", "base"],
        "properties": {
            "kind": {"enum": ["fixed", "linear", "exponential"]},
            "base": duration.clone(),
            "max": {"$ref": "#/$defs/duration", "description": "Cap on the delay (default 1h); not below base."},
            "jitter": {"type": "number", "minimum": 0, "maximum": 1, "description": "Fraction of the delay to spread retries over (default 0)."}
        }
    });
    let storable = json!({
        "description": "Any JSON value in which no string and no object key contains the NUL character \\u0000.",
        "pattern": "^[^\\u0000]*$",
        "propertyNames": {"pattern": "^[^\\u0000]*$"},
        "additionalProperties": {"$ref": "#/$defs/storable"},
        "items": {"$ref": "#/$defs/storable"}
    });
    let payload = json!({
        "type": "object",
        "$ref": "#/$defs/storable",
        "description": "The job's data, handed to the handler as is: a JSON object without the NUL character \\u0000 in any string or key."
    });
    let then_job = json!({
        "title": "A job of a `then` chain",
        "type": "object",
        "additionalProperties": false,
        "required": ["queue", "payload"],
        "properties": {
            "queue": {"type": "string", "pattern": format!("^[A-Za-z0-9_-]{{1,{MAX_QUEUE_BYTES}}}$")},
            "payload": {"$ref": "#/$defs/payload"},
            "id": {"$ref": "#/$defs/id"},
            "priority": whole(MIN_PRIORITY.into(), MAX_PRIORITY.into(), "0 runs first, 9 last."),
            "max_attempts": whole(1, MAX_ATTEMPTS.into(), &format!("Default {DEFAULT_SQL_MAX_ATTEMPTS}.")),
            "timeout_ms": whole(1, MAX_TIMEOUT_MS, "Time limit of one attempt, in milliseconds."),
            "delay_ms": whole(0, MAX_DELAY_MS, "Wait this long after the parent completed."),
            "idempotency_key": {"$ref": "#/$defs/key"},
            "backoff": {"$ref": "#/$defs/backoff"},
            "then": {"type": ["array", "null"], "maxItems": MAX_THEN_JOBS, "items": {"$ref": "#/$defs/thenJob"}},
            "expires_in": {"$ref": "#/$defs/duration", "description": "Not started this long after it is created (when its parent completed), it never runs: it ends `cancelled` as expired. Above zero."},
            "key": {"$ref": "#/$defs/jobKey"},
            "debounce": {"$ref": "#/$defs/duration", "description": "Jobs of this key (and queue) that come within this window collapse into the last one, which runs once the key has been quiet this long. Needs `key`. Not with throttle. Replaces the queue's debounce and throttle."},
            "debounce_max_wait": {"$ref": "#/$defs/duration", "description": "With debounce: the job runs at the latest this long after the first collapsed job came. At least the debounce."},
            "throttle": {"$ref": "#/$defs/duration", "description": "At most one job of this key (and queue) per window: a later one ends at once, `cancelled` with last_error `throttled: ...`. Needs `key`. Not with debounce."},
            "unique_for": {"$ref": "#/$defs/duration", "description": "The idempotency key is held this long only: a job with the same key within it is the same job, after it a new one. Needs `idempotency_key`. Absent: the queue's unique_for, else for ever."}
        }
    });
    let callback = json!({
        "description": "A job enqueued once when the batch has ended, with the batch's outcome as its parents' results: a spec as SQL enqueue() takes it (`queue`, `payload`, and any of its fields but `depends_on`). Its id, if it names none: <batch id>.on_complete or <batch id>.on_success.",
        "type": ["object", "null"],
        "required": ["queue", "payload"],
        "properties": {
            "queue": {"type": "string", "pattern": format!("^[A-Za-z0-9_-]{{1,{MAX_QUEUE_BYTES}}}$")},
            "payload": {"$ref": "#/$defs/payload"},
            "depends_on": {"not": {}}
        }
    });
    let batch = json!({
        "title": "The batch this job is a member of",
        "description": "Every member carries the same object. The first member to arrive declares the batch (its size and callbacks); a member that declares it otherwise is kept as a dead member of it, saying why. The batch ends when `size` members have arrived and every one has ended: then `on_complete` runs (whatever became of them) and `on_success` (only if all completed), once. A new member of a finished batch, or of one enqueued whole through SQL, is kept as a dead job that says why.",
        "type": ["object", "null"],
        "additionalProperties": false,
        "required": ["id", "size"],
        "properties": {
            "id": {
                "type": "string",
                "minLength": 1,
                "maxLength": MAX_BATCH_ID_BYTES,
                "pattern": format!("^[^{}]+$", ecma_class(ID_FORBIDDEN)),
                "not": {"enum": [".", ".."]},
                "description": format!("The batch's id: the rules of a job id, at most {MAX_BATCH_ID_BYTES} bytes (UTF-8).")
            },
            "size": {"type": "integer", "minimum": 1, "maximum": MAX_BATCH_SIZE, "description": "How many members the batch has (how many messages carry this batch)."},
            "on_complete": callback.clone(),
            "on_success": callback
        }
    });
    let fields: Vec<&str> = Door::Message.fields().to_vec();
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "jobwarden job message body",
        "description": format!(
            "GENERATED from src/contract.rs (contract::json_schema); do not edit. The body of a message published to jobs.<queue>. Either an envelope (an object with a `payload` key and no keys other than the envelope keys) or any other JSON object, which is taken whole as the payload. Rules this schema does not express, enforced by every door: (1) the limits on `id`, `key` and `idempotency_key` are in UTF-8 bytes, while maxLength counts characters; (2) an envelope's `priority` must be its subject's (jobs.<queue>.<p>, or 5 on jobs.<queue>); (3) a `then` tree holds at most {MAX_THEN_JOBS} jobs in all, at most {MAX_THEN_DEPTH} deep; (4) a backoff's max is not below its base, and its base is above zero unless it is fixed; (5) the whole body must fit in worker.max_payload_bytes (default {} bytes); (6) `expires_at_ms` and `expires_in` are never both given; (7) `debounce_max_wait` only with `debounce` and not shorter, `debounce` and `throttle` never both, `unique_for` only with `idempotency_key`. See docs/message-format.md.",
            DEFAULT_MAX_PAYLOAD_BYTES
        ),
        "oneOf": [{"$ref": "#/$defs/envelope"}, {"$ref": "#/$defs/plain"}],
        "$defs": {
            "envelopeKey": {"enum": fields},
            "envelope": {
                "title": "Envelope",
                "description": "An object with `payload` whose keys are all envelope keys. Every field but `payload` is optional; null means the same as absent. Whole numbers may be written 5, 5.0 or 5e0.",
                "type": "object",
                "required": ["payload"],
                "additionalProperties": false,
                "properties": {
                    "payload": {"$ref": "#/$defs/payload"},
                    "id": {"$ref": "#/$defs/id"},
                    "priority": whole(MIN_PRIORITY.into(), MAX_PRIORITY.into(), "0 runs first, 9 last; must be the priority of the subject the message is published to (else the message is refused, and kept as a dead job a retry runs at this priority)."),
                    "max_attempts": whole(1, MAX_ATTEMPTS.into(), "Attempts before the job is dead-lettered. Absent: the queue's max_attempts."),
                    "timeout_ms": whole(1, MAX_TIMEOUT_MS, "Time limit of one attempt, in milliseconds (at most 7 days). Absent: the queue's timeout."),
                    "idempotency_key": {"$ref": "#/$defs/key"},
                    "run_at_ms": whole(0, MAX_RUN_AT_MS, "Earliest start, in Unix milliseconds. In the future: the job waits as `scheduled`. Now or in the past: it runs at once."),
                    "backoff": {"$ref": "#/$defs/backoff"},
                    "then": {
                        "description": "Jobs to create when this one completes (a chain): each runs once, as its own job, and may have its own `then`. A `then` job's id is its `id`, or <this job's id>.<n> (n from 1). If this job ends dead or cancelled, its `then` jobs are never created.",
                        "type": ["array", "null"],
                        "maxItems": MAX_THEN_JOBS,
                        "items": {"$ref": "#/$defs/thenJob"}
                    },
                    "expires_at_ms": whole(0, MAX_RUN_AT_MS, "Not started by this instant (Unix milliseconds), the job never runs: it ends `cancelled` with last_error `expired: not started by <instant>`. Already past: it ends so at once. A job running when the instant passes runs to its end. Not with expires_in."),
                    "expires_in": {"$ref": "#/$defs/duration", "description": "Not started this long after the message was stored by the stream, the job never runs (as expires_at_ms). Above zero. Absent (and no expires_at_ms): the queue's expire_after, if it has one. Not with expires_at_ms."},
                    "key": {"$ref": "#/$defs/jobKey"},
                    "debounce": {"$ref": "#/$defs/duration", "description": "Jobs of this key (and queue) that come within this window collapse into the last one, which runs once the key has been quiet this long; the collapsed ones end `cancelled` (last_error `debounced: collapsed into job <id>`), counted in the survivor's `debounced`. Needs a key (`key`, or the queue's key_from). Not with throttle. Replaces the queue's debounce and throttle."},
                    "debounce_max_wait": {"$ref": "#/$defs/duration", "description": "With debounce: the job runs at the latest this long after the first collapsed job came, however busy the key. At least the debounce."},
                    "throttle": {"$ref": "#/$defs/duration", "description": "At most one job of this key (and queue) per window: a later one ends at once, `cancelled` with last_error `throttled: ...`. Needs a key. Not with debounce."},
                    "unique_for": {"$ref": "#/$defs/duration", "description": "The idempotency key is held this long only: a job with the same key within it is the same job, after it a new one. Needs `idempotency_key`. Absent: the queue's unique_for, else for ever."},
                    "batch": {"$ref": "#/$defs/batch"},
                    "depends_on": {
                        "description": "Not accepted in a published message: a job that waits for others must be stored before anything runs it (SQL enqueue(..., depends_on => ...), the Rust client, or `jobwarden enqueue --depends-on`). A message with this key is dead-lettered with that reason.",
                        "not": {}
                    }
                }
            },
            "plain": {
                "title": "Plain payload",
                "description": "Any JSON object that is not an envelope, taken whole as the payload with default settings. An object that has a `payload` key and only envelope keys is read as an envelope instead; one with `payload` and any other key is a plain payload.",
                "type": "object",
                "$ref": "#/$defs/storable",
                "not": {"required": ["payload"], "propertyNames": {"$ref": "#/$defs/envelopeKey"}}
            },
            "payload": payload,
            "storable": storable,
            "id": id,
            "key": key,
            "jobKey": job_key,
            "duration": duration,
            "backoff": backoff,
            "thenJob": then_job,
            "batch": batch
        }
    })
}

impl fmt::Display for Door {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(v: Value, door: Door) -> Result<Spec, Refused> {
        check_spec(v.as_object().unwrap(), door, Some(1 << 20))
    }

    #[test]
    fn the_id_tables_cover_every_control_and_whitespace_character() {
        for c in (0..=0x10FFFFu32).filter_map(char::from_u32) {
            if c.is_control() || c.is_whitespace() {
                assert!(
                    forbidden_in(c, ID_FORBIDDEN),
                    "{:04X} allowed in ids",
                    c as u32
                );
            }
            if c.is_control() {
                assert!(
                    forbidden_in(c, KEY_FORBIDDEN),
                    "{:04X} allowed in keys",
                    c as u32
                );
            }
        }
        for ok in [
            "order-42", "a:1", "ü", "日本", "%41", "-x", "a.b", "...", "🦀", "<b>&\"'",
        ] {
            assert!(check_id(ok).is_ok(), "{ok}: {:?}", check_id(ok));
        }
        for bad in [
            "",
            ".",
            "..",
            "a b",
            "a/b",
            "x\ny",
            "x\ry",
            "a\u{200B}b",
            "a\u{202E}b",
            "a?b",
            "a#b",
        ] {
            assert!(check_id(bad).is_err(), "{bad:?} accepted");
        }
        let e = check_id("x\ny").unwrap_err();
        assert!(e.contains("U+000A") && !e.contains('\n'), "{e}");
        assert!(check_id(&"é".repeat(100)).is_ok());
        assert!(check_id(&"é".repeat(101)).is_err());
    }

    #[test]
    fn only_a_well_formed_traceparent_is_kept() {
        let good = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        assert_eq!(traceparent(good), Some(good));
        for bad in [
            "",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\rx-evil: 1",
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
        ] {
            assert_eq!(traceparent(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn durations_read_the_documented_grammar() {
        let s = |t: &str| parse_duration_ns(t).map(|ns| ns / 1_000_000);
        assert_eq!(s("1s"), Ok(1000));
        assert_eq!(s("1h 30m"), Ok(5_400_000));
        assert_eq!(s("1.5s"), Ok(1500));
        assert_eq!(s(" 250 ms "), Ok(250));
        assert_eq!(s("2d1h"), Ok(2 * 86_400_000 + 3_600_000));
        assert_eq!(s("1M"), Ok(2_630_016_000));
        for bad in [
            "", "  ", "1", "s", "1x", "1.s", ".5s", "1,5s", "1s-", "-1s", "1e3s", "1s\n",
        ] {
            assert!(parse_duration_ns(bad).is_err(), "{bad:?} accepted");
        }
        // Every unit reads as humantime reads it (configuration files use humantime).
        for (unit, ns) in DURATION_UNITS {
            let text = format!("3{unit}");
            assert_eq!(
                humantime::parse_duration(&text).unwrap().as_nanos(),
                3 * ns,
                "{text}"
            );
            assert_eq!(parse_duration_ns(&text), Ok(3 * ns));
        }
    }

    #[test]
    fn a_backoff_beyond_ten_years_is_refused_and_every_accepted_one_is_computable() {
        let b = json!({"kind": "fixed", "base": "1000000y", "max": "1000000y"});
        let e = check_backoff(&b, "backoff").unwrap_err();
        assert_eq!(e.field(), "backoff.base", "{e}");
        let longest = json!({"kind": "exponential", "base": "3650d", "max": "3650d", "jitter": 1});
        let b = check_backoff(&longest, "backoff").unwrap();
        for attempt in [1, 2, 31, 1000, u32::MAX] {
            for unit in [0.0, 0.5, 0.999] {
                let d = b.delay_jittered(attempt, unit);
                assert!(d.as_millis() as i64 <= MAX_DELAY_MS);
                let _ = std::time::Instant::now() + d;
                let _ = std::time::SystemTime::now() + d;
            }
        }
        // The latest run_at plus the longest delay is still a date chrono (and PostgreSQL,
        // up to the year 294276) can hold.
        let t = chrono::DateTime::from_timestamp_millis(MAX_RUN_AT_MS).unwrap();
        assert!(t
            .checked_add_signed(chrono::Duration::milliseconds(MAX_DELAY_MS))
            .is_some());
    }

    #[test]
    fn each_door_takes_its_own_fields() {
        assert!(spec(json!({"payload": {}, "queue": "x"}), Door::Message).is_err());
        let e = spec(json!({"payload": {}, "depends_on": ["a"]}), Door::Message).unwrap_err();
        assert!(e.to_string().contains("--depends-on"), "{e}");
        let e = spec(json!({"payload": {}}), Door::Then).unwrap_err();
        assert_eq!(
            e,
            Refused::Missing {
                field: "queue".into()
            }
        );
        let e = spec(
            json!({"queue": "a", "payload": {}, "run_at_ms": 1}),
            Door::Then,
        )
        .unwrap_err();
        assert_eq!(e.field(), "run_at_ms");
        let ok = spec(
            json!({"queue": "a", "payload": {}, "depends_on": ["p1", "p2"], "delay_ms": 5}),
            Door::Enqueue,
        )
        .unwrap();
        assert_eq!(ok.depends_on, vec!["p1", "p2"]);
        // Whole numbers in any notation.
        let ok = spec(json!({"payload": {}, "priority": 2.0}), Door::Message).unwrap();
        assert_eq!(ok.priority, Some(2));
        let e = spec(json!({"payload": {}, "priority": 2.5}), Door::Message).unwrap_err();
        assert_eq!(e.field(), "priority");
    }

    #[test]
    fn then_trees_are_bounded_in_size_and_depth_and_name_the_field() {
        let mut deep = json!({"queue": "q", "payload": {}});
        for _ in 0..MAX_THEN_DEPTH {
            deep = json!({"queue": "q", "payload": {}, "then": [deep]});
        }
        let top = json!({"payload": {}, "then": [deep]});
        let e = spec(top, Door::Message).unwrap_err();
        assert!(e.field().ends_with(".then"), "{e}");
        let wide: Vec<Value> = (0..=MAX_THEN_JOBS)
            .map(|_| json!({"queue": "q", "payload": {}}))
            .collect();
        let e = spec(json!({"payload": {}, "then": wide}), Door::Message).unwrap_err();
        assert_eq!(e.field(), format!("then[{}]", MAX_THEN_JOBS + 1));
        let e = spec(
            json!({"payload": {}, "then": [{"queue": "q", "payload": {}, "then": [{"queue": "q", "payload": {}, "priority": 12}]}]}),
            Door::Message,
        )
        .unwrap_err();
        assert_eq!(e.field(), "then[1].then[1].priority");
    }

    #[test]
    fn the_published_json_schema_is_the_contracts() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/message.schema.json");
        let made = serde_json::to_string_pretty(&json_schema()).unwrap() + "\n";
        if std::env::var_os("JOBWARDEN_WRITE_SCHEMA").is_some() {
            std::fs::write(path, &made).unwrap();
        }
        let file = std::fs::read_to_string(path).unwrap();
        assert!(
            file == made,
            "docs/message.schema.json differs from contract::json_schema(): run \
             JOBWARDEN_WRITE_SCHEMA=1 cargo test --lib the_published_json_schema"
        );
    }

    #[test]
    fn every_placeholder_of_the_contract_migration_is_filled() {
        let sql = render_sql(include_str!("../migrations/V14__one_contract.sql"));
        assert!(!sql.contains("{{"));
        assert!(sql.contains(&format!("{MAX_ID_BYTES}")));
    }

    #[test]
    fn each_door_has_the_name_job_check_knows_it_by() {
        let doors = [Door::Message, Door::Then, Door::Enqueue];
        assert_eq!(doors.map(Door::as_str), ["message", "then", "enqueue"]);
        assert_eq!(doors.map(|d| d.to_string()), ["message", "then", "enqueue"]);
        // The SQL function picks each door's field list by that name (enqueue: the rest).
        let sql = include_str!("../migrations/V14__one_contract.sql");
        for door in [Door::Message, Door::Then] {
            assert!(
                sql.contains(&format!("WHEN '{door}' THEN ARRAY[")),
                "{door}"
            );
        }
    }

    #[test]
    fn a_refused_character_is_quoted_when_printable_and_named_by_code_point_when_not() {
        let e = check_id("a#b").unwrap_err();
        assert!(e.contains("contains '#';"), "{e}");
        let e = check_id("a b").unwrap_err();
        assert!(e.contains("contains U+0020;"), "{e}");
        let e = check_key("a\u{200B}b").unwrap_err();
        assert!(e.contains("contains U+200B;"), "{e}");
    }

    #[test]
    fn queue_names_and_keys_are_bounded_in_length_both_ends_included() {
        assert_eq!(check_queue("e_mail-2"), Ok(()));
        assert_eq!(check_queue(&"q".repeat(MAX_QUEUE_BYTES)), Ok(()));
        for bad in [String::new(), "q".repeat(MAX_QUEUE_BYTES + 1)] {
            let e = check_queue(&bad).unwrap_err();
            assert!(e.contains("must be 1 to 64 ASCII letters"), "{bad:?}: {e}");
        }
        assert_eq!(check_key(&"k".repeat(MAX_KEY_BYTES)), Ok(()));
        for (bad, len) in [(String::new(), 0), ("k".repeat(MAX_KEY_BYTES + 1), 201)] {
            let e = check_key(&bad).unwrap_err();
            assert!(
                e.contains(&format!("is {len} bytes long; a key is 1 to 200 bytes")),
                "{e}"
            );
        }
    }

    #[test]
    fn a_traceparent_with_an_all_zero_parent_id_is_dropped() {
        let zero_span = "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01";
        assert_eq!(traceparent(zero_span), None);
        let no_zero_digit = "00-1af7651916cd43dd8448eb211c81319c-b7ad6b7169243331-01";
        assert_eq!(traceparent(no_zero_digit), Some(no_zero_digit));
    }

    #[test]
    fn durations_are_bounded_in_length_and_digits_and_a_unit_ends_at_a_point() {
        let padded = format!("1s{}", " ".repeat(MAX_DURATION_TEXT - 2));
        assert_eq!(parse_duration_ns(&padded), Ok(1_000_000_000));
        let e = parse_duration_ns(&format!("{padded} ")).unwrap_err();
        assert!(e.starts_with("is 65 bytes long"), "{e}");
        let twenty = "9".repeat(MAX_DURATION_DIGITS);
        assert_eq!(
            parse_duration_ns(&format!("{twenty}ns")),
            Ok(twenty.parse().unwrap())
        );
        assert_eq!(parse_duration_ns("1.123456789s"), Ok(1_123_456_789));
        for bad in [format!("9{twenty}ns"), "1.1234567891s".to_string()] {
            let e = parse_duration_ns(&bad).unwrap_err();
            assert!(
                e.contains("has a number with too many digits"),
                "{bad}: {e}"
            );
        }
        // A number with no unit at the very end, and a unit followed by a point.
        let e = parse_duration_ns("1.5").unwrap_err();
        assert!(e.contains("unknown unit \"\""), "{e}");
        let e = parse_duration_ns("1h.5m").unwrap_err();
        assert!(e.contains("is not a duration: expected a number"), "{e}");
    }

    #[test]
    fn only_a_fixed_backoff_may_start_at_zero() {
        let fixed = check_backoff(&json!({"kind": "fixed", "base": "0s"}), "backoff").unwrap();
        assert_eq!(fixed.base, std::time::Duration::ZERO);
        for kind in ["linear", "exponential"] {
            let e = check_backoff(&json!({"kind": kind, "base": "0s"}), "backoff").unwrap_err();
            assert_eq!(e.field(), "backoff.base", "{e}");
        }
    }

    #[test]
    fn a_payload_of_exactly_the_limit_is_accepted() {
        let payload = json!({"a": "xx"}); // 10 bytes as JSON
        assert_eq!(check_payload(&payload, "payload", Some(10)), Ok(()));
        let e = check_payload(&payload, "payload", Some(9)).unwrap_err();
        assert!(
            e.to_string().contains("is 10 bytes, over the limit of 9"),
            "{e}"
        );
    }

    #[test]
    fn depends_on_and_then_depth_are_bounded_both_ends_included() {
        let parents = |n: usize| (0..n).map(|i| format!("p{i}")).collect::<Vec<_>>();
        let ok = spec(
            json!({"queue": "a", "payload": {}, "depends_on": parents(MAX_DEPENDS_ON)}),
            Door::Enqueue,
        )
        .unwrap();
        assert_eq!(ok.depends_on.len(), MAX_DEPENDS_ON);
        let e = spec(
            json!({"queue": "a", "payload": {}, "depends_on": parents(MAX_DEPENDS_ON + 1)}),
            Door::Enqueue,
        )
        .unwrap_err();
        assert!(e.to_string().contains("names 101 jobs"), "{e}");
        // MAX_THEN_DEPTH levels of then below a message: allowed.
        let mut deep = json!({"queue": "q", "payload": {}});
        for _ in 1..MAX_THEN_DEPTH {
            deep = json!({"queue": "q", "payload": {}, "then": [deep]});
        }
        assert!(spec(json!({"payload": {}, "then": [deep]}), Door::Message).is_ok());
    }

    #[test]
    fn a_then_job_is_kept_with_the_fields_it_was_given_only() {
        // `then` jobs are stored as values and checked again at the `then` door, which
        // takes no depends_on: an empty one must not be added.
        let top = spec(
            json!({"payload": {}, "then": [{"queue": "q", "payload": {"n": 1}, "priority": 2}]}),
            Door::Message,
        )
        .unwrap();
        assert_eq!(
            top.then,
            Some(json!([{"queue": "q", "payload": {"n": 1}, "priority": 2}]))
        );
        let waiting = Spec {
            depends_on: vec!["p1".into()],
            ..Spec::default()
        };
        assert_eq!(waiting.to_value()["depends_on"], json!(["p1"]));
    }

    #[test]
    fn the_forbidden_tables_are_written_as_postgres_bracket_escapes() {
        // NUL cannot be in a text, so a range from it starts at U+0001; code points past
        // U+FFFF take the eight-digit form.
        let table = [('\u{0}', '\u{1F}'), ('#', '#'), ('\u{E0001}', '\u{E007F}')];
        assert_eq!(
            sql_class(&table),
            "\\u0001-\\u001f\\u0023\\U000e0001-\\U000e007f"
        );
        let rendered = render_sql("[{{ID_FORBIDDEN}}] [{{KEY_FORBIDDEN}}]");
        assert!(
            rendered.starts_with("[\\u0001-\\u0020\\u0023\\u002f\\u003f"),
            "{rendered}"
        );
    }

    #[test]
    #[should_panic(expected = "unknown placeholder {{MAX_NOTHING}} in a SQL template")]
    fn an_unknown_placeholder_is_named_in_full() {
        render_sql("SELECT {{MAX_ID_BYTES}}, {{MAX_NOTHING}} + 1");
    }

    /// An applied migration must render the same text again (refinery refuses a database
    /// whose applied migration changed): version 14 keeps the field lists it had before
    /// expiry (version 18) added two.
    #[test]
    fn version_14_renders_the_field_lists_it_was_applied_with() {
        let v14 = render_sql(include_str!("../migrations/V14__one_contract.sql"));
        for list in [
            "ARRAY['id', 'payload', 'priority', 'max_attempts', 'timeout_ms', 'idempotency_key', 'run_at_ms', 'backoff', 'then', 'depends_on']",
            "ARRAY['queue', 'payload', 'id', 'priority', 'max_attempts', 'timeout_ms', 'delay_ms', 'idempotency_key', 'backoff', 'then']",
            "ARRAY['id', 'queue', 'payload', 'priority', 'max_attempts', 'timeout_ms', 'idempotency_key', 'run_at_ms', 'delay_ms', 'backoff', 'then', 'depends_on']",
        ] {
            assert!(v14.contains(list), "{list}");
        }
        assert!(!v14.contains("expires"));
        // Version 18 keeps the lists it had before the key (version 20) was added.
        let v18 = render_sql(include_str!("../migrations/V18__job_expiry.sql"));
        for list in [
            "ARRAY['id', 'payload', 'priority', 'max_attempts', 'timeout_ms', 'idempotency_key', 'run_at_ms', 'backoff', 'then', 'depends_on', 'expires_at_ms', 'expires_in']",
            "ARRAY['queue', 'payload', 'id', 'priority', 'max_attempts', 'timeout_ms', 'delay_ms', 'idempotency_key', 'backoff', 'then', 'expires_in']",
            "ARRAY['id', 'queue', 'payload', 'priority', 'max_attempts', 'timeout_ms', 'idempotency_key', 'run_at_ms', 'delay_ms', 'backoff', 'then', 'depends_on', 'expires_at_ms', 'expires_in']",
        ] {
            assert!(v18.contains(list), "{list}");
        }
        let v20 = render_sql(include_str!("../migrations/V20__job_keys.sql"));
        assert!(!v20.contains("debounce"));
        // Version 23 has today's lists but a message's `batch` (version 34), which version
        // 34's list has.
        let v23 = render_sql(include_str!("../migrations/V23__debounce.sql"));
        assert!(!v23.contains("'batch'"));
        let v34 = render_sql(include_str!("../migrations/V34__nats_batches.sql"));
        let message = Door::Message
            .fields()
            .iter()
            .map(|f| format!("'{f}'"))
            .collect::<Vec<_>>();
        assert!(v34.contains(&format!("ARRAY[{}]", message.join(", "))));
        assert!(message.last().is_some_and(|f| f == "'batch'"));
        for door in [Door::Message, Door::Then, Door::Enqueue] {
            let list = door
                .fields()
                .iter()
                .filter(|f| **f != "batch")
                .map(|f| format!("'{f}'"))
                .collect::<Vec<_>>()
                .join(", ");
            assert!(v23.contains(&format!("ARRAY[{list}]")), "{door}: {list}");
            for f in [
                "key",
                "debounce",
                "debounce_max_wait",
                "throttle",
                "unique_for",
            ] {
                assert!(door.fields().contains(&f), "{door}: {f}");
            }
        }
    }

    #[test]
    fn a_messages_batch_is_checked_and_its_declaration_compares_meanings() {
        let spec = |v: Value| check_spec(v.as_object().unwrap(), Door::Message, None);
        let a = spec(json!({"payload": {}, "batch": {"id": "b-1", "size": 3.0,
            "on_complete": {"queue": "r", "payload": {}, "expires_in": "1h"}}}))
        .unwrap()
        .batch
        .unwrap();
        let b = spec(json!({"payload": {}, "batch": {"id": "b-1", "size": 3,
            "on_complete": {"queue": "r", "payload": {}, "expires_in": "60m"}, "on_success": null}}))
        .unwrap()
        .batch
        .unwrap();
        // The same meaning, written two ways: one declaration.
        assert_eq!(a.declaration(), b.declaration());
        assert_eq!(
            a.declaration(),
            json!({"size": 3, "on_complete": {"queue": "r", "payload": {}, "expires_in": "3600000ms"}})
        );
        // A batch id is an id, short enough for its callbacks' ids.
        let long = "b".repeat(MAX_BATCH_ID_BYTES + 1);
        let e = spec(json!({"payload": {}, "batch": {"id": long, "size": 1}})).unwrap_err();
        assert_eq!(e.field(), "batch.id");
        assert!(
            e.to_string().contains("the limit for a batch id is 184"),
            "{e}"
        );
        assert!(spec(
            json!({"payload": {}, "batch": {"id": "b".repeat(MAX_BATCH_ID_BYTES), "size": 1}})
        )
        .is_ok());
        let e = spec(json!({"payload": {}, "batch": {"id": "b", "size": MAX_BATCH_SIZE + 1}}))
            .unwrap_err();
        assert_eq!(e.field(), "batch.size");
        // Only a message takes a batch.
        let e = check_spec(
            json!({"queue": "q", "payload": {}, "batch": {"id": "b", "size": 1}})
                .as_object()
                .unwrap(),
            Door::Enqueue,
            None,
        )
        .unwrap_err();
        assert!(matches!(e, Refused::Unknown { .. }), "{e}");
    }

    #[test]
    fn a_jobs_key_follows_the_rules_of_an_id_in_its_own_words() {
        for ok in [
            "customer-42",
            "a:1",
            "日本",
            "a.b",
            "...",
            "🦀",
            &"k".repeat(MAX_ID_BYTES),
        ] {
            assert_eq!(check_job_key(ok), Ok(()), "{ok}");
        }
        for (bad, words) in [
            ("", "must not be empty"),
            (".", "\".\" cannot be a key"),
            ("..", "\"..\" cannot be a key"),
            ("a b", "contains U+0020; a key may not hold"),
            ("a/b", "contains '/'; a key may not hold"),
            ("x\u{200B}y", "contains U+200B"),
            (
                &"k".repeat(MAX_ID_BYTES + 1),
                "is 201 bytes long, the limit is 200",
            ),
        ] {
            let e = check_job_key(bad).unwrap_err();
            assert!(e.contains(words), "{bad:?}: {e}");
            assert_eq!(check_job_key(bad).is_ok(), check_id(bad).is_ok(), "{bad:?}");
        }
        // At every door, named `key` (a path inside a `then` tree).
        for door in [Door::Message, Door::Then, Door::Enqueue] {
            let ok = spec(
                json!({"queue": "q", "payload": {}, "key": "customer-42"}),
                door,
            )
            .or_else(|_| spec(json!({"payload": {}, "key": "customer-42"}), door))
            .unwrap();
            assert_eq!(ok.key.as_deref(), Some("customer-42"), "{door}");
        }
        let e = spec(json!({"payload": {}, "key": 42}), Door::Message).unwrap_err();
        assert_eq!(
            e.to_string(),
            "field `key` must be a string, found a number"
        );
        let e = spec(
            json!({"payload": {}, "then": [{"queue": "q", "payload": {}, "key": ".."}]}),
            Door::Message,
        )
        .unwrap_err();
        assert_eq!(e.field(), "then[1].key", "{e}");
        // A `then` job keeps its key (it is checked again at the `then` door).
        let top = spec(
            json!({"payload": {}, "then": [{"queue": "q", "payload": {}, "key": "c-1"}]}),
            Door::Message,
        )
        .unwrap();
        assert_eq!(top.then.unwrap()[0]["key"], json!("c-1"));
    }
}
