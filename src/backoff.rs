//! Retry policy: how long to wait before the next attempt, and what a finished attempt makes
//! of the job. Pure functions, unit tested; the store applies what they decide.

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// How the delay grows between attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackoffKind {
    /// Always `base`.
    Fixed,
    /// `base × attempt`.
    Linear,
    /// `base × 2^(attempt-1)`.
    Exponential,
}

/// A queue's backoff: kind, base delay, cap, and jitter (fraction of the delay, 0–1).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Backoff {
    pub kind: BackoffKind,
    #[serde(with = "humantime_serde")]
    pub base: Duration,
    #[serde(with = "humantime_serde", default = "default_max")]
    pub max: Duration,
    #[serde(default)]
    pub jitter: f64,
}

fn default_max() -> Duration {
    Duration::from_secs(3600)
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            kind: BackoffKind::Exponential,
            base: Duration::from_secs(1),
            max: default_max(),
            jitter: 0.0,
        }
    }
}

impl Backoff {
    /// The rules a backoff must follow (the config check and message decoding share them).
    pub fn validate(&self) -> Result<(), String> {
        if self.base.is_zero() && self.kind != BackoffKind::Fixed {
            return Err(format!(
                "base must be above zero for {:?} backoff",
                self.kind
            ));
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            return Err(format!("jitter ({}) must be between 0 and 1", self.jitter));
        }
        let longest = Duration::from_millis(LONGEST_DELAY_MS as u64);
        if self.base > longest || self.max > longest {
            return Err(format!(
                "base ({:?}) and max ({:?}) must be at most {} days, the longest delay a job \
                 may wait",
                self.base,
                self.max,
                longest.as_secs() / 86_400
            ));
        }
        if self.max < self.base {
            return Err(format!(
                "max ({:?}) must not be below base ({:?})",
                self.max, self.base
            ));
        }
        Ok(())
    }

    /// Delay after the failed attempt number `attempt` (1-based), before jitter.
    pub fn delay(&self, attempt: u32) -> Duration {
        let n = attempt.max(1);
        let d = match self.kind {
            BackoffKind::Fixed => self.base,
            BackoffKind::Linear => self.base.saturating_mul(n),
            BackoffKind::Exponential => self
                .base
                .saturating_mul(2u32.saturating_pow((n - 1).min(31))),
        };
        d.min(self.max)
    }

    /// Delay with jitter applied: `unit` in [0, 1) picks a point in ±jitter/2 around the delay.
    pub fn delay_jittered(&self, attempt: u32, unit: f64) -> Duration {
        let d = self.delay(attempt);
        if self.jitter.is_nan() || self.jitter <= 0.0 {
            return d;
        }
        let factor = 1.0 + self.jitter.min(1.0) * (unit.clamp(0.0, 1.0) - 0.5);
        // `mul_f64` panics past Duration::MAX: a delay is at most 1.5 × max, so only a max
        // near Duration::MAX (a row from before the contract bounded backoffs) could; such a
        // product saturates instead.
        Duration::try_from_secs_f64(d.as_secs_f64() * factor.max(0.0))
            .unwrap_or(Duration::MAX)
            .min(self.max)
    }
}

/// How a handler's attempt ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Success(Option<serde_json::Value>),
    /// Worth another attempt; `retry_after` overrides the backoff (e.g. HTTP `Retry-After`).
    Retry {
        error: String,
        retry_after: Option<Duration>,
    },
    /// Will never succeed: dead-letter at once.
    Permanent {
        error: String,
    },
    /// Stopped by a graceful shutdown: give the job back without counting the attempt.
    Released,
    /// The handler handed the work on: the job awaits a completion or failure from outside
    /// until `deadline` (completion from outside).
    Deferred {
        deadline: Duration,
    },
}

/// What the store should make of the job after an attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum Settlement {
    Complete(Option<serde_json::Value>),
    /// Run again after `delay` (waits in Postgres as `scheduled`).
    RetryAfter {
        delay: Duration,
        error: String,
    },
    Dead {
        error: String,
    },
    /// Give the job back now, attempt refunded (graceful shutdown).
    Release,
    /// Wait (as `awaiting`) up to `deadline` for a completion or failure from outside; a
    /// failure or the deadline retries it after `retry` (or dead-letters it, when no attempts
    /// are left).
    Await {
        deadline: Duration,
        retry: Duration,
    },
}

