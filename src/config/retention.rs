//! `[retention]`: how long finished jobs and other finished rows are kept before the pruner
//! (`worker::pruner`) deletes them, with per-queue overrides in `[queues.<name>]`. The
//! settings become a [`Policy`] here, once; the pruner and `jobwarden prune` read only that.

use super::values::KeepFor;
use super::Config;
use serde::{Deserialize, Serialize};
use std::time::Duration;

pub const DEFAULT_KEEP_COMPLETED: KeepFor = KeepFor(Duration::from_secs(7 * 24 * 3600));
pub const DEFAULT_KEEP_CANCELLED: KeepFor = KeepFor(Duration::from_secs(7 * 24 * 3600));
pub const DEFAULT_KEEP_DEAD: KeepFor = KeepFor(Duration::from_secs(30 * 24 * 3600));
pub const DEFAULT_KEEP_WORKERS: KeepFor = KeepFor(Duration::from_secs(7 * 24 * 3600));
pub const DEFAULT_PRUNE_BATCH: i64 = 1000;
pub const MAX_PRUNE_BATCH: i64 = 100_000;
pub const DEFAULT_PRUNE_PAUSE: Duration = Duration::from_millis(100);
pub const DEFAULT_PRUNE_EVERY: Duration = Duration::from_secs(60);

/// The finished statuses, in the order a round prunes them.
pub const FINISHED: [&str; 3] = ["completed", "cancelled", "dead"];

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetentionConfig {
    /// Off: nothing is pruned (operators who must keep history).
    pub enabled: bool,
    pub keep_completed: KeepFor,
    pub keep_cancelled: KeepFor,
    pub keep_dead: KeepFor,
    /// At most this many finished jobs kept per queue, newest first (none by default).
    pub keep_count: Option<i64>,
    /// Rows of stopped workers.
    pub keep_workers: KeepFor,
    /// Rows per delete statement.
    pub batch: i64,
    /// Between two batches.
    #[serde(with = "humantime_serde")]
    pub pause: Duration,
    /// How often a round starts.
    #[serde(with = "humantime_serde")]
    pub every: Duration,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        RetentionConfig {
            enabled: true,
            keep_completed: DEFAULT_KEEP_COMPLETED,
            keep_cancelled: DEFAULT_KEEP_CANCELLED,
            keep_dead: DEFAULT_KEEP_DEAD,
            keep_count: None,
            keep_workers: DEFAULT_KEEP_WORKERS,
            batch: DEFAULT_PRUNE_BATCH,
            pause: DEFAULT_PRUNE_PAUSE,
            every: DEFAULT_PRUNE_EVERY,
        }
    }
}

/// One queue's keep for one status, where it differs from (or may differ from) the default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueKeep {
    pub queue: String,
    pub status: &'static str,
    pub keep: Duration,
}

/// What the pruner deletes, decided once from the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Per finished status, how long jobs of queues without an override are kept.
    pub defaults: Vec<(&'static str, Duration)>,
    /// Every status of every queue with an override (its effective keep for each).
    pub overrides: Vec<QueueKeep>,
    /// Queues with a keep_count, and the count.
    pub counts: Vec<(String, i64)>,
    pub keep_dead: Duration,
    pub keep_workers: Duration,
    pub batch: i64,
    pub pause: Duration,
    pub every: Duration,
}

impl Policy {
    /// How long jobs of `status` of queues without an override are kept.
    pub fn default_keep(&self, status: &str) -> Duration {
        self.defaults
            .iter()
            .find(|(s, _)| *s == status)
            .map_or(DEFAULT_KEEP_DEAD.0, |(_, d)| *d)
    }
}

impl Config {
    /// The retention policy, or `None` when retention is off.
    pub fn retention_policy(&self) -> Option<Policy> {
        let r = &self.retention;
        if !r.enabled {
            return None;
        }
        let defaults = vec![
            ("completed", r.keep_completed.0),
            ("cancelled", r.keep_cancelled.0),
            ("dead", r.keep_dead.0),
        ];
        let mut overrides = Vec::new();
        let mut counts = Vec::new();
        for (name, q) in &self.queues {
            let own = [
                ("completed", q.keep_completed),
                ("cancelled", q.keep_cancelled),
                ("dead", q.keep_dead),
            ];
            if own.iter().any(|(_, k)| k.is_some()) {
                for ((status, k), (_, default)) in own.into_iter().zip(&defaults) {
                    overrides.push(QueueKeep {
                        queue: name.clone(),
                        status,
                        keep: k.map_or(*default, |k| k.0),
                    });
                }
            }
            if let Some(n) = q.keep_count.or(r.keep_count) {
                counts.push((name.clone(), n));
            }
        }
        Some(Policy {
            defaults,
            overrides,
            counts,
            keep_dead: r.keep_dead.0,
            keep_workers: r.keep_workers.0,
            batch: r.batch,
            pause: r.pause,
            every: r.every,
        })
    }

