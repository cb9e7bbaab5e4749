//! How the periodic services (scheduler, reaper and sweeps, adopter, janitor, heartbeat) live
//! through a server outage: they back off instead of retrying every few milliseconds, and say
//! so once — the first failure, then at most one line every [`LOG_EVERY`], and one line when
//! the service works again — instead of a line per try.

use std::fmt::Display;
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// At most one "still failing" line this often.
pub(crate) const LOG_EVERY: Duration = Duration::from_secs(30);
const FIRST_WAIT: Duration = Duration::from_millis(200);
const LONGEST_WAIT: Duration = Duration::from_secs(5);

pub(crate) struct Outage {
    what: &'static str,
    failures: u32,
    since: Option<Instant>,
    last_log: Option<Instant>,
}

impl Outage {
    pub fn new(what: &'static str) -> Outage {
        Outage {
            what,
            failures: 0,
            since: None,
            last_log: None,
        }
    }

    /// Records a failed round; returns how long to wait before the next try (doubling from
    /// 200 ms to 5 s).
    pub fn failed(&mut self, cause: &dyn Display) -> Duration {
        self.failures += 1;
        let now = Instant::now();
        let since = *self.since.get_or_insert(now);
        if self.last_log.is_none_or(|t| now - t >= LOG_EVERY) {
            self.last_log = Some(now);
            if self.failures == 1 {
                warn!(service = self.what, %cause, "failed; backing off until it works again");
            } else {
                warn!(service = self.what, %cause, failures = self.failures,
                      failing_for = ?(now - since), "still failing");
            }
        }
        backoff(self.failures)
    }

    /// Records a round that worked; says so when it ends a run of failures.
    pub fn ok(&mut self) {
        if self.failures > 0 {
            info!(service = self.what, failures = self.failures,
                  after = ?self.since.map(|s| s.elapsed()), "works again");
        }
        self.failures = 0;
        self.since = None;
        self.last_log = None;
    }

    /// Is the service in a run of failures?
    pub fn failing(&self) -> bool {
        self.failures > 0
    }
}

/// Wait after `n` consecutive failures.
pub(crate) fn backoff(n: u32) -> Duration {
    FIRST_WAIT
        .saturating_mul(1u32 << n.saturating_sub(1).min(16))
        .min(LONGEST_WAIT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_up_to_five_seconds() {
        assert_eq!(backoff(1), Duration::from_millis(200));
        assert_eq!(backoff(2), Duration::from_millis(400));
        assert_eq!(backoff(5), Duration::from_millis(3200));
        assert_eq!(backoff(6), Duration::from_secs(5));
        assert_eq!(backoff(60), Duration::from_secs(5));
        let mut o = Outage::new("test");
        assert!(!o.failing());
        o.failed(&"down");
        assert!(o.failing());
        o.ok();
        assert!(!o.failing());
    }
}