/// Makes an outcome storable in PostgreSQL: text with NUL characters (an exec's stderr, an
/// HTTP body) gets them replaced, a result jsonb cannot hold is kept as text instead, and a
/// result over [`MAX_RESULT_BYTES`] is replaced by `{"omitted": "<why>"}`
/// (the job did its work: it completes, without the result).
pub fn storable(outcome: Outcome) -> Outcome {
    use crate::jsonb::{clean_text as clean, has_nul};
    let max = MAX_RESULT_BYTES;
    match outcome {
        Outcome::Success(Some(v)) if json_len(&v) > max => {
            Outcome::Success(Some(serde_json::json!({
                "omitted": format!(
                    "the handler's result was {} bytes of JSON, over the limit of {max} bytes a \
                     job stores; store a large result elsewhere (object storage, a table) and \
                     return a reference to it",
                    json_len(&v)
                )
            })))
        }
        Outcome::Success(Some(v)) if has_nul(&v) => Outcome::Success(Some(serde_json::json!({
            "unstorable_result": clean(v.to_string())
        }))),
        Outcome::Retry { error, retry_after } => Outcome::Retry {
            error: clean(error),
            retry_after,
        },
        Outcome::Permanent { error } => Outcome::Permanent {
            error: clean(error),
        },
        other => other,
    }
}

/// The length of `v` as compact JSON text, counted without building the text.
fn json_len(v: &serde_json::Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    let _ = serde_json::to_writer(&mut c, v);
    c.0
}

/// Largest result a job may store, as JSON text (the contract's `MAX_RESULT_BYTES`).
pub const MAX_RESULT_BYTES: usize = 1024 * 1024;

/// The longest a retry ever waits, and the longest delay anything may ask for (the
/// contract's `MAX_DELAY_MS`): ten years, so `now() + LONGEST_DELAY_MS` fits a `timestamptz`
/// until the year 9989, and every `Duration` and `Instant` sum with it.
pub const LONGEST_DELAY_MS: i64 = 3650 * 24 * 3600 * 1000;
/// [`LONGEST_DELAY_MS`] as a duration.
pub const LONGEST_DELAY: Duration = Duration::from_millis(LONGEST_DELAY_MS as u64);