    /// The rules of `[retention]` and the queues' keep settings serde cannot express.
    pub(super) fn check_retention(&self, errs: &mut Vec<String>) {
        let r = &self.retention;
        let mut counts = vec![("retention.keep_count".to_string(), r.keep_count)];
        for (name, q) in &self.queues {
            counts.push((format!("queues.{name}.keep_count"), q.keep_count));
        }
        for (setting, n) in counts {
            if let Some(n) = n.filter(|&n| n < 1) {
                errs.push(format!(
                    "{setting} ({n}) must be at least 1: it is how many finished jobs a queue \
                     keeps, newest first (leave it out for no cap), e.g. keep_count = 100000"
                ));
            }
        }
        if !(1..=MAX_PRUNE_BATCH).contains(&r.batch) {
            errs.push(format!(
                "retention.batch ({}) must be from 1 to {MAX_PRUNE_BATCH} rows per delete, \
                 e.g. batch = {DEFAULT_PRUNE_BATCH}",
                r.batch
            ));
        }
        if r.every < Duration::from_secs(1) {
            errs.push(format!(
                "retention.every ({}) must be at least 1s, e.g. every = \"1m\"",
                super::fmt_dur(r.every)
            ));
        }
        if r.pause > Duration::from_secs(60) {
            errs.push(format!(
                "retention.pause ({}) must be at most 1m, e.g. pause = \"100ms\"",
                super::fmt_dur(r.pause)
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HANDLER: &str = "[handler]\nkind = \"rust\"\nname = \"noop\"\n";

    fn policy(toml: &str) -> Option<Policy> {
        Config::from_toml(&format!("{HANDLER}{toml}"))
            .unwrap()
            .retention_policy()
    }

    #[test]
    fn the_defaults_keep_a_week_and_dead_jobs_a_month() {
        let p = policy("[queues.email]\n").unwrap();
        assert_eq!(p.default_keep("completed"), Duration::from_secs(7 * 86400));
        assert_eq!(p.default_keep("cancelled"), Duration::from_secs(7 * 86400));
        assert_eq!(p.default_keep("dead"), Duration::from_secs(30 * 86400));
        assert!(p.overrides.is_empty() && p.counts.is_empty());
        assert_eq!((p.batch, p.every), (1000, Duration::from_secs(60)));
        assert!(policy("[retention]\nenabled = false\n[queues.email]\n").is_none());
    }

    #[test]
    fn a_queue_override_wins_and_fills_its_other_statuses_from_the_defaults() {
        let p = policy(
            "[retention]\nkeep_dead = \"60d\"\nkeep_count = 10\n\
             [queues.email]\nkeep_completed = \"2h\"\n[queues.pdf]\nkeep_count = 5\n",
        )
        .unwrap();
        let email: Vec<_> = p.overrides.iter().filter(|o| o.queue == "email").collect();
        assert_eq!(email.len(), 3);
        assert_eq!(email[0].keep, Duration::from_secs(7200));
        assert_eq!(email[2].keep, Duration::from_secs(60 * 86400));
        assert!(p.overrides.iter().all(|o| o.queue != "pdf"));
        assert_eq!(p.counts, vec![("email".into(), 10), ("pdf".into(), 5)]);
    }

    #[test]
    fn a_bad_age_or_count_is_refused_naming_the_setting_the_value_and_the_fix() {
        for (toml, words) in [
            (
                "[retention]\nkeep_dead = \"a month\"\n",
                &[
                    "retention.keep_dead",
                    "\"a month\" is not an age",
                    "\"30d\"",
                ][..],
            ),
            (
                "[retention]\nkeep_completed = \"0s\"\n",
                &["retention.keep_completed", "\"0s\" is shorter than 1h"],
            ),
            (
                "[retention]\nkeep_count = 0\n",
                &[
                    "retention.keep_count (0) must be at least 1",
                    "keep_count = 100000",
                ],
            ),
            (
                "[queues.email]\nkeep_count = -5\n",
                &["queues.email.keep_count (-5) must be at least 1"],
            ),
            (
                "[queues.email]\nkeep_cancelled = \"soon\"\n",
                &["queues.email.keep_cancelled", "\"soon\" is not an age"],
            ),
            (
                "[retention]\nbatch = 0\n",
                &["retention.batch (0) must be from 1"],
            ),
        ] {
            let toml = if toml.contains("[queues.") {
                format!("{HANDLER}{toml}")
            } else {
                format!("{HANDLER}{toml}[queues.email]\n")
            };
            let e = Config::from_toml(&toml).unwrap_err().to_string();
            for w in words {
                assert!(e.contains(w), "{toml}: {e} lacks {w}");
            }
        }
    }
}
