//! Completion from outside: a handler that answers "accepted, I will report" (an http `202`
//! with [`DEFER_HEADER`], an exec command's exit code 202, a Rust handler's
//! `JobContext::defer`) leaves its job
//! `awaiting` until `complete` or `fail` comes with the attempt's token, or its deadline
//! passes (schema version 31, `migrations/V31__deferred_completion.sql`).
//!
//! The token names one attempt: `<lease>.<32 hex digits>`, the digits the first 16 bytes of
//! HMAC-SHA256(key, job id, NUL, lease) under the schema's `completion_key`. Workers compute
//! it for each attempt they start (no write, no round trip); PostgreSQL's `complete()` and
//! `fail()` compute it again to check one, so a completion can come through any pod's local
//! API, the CLI, the Rust client or plain SQL.

use sha2::{Digest, Sha256};
use std::fmt;
use std::time::Duration;

/// The response header with which an http handler's `202` defers its job: the deadline, in
/// seconds (`600`) or as a duration (`10m`, `1h 30m`).
pub const DEFER_HEADER: &str = "Jobwarden-Defer";

/// HMAC-SHA256 under the schema's `completion_key` (its inner and outer pads), kept as the
/// two hash states after each pad's block: a token costs two short hashes, not four blocks.
#[derive(Clone)]
pub struct CompletionKey {
    inner: Sha256,
    outer: Sha256,
}

impl fmt::Debug for CompletionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CompletionKey(..)")
    }
}

impl CompletionKey {
    /// The key from the row's two columns; `None` unless both are 64 bytes.
    pub fn from_pads(ipad: &[u8], opad: &[u8]) -> Option<CompletionKey> {
        let (ipad, opad): (&[u8; 64], &[u8; 64]) = (ipad.try_into().ok()?, opad.try_into().ok()?);
        Some(CompletionKey {
            inner: Sha256::new().chain_update(ipad),
            outer: Sha256::new().chain_update(opad),
        })
    }

    /// A key no schema holds: tokens it makes are refused everywhere (a detached context's).
    pub fn unusable() -> CompletionKey {
        CompletionKey::from_pads(&[0x36; 64], &[0x5c; 64]).expect("64-byte pads")
    }

    /// The token of attempt `lease` of job `id`.
    pub fn token(&self, id: &str, lease: i64) -> String {
        let mut lease_text = itoa::Buffer::new();
        let lease_text = lease_text.format(lease);
        let inner = self
            .inner
            .clone()
            .chain_update(id.as_bytes())
            .chain_update([0u8])
            .chain_update(lease_text.as_bytes())
            .finalize();
        let mac = self.outer.clone().chain_update(inner).finalize();
        let mut out = String::with_capacity(lease_text.len() + 33);
        out.push_str(lease_text);
        out.push('.');
        for b in &mac[..16] {
            out.push(char::from_digit(u32::from(b >> 4), 16).expect("a nibble"));
            out.push(char::from_digit(u32::from(b & 15), 16).expect("a nibble"));
        }
        out
    }
}

/// A deadline a deferring handler may give: more than zero, at most
/// [`crate::contract::MAX_DEFER_MS`]. `Err` says why not, naming the value.
pub fn check_deadline(deadline: Duration) -> Result<Duration, String> {
    let max = Duration::from_millis(crate::contract::MAX_DEFER_MS as u64);
    if deadline.is_zero() || deadline > max {
        return Err(format!(
            "deferral deadline {} is out of range: give more than 0 and at most {}",
            humantime::format_duration(deadline),
            humantime::format_duration(max)
        ));
    }
    Ok(deadline)
}

/// A deadline as written in a [`DEFER_HEADER`] or an exec command's `{"defer": ...}` line:
/// whole seconds (`600`) or a duration (`10m`, `1h 30m`).
pub fn parse_deadline(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let d = match text.parse::<u64>() {
        Ok(s) => Duration::from_secs(s),
        Err(_) => humantime::parse_duration(text).map_err(|e| {
            format!(
                "deferral deadline {:?} is not a duration ({e}): write seconds (600) or a \
                 duration (10m, 1h 30m)",
                text.chars().take(64).collect::<String>()
            )
        })?,
    };
    check_deadline(d)
}