/// Decides the next state of a job whose attempt number `attempt` (1-based, already counted)
/// ended with `outcome`, given `max_attempts` and the queue's backoff.
pub fn settle(
    outcome: Outcome,
    attempt: u32,
    max_attempts: u32,
    backoff: &Backoff,
    jitter_unit: f64,
) -> Settlement {
    match outcome {
        Outcome::Success(result) => Settlement::Complete(result),
        Outcome::Released => Settlement::Release,
        Outcome::Deferred { deadline } => Settlement::Await {
            deadline,
            retry: backoff
                .delay_jittered(attempt, jitter_unit)
                .min(LONGEST_DELAY),
        },
        Outcome::Permanent { error } => Settlement::Dead {
            error: format!("permanent error: {error}"),
        },
        Outcome::Retry { error, .. } if attempt >= max_attempts => Settlement::Dead {
            error: format!("{error} (attempt {attempt} of {max_attempts}, no attempts left)"),
        },
        Outcome::Retry { error, retry_after } => Settlement::RetryAfter {
            // The one place a retry's delay is bounded: never past the contract's longest
            // delay, whatever backoff a row holds (rows stored before the contract bounded
            // backoffs may hold any) or a handler asks for.
            delay: retry_after
                .map(|d| d.min(backoff.max))
                .unwrap_or_else(|| backoff.delay_jittered(attempt, jitter_unit))
                .min(LONGEST_DELAY),
            error,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(kind: BackoffKind, base_s: u64) -> Backoff {
        Backoff {
            kind,
            base: Duration::from_secs(base_s),
            max: Duration::from_secs(3600),
            jitter: 0.0,
        }
    }

    #[test]
    fn exponential_doubles() {
        let e = b(BackoffKind::Exponential, 1);
        let got: Vec<u64> = (1..=4).map(|a| e.delay(a).as_secs()).collect();
        assert_eq!(got, vec![1, 2, 4, 8]);
    }

    #[test]
    fn linear_and_fixed() {
        assert_eq!(b(BackoffKind::Linear, 3).delay(3), Duration::from_secs(9));
        assert_eq!(b(BackoffKind::Fixed, 10).delay(7), Duration::from_secs(10));
    }

    #[test]
    fn cap_holds_even_for_huge_attempts() {
        let mut e = b(BackoffKind::Exponential, 1);
        e.max = Duration::from_secs(60);
        assert_eq!(e.delay(1000), Duration::from_secs(60));
    }

    #[test]
    fn jitter_stays_in_band() {
        let mut e = b(BackoffKind::Fixed, 10);
        e.jitter = 0.2;
        assert_eq!(e.delay_jittered(1, 0.0), Duration::from_secs(9));
        assert_eq!(e.delay_jittered(1, 1.0), Duration::from_secs(11));
        assert_eq!(e.delay_jittered(1, 0.5), Duration::from_secs(10));
    }

    #[test]
    fn outcomes_are_made_storable() {
        let out = storable(Outcome::Retry {
            error: "bad\0byte".into(),
            retry_after: None,
        });
        assert_eq!(
            out,
            Outcome::Retry {
                error: "bad\u{FFFD}byte".into(),
                retry_after: None
            }
        );
        let out = storable(Outcome::Success(Some(serde_json::json!({"a": "x\u{0}y"}))));
        let Outcome::Success(Some(v)) = out else {
            panic!("still a success")
        };
        assert!(v["unstorable_result"]
            .as_str()
            .unwrap()
            .contains("x\\u0000y"));
        let fine = Outcome::Success(Some(serde_json::json!({"a": 1})));
        assert_eq!(storable(fine.clone()), fine);
    }

    #[test]
    fn a_retry_never_waits_past_the_longest_delay_whatever_the_backoff() {
        // A row stored before the contract bounded backoffs may hold any.
        let huge = Backoff {
            kind: BackoffKind::Exponential,
            base: Duration::from_secs(31_557_600 * 1_000_000),
            max: Duration::MAX,
            jitter: 1.0,
        };
        let retry = Outcome::Retry {
            error: "x".into(),
            retry_after: Some(Duration::MAX),
        };
        for attempt in [1, 2, 64, u32::MAX - 1] {
            for unit in [0.0, 0.5, 0.999] {
                let got = settle(
                    Outcome::Retry {
                        error: "x".into(),
                        retry_after: None,
                    },
                    attempt,
                    u32::MAX,
                    &huge,
                    unit,
                );
                let Settlement::RetryAfter { delay, .. } = got else {
                    panic!("{got:?}")
                };
                assert!(delay <= LONGEST_DELAY, "{delay:?}");
            }
        }
        let Settlement::RetryAfter { delay, .. } = settle(retry, 1, 3, &huge, 0.5) else {
            panic!()
        };
        assert_eq!(delay, LONGEST_DELAY);
    }

    #[test]
    fn settle_decides() {
        let e = b(BackoffKind::Exponential, 1);
        let retry = || Outcome::Retry {
            error: "boom".into(),
            retry_after: None,
        };
        assert_eq!(
            settle(retry(), 2, 3, &e, 0.5),
            Settlement::RetryAfter {
                delay: Duration::from_secs(2),
                error: "boom".into()
            }
        );
        assert!(matches!(
            settle(retry(), 3, 3, &e, 0.5),
            Settlement::Dead { .. }
        ));
        assert!(matches!(
            settle(
                Outcome::Permanent {
                    error: "bad".into()
                },
                1,
                3,
                &e,
                0.5
            ),
            Settlement::Dead { .. }
        ));
        let honoured = Outcome::Retry {
            error: "429".into(),
            retry_after: Some(Duration::from_secs(30)),
        };
        assert_eq!(
            settle(honoured, 1, 3, &e, 0.5),
            Settlement::RetryAfter {
                delay: Duration::from_secs(30),
                error: "429".into()
            }
        );
        assert_eq!(
            settle(Outcome::Success(None), 1, 1, &e, 0.5),
            Settlement::Complete(None)
        );
        // A release at shutdown never dead-letters, even on the last attempt.
        assert_eq!(
            settle(Outcome::Released, 3, 3, &e, 0.5),
            Settlement::Release
        );
    }

    #[test]
    fn a_queues_backoff_is_refused_outside_its_rules_and_accepted_at_their_edges() {
        let longest = Duration::from_millis(LONGEST_DELAY_MS as u64);
        let ok = |kind, base: Duration, max: Duration, jitter| {
            Backoff {
                kind,
                base,
                max,
                jitter,
            }
            .validate()
        };
        let s = Duration::from_secs;
        assert_eq!(Backoff::default().validate(), Ok(()));
        // A zero base only makes sense for a fixed backoff.
        assert_eq!(ok(BackoffKind::Fixed, s(0), s(1), 0.0), Ok(()));
        for kind in [BackoffKind::Linear, BackoffKind::Exponential] {
            let e = ok(kind, s(0), s(1), 0.0).unwrap_err();
            assert!(e.contains("base must be above zero"), "{e}");
        }
        // Jitter is a fraction from 0 to 1, both ends included.
        assert_eq!(ok(BackoffKind::Fixed, s(1), s(1), 0.0), Ok(()));
        assert_eq!(ok(BackoffKind::Fixed, s(1), s(1), 1.0), Ok(()));
        for jitter in [-0.1, 1.1, f64::NAN] {
            let e = ok(BackoffKind::Fixed, s(1), s(1), jitter).unwrap_err();
            assert!(e.contains("must be between 0 and 1"), "{jitter}: {e}");
        }
        // Neither base nor max past the longest delay; exactly it is allowed.
        assert_eq!(ok(BackoffKind::Fixed, longest, longest, 0.0), Ok(()));
        let past = longest + Duration::from_millis(1);
        for (base, max) in [(s(1), past), (past, past)] {
            let e = ok(BackoffKind::Fixed, base, max, 0.0).unwrap_err();
            assert!(
                e.contains("must be at most 3650 days"),
                "{base:?} {max:?}: {e}"
            );
        }
        // max at least base.
        assert_eq!(ok(BackoffKind::Linear, s(5), s(5), 0.0), Ok(()));
        assert_eq!(ok(BackoffKind::Linear, s(5), s(6), 0.0), Ok(()));
        let e = ok(BackoffKind::Linear, s(5), s(4), 0.0).unwrap_err();
        assert!(e.contains("must not be below base"), "{e}");
    }

    #[test]
    fn a_jitter_that_is_not_a_positive_fraction_leaves_the_delay_as_it_is() {
        // Rows stored before the contract checked jitter may hold anything.
        for jitter in [f64::NAN, -0.5, 0.0] {
            let mut e = b(BackoffKind::Fixed, 10);
            e.jitter = jitter;
            for unit in [0.0, 0.25, 0.999] {
                assert_eq!(
                    e.delay_jittered(1, unit),
                    Duration::from_secs(10),
                    "jitter {jitter}, unit {unit}"
                );
            }
        }
    }

    #[test]
    fn a_result_over_the_limit_is_replaced_by_why_and_a_deferral_keeps_its_deadline() {
        let big = serde_json::json!({"blob": "x".repeat(MAX_RESULT_BYTES)});
        let Outcome::Success(Some(v)) = storable(Outcome::Success(Some(big))) else {
            panic!("still a success");
        };
        let why = v["omitted"].as_str().unwrap();
        assert!(why.contains("over the limit of 1048576 bytes"), "{why}");
        let fits = serde_json::json!({"blob": "x".repeat(MAX_RESULT_BYTES - 20)});
        assert_eq!(
            storable(Outcome::Success(Some(fits.clone()))),
            Outcome::Success(Some(fits))
        );
        let e = b(BackoffKind::Fixed, 30);
        let deadline = Duration::from_secs(900);
        // The retry delay is computed even on the last attempt (the SQL then dead-letters).
        for attempt in [1, 5] {
            assert_eq!(
                settle(Outcome::Deferred { deadline }, attempt, 5, &e, 0.5),
                Settlement::Await {
                    deadline,
                    retry: Duration::from_secs(30)
                }
            );
        }
    }
}
