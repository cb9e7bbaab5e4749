//! The one backoff loop of the worker: how a retried step lives through a failure that lasts
//! (a server outage, a server restarting during start-up). Every retry backs off — doubling
//! from a first wait to a cap — and says so once: the first failure, then at most one line
//! every [`LOG_EVERY`], and one line when the step works again, instead of a line per try
//! (invariant 14).
//!
//! Used by the periodic services (scheduler, reaper and sweeps, adopter, janitor, cron,
//! heartbeat), flow control, progress reports, the settle path, and start-up's retries
//! ([`retry_until`](super::retry_until)).

use std::borrow::Cow;
use std::fmt::Display;
use std::time::Duration;
use tokio::time::Instant;
use tracing::{info, warn};

/// At most one "still failing" line this often.
pub(crate) const LOG_EVERY: Duration = Duration::from_secs(30);
const FIRST_WAIT: Duration = Duration::from_millis(200);
const LONGEST_WAIT: Duration = Duration::from_secs(5);

pub(crate) struct Outage {
    what: Cow<'static, str>,
    failures: u32,
    since: Option<Instant>,
    last_log: Option<Instant>,
    first_wait: Duration,
    longest_wait: Duration,
    /// How its lines read.
    words: Words,
    /// Lines written (for the tests of the rate limit).
    lines: u32,
}

/// How an outage's lines read.
#[derive(Clone, Copy)]
enum Words {
    /// A service's step: "failed", "still failing", "works again".
    Failing,
    /// A server or resource waited for: "not available", "still not available",
    /// "available".
    Unavailable,
}

impl Outage {
    /// An outage of `what` whose waits double from 200 ms to 5 s.
    pub fn new(what: impl Into<Cow<'static, str>>) -> Outage {
        Outage::between(what, FIRST_WAIT, LONGEST_WAIT)
    }

    /// An outage of `what` whose waits double from `first_wait` to `longest_wait`.
    pub fn between(
        what: impl Into<Cow<'static, str>>,
        first_wait: Duration,
        longest_wait: Duration,
    ) -> Outage {
        Outage {
            what: what.into(),
            failures: 0,
            since: None,
            last_log: None,
            first_wait,
            longest_wait,
            words: Words::Failing,
            lines: 0,
        }
    }

    /// Like [`Outage::between`], for a server or resource waited for (start-up): its lines
    /// say "{what} not available".
    pub fn unavailable(
        what: impl Into<Cow<'static, str>>,
        first_wait: Duration,
        longest_wait: Duration,
    ) -> Outage {
        Outage {
            words: Words::Unavailable,
            ..Outage::between(what, first_wait, longest_wait)
        }
    }

    /// Records a failed try; returns how long to wait before the next one.
    pub fn failed(&mut self, cause: &dyn Display) -> Duration {
        self.failures = self.failures.saturating_add(1);
        let now = Instant::now();
        let since = *self.since.get_or_insert(now);
        if self.last_log.is_none_or(|t| now - t >= LOG_EVERY) {
            self.last_log = Some(now);
            self.lines += 1;
            let what = self.what.as_ref();
            let failing_for = now - since;
            match (self.words, self.failures) {
                (Words::Failing, 1) => {
                    warn!(service = what, %cause, "failed; backing off until it works again")
                }
                (Words::Failing, n) => {
                    warn!(service = what, %cause, failures = n, ?failing_for, "still failing")
                }
                (Words::Unavailable, 1) => {
                    warn!(%cause, "{what} not available; retrying with backoff")
                }
                (Words::Unavailable, n) => {
                    warn!(%cause, tries = n, ?failing_for, "{what} still not available; retrying with backoff")
                }
            }
        }
        backoff_between(self.failures, self.first_wait, self.longest_wait)
    }

    /// Records a try that worked; says so when it ends a run of failures.
    pub fn ok(&mut self) {
        if self.failures > 0 {
            self.lines += 1;
            let (what, after) = (self.what.as_ref(), self.since.map(|s| s.elapsed()));
            match self.words {
                Words::Failing => {
                    info!(
                        service = what,
                        failures = self.failures,
                        ?after,
                        "works again"
                    )
                }
                Words::Unavailable => info!(tries = self.failures, ?after, "{what} available"),
            }
        }
        self.failures = 0;
        self.since = None;
        self.last_log = None;
    }

    /// Is the step in a run of failures?
    pub fn failing(&self) -> bool {
        self.failures > 0
    }

    /// Lines written so far.
    #[cfg(test)]
    pub fn lines(&self) -> u32 {
        self.lines
    }
}

/// Wait after `n` consecutive failures (200 ms doubling to 5 s).
pub(crate) fn backoff(n: u32) -> Duration {
    backoff_between(n, FIRST_WAIT, LONGEST_WAIT)
}

/// Wait after `n` consecutive failures: `first`, doubling, at most `longest`.
pub(crate) fn backoff_between(n: u32, first: Duration, longest: Duration) -> Duration {
    first
        .saturating_mul(1u32 << n.saturating_sub(1).min(16))
        .min(longest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_up_to_the_cap() {
        assert_eq!(backoff(1), Duration::from_millis(200));
        assert_eq!(backoff(2), Duration::from_millis(400));
        assert_eq!(backoff(5), Duration::from_millis(3200));
        assert_eq!(backoff(6), Duration::from_secs(5));
        assert_eq!(backoff(60), Duration::from_secs(5));
        assert_eq!(backoff(u32::MAX), Duration::from_secs(5));
        let s = Duration::from_secs(1);
        assert_eq!(backoff_between(1, s, 30 * s), s);
        assert_eq!(backoff_between(5, s, 30 * s), 16 * s);
        assert_eq!(backoff_between(6, s, 30 * s), 30 * s);
    }

    /// A step that fails for ten minutes logs its first failure, one line per
    /// [`LOG_EVERY`], and its recovery — not a line per try.
    #[tokio::test(start_paused = true)]
    async fn a_long_outage_logs_once_per_interval_not_per_try() {
        let mut o = Outage::new("test");
        assert!(!o.failing());
        let mut tries = 0;
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(600) {
            let wait = o.failed(&"down");
            assert!(wait <= LONGEST_WAIT);
            tries += 1;
            tokio::time::sleep(wait).await;
        }
        assert!(o.failing());
        // 200 ms, 400 ms … then every 5 s: some 125 tries in ten minutes.
        assert!((110..=130).contains(&tries), "{tries} tries");
        // The first failure, then one line per 30 s.
        assert_eq!(o.lines(), 20);
        o.ok();
        assert_eq!(o.lines(), 21, "one line when it works again");
        assert!(!o.failing());
        o.ok();
        assert_eq!(o.lines(), 21, "nothing to say while it works");
    }
}