/// What a completion or failure from outside came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// The job completed (`complete`).
    Completed,
    /// The same token had completed it already: nothing changed.
    AlreadyCompleted,
    /// Failed: it runs again after its backoff (`fail`).
    Retried,
    /// Failed for good, or with no attempts left: dead-lettered.
    Dead,
    /// The same token had failed it already (or its deadline had): nothing changed.
    AlreadyFailed,
}

impl Ended {
    pub fn parse(text: &str) -> Option<Ended> {
        Some(match text {
            "completed" => Ended::Completed,
            "already completed" => Ended::AlreadyCompleted,
            "scheduled" => Ended::Retried,
            "dead" => Ended::Dead,
            "already failed" => Ended::AlreadyFailed,
            _ => return None,
        })
    }

    /// As the API and the CLI say it.
    pub fn as_str(&self) -> &'static str {
        match self {
            Ended::Completed => "completed",
            Ended::AlreadyCompleted => "already completed",
            Ended::Retried => "retry scheduled",
            Ended::Dead => "dead",
            Ended::AlreadyFailed => "already failed",
        }
    }
}

/// Why a completion or failure from outside was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No such job (`JW404`).
    UnknownJob,
    /// The token was not issued for this job: forged, mistyped, another job's (`JW403`).
    BadToken,
    /// The token's attempt cannot be ended from outside: stale, not deferred, cancelled,
    /// past its deadline, already ended otherwise (`JW409`).
    Conflict,
    /// The result is over [`crate::contract::MAX_RESULT_BYTES`] (`54000`).
    TooLarge,
    /// A malformed argument (`22023`).
    Invalid,
}

impl Refusal {
    /// The refusal a SQLSTATE of `complete()` or `fail()` means.
    pub fn from_sqlstate(code: &str) -> Option<Refusal> {
        Some(match code {
            "JW404" => Refusal::UnknownJob,
            "JW403" => Refusal::BadToken,
            "JW409" => Refusal::Conflict,
            "54000" => Refusal::TooLarge,
            "22023" => Refusal::Invalid,
            _ => return None,
        })
    }

    /// Whether the refusal is recorded in the job's attempts (a token was checked against
    /// an existing job).
    pub fn recorded(&self) -> bool {
        matches!(self, Refusal::BadToken | Refusal::Conflict)
    }

    /// The HTTP status the local API answers with.
    pub fn http_status(&self) -> u16 {
        match self {
            Refusal::UnknownJob => 404,
            Refusal::BadToken => 403,
            Refusal::Conflict => 409,
            Refusal::TooLarge => 413,
            Refusal::Invalid => 400,
        }
    }
}

/// A refused completion or failure, with PostgreSQL's words (message and hint).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Refused {
    pub refusal: Refusal,
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_name_the_job_and_the_attempt() {
        let k = CompletionKey::from_pads(&[1; 64], &[2; 64]).unwrap();
        let t = k.token("job-1", 7);
        assert!(t.starts_with("7."), "{t}");
        assert_eq!(t.len(), 2 + 32);
        assert!(t[2..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
        assert_eq!(t, k.token("job-1", 7));
        assert_ne!(t, k.token("job-1", 8));
        assert_ne!(t, k.token("job-2", 7));
        // The NUL between id and lease: ("a1", 2) and ("a", 12) differ.
        assert_ne!(k.token("a1", 2)[2..], k.token("a", 12)[3..]);
        let other = CompletionKey::from_pads(&[3; 64], &[2; 64]).unwrap();
        assert_ne!(t, other.token("job-1", 7));
        assert!(CompletionKey::from_pads(&[1; 63], &[2; 64]).is_none());
    }

    #[test]
    fn deadlines_are_bounded_and_read_as_seconds_or_durations() {
        assert_eq!(parse_deadline("600"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_deadline(" 10m "), Ok(Duration::from_secs(600)));
        assert_eq!(parse_deadline("1h 30m"), Ok(Duration::from_secs(5400)));
        for bad in ["0", "", "soon", "-5", "31days", "99999999999999999999"] {
            let e = parse_deadline(bad).unwrap_err();
            assert!(e.contains("deferral deadline"), "{bad}: {e}");
        }
        assert!(check_deadline(Duration::from_millis(1)).is_ok());
    }
}
