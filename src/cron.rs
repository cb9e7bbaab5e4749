//! Cron schedules (`[cron.<name>]` in the configuration): parsing, the fires between two
//! instants in the schedule's time zone, and the missed-fire policy. Pure logic; the
//! worker's `cron` service enqueues the fires (see `src/worker/cron.rs`).

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;
use serde::{Deserialize, Serialize};
use std::time::Duration;

use crate::contract::Priority;

/// Fires later than this (the workers were all down, or the database was) are *missed*:
/// the schedule's `missed` policy decides what becomes of them.
pub const MISSED_AFTER: Duration = Duration::from_secs(30);

/// What to do with fires missed while no worker could enqueue them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Missed {
    /// Drop them; the next regular fire runs (the default).
    #[default]
    Skip,
    /// Run once for all of them (the latest missed fire), then go on.
    RunOnce,
}

/// One named schedule, as configured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CronConfig {
    /// 5 fields (minute hour day month weekday), or 6 with seconds first.
    pub schedule: CronExpr,
    /// An IANA time zone name; UTC by default.
    #[serde(default)]
    pub timezone: TimeZone,
    pub queue: String,
    /// The payload of every fire's job (a table); empty by default.
    #[serde(default = "empty_object")]
    pub payload: serde_json::Value,
    #[serde(default)]
    pub priority: Priority,
    #[serde(default)]
    pub missed: Missed,
    /// A fire not started this long after its time never runs (it ends `cancelled` as
    /// expired), e.g. "10m"; none by default (the queue's `expire_after` then applies).
    #[serde(default, with = "humantime_serde")]
    pub expires_in: Option<Duration>,
    /// The key of every fire's job (what groups it with others, e.g. "reports"), checked by
    /// the job contract at load; none by default.
    #[serde(default)]
    pub key: Option<String>,
}

fn empty_object() -> serde_json::Value {
    serde_json::json!({})
}

/// A cron expression, parsed once (when the configuration loads), kept with its text.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct CronExpr {
    text: String,
    cron: Cron,
}

impl CronExpr {
    pub fn cron(&self) -> &Cron {
        &self.cron
    }
}

impl PartialEq for CronExpr {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

impl std::str::FromStr for CronExpr {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let cron = parse_expression(text).map_err(|e| {
            format!(
                "{text:?} does not parse ({e}): use 5 fields (minute hour day month weekday) \
                 or 6 with seconds first, e.g. \"0 3 * * *\" or \"*/10 * * * * *\""
            )
        })?;
        Ok(CronExpr {
            text: text.to_string(),
            cron,
        })
    }
}

impl std::fmt::Display for CronExpr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

text_form!(CronExpr, TimeZone);

/// An IANA time zone, by name (`"Europe/Berlin"`); UTC by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TimeZone(pub Tz);

impl Default for TimeZone {
    fn default() -> Self {
        TimeZone(Tz::UTC)
    }
}

impl std::str::FromStr for TimeZone {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        text.parse::<Tz>().map(TimeZone).map_err(|_| {
            format!(
                "{text:?} is not a known time zone: use an IANA name such as \
                 \"Europe/Berlin\", \"America/New_York\" or \"UTC\""
            )
        })
    }
}

impl std::fmt::Display for TimeZone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0.name())
    }
}

/// A parsed schedule.
#[derive(Debug, Clone)]
pub struct Schedule {
    pub name: String,
    pub cron: Cron,
    pub tz: Tz,
    pub config: CronConfig,
}

/// Parses a cron expression: 5 fields, or 6 with seconds first.
pub fn parse_expression(expr: &str) -> Result<Cron, String> {
    CronParser::builder()
        .seconds(Seconds::Optional)
        .year(Year::Disallowed)
        .build()
        .parse(expr)
        .map_err(|e| e.to_string())
}

impl Schedule {
    /// A configured schedule (its expression and time zone parsed at load), once the job
    /// contract accepts the jobs it enqueues; every problem is named with its field and the
    /// right form.
    pub fn new(name: &str, c: &CronConfig) -> Result<Schedule, Vec<String>> {
        let mut errs = Vec::new();
        // Every fire is a job: the job contract judges it as it judges every other door's.
        let mut spec = serde_json::Map::new();
        spec.insert("queue".into(), c.queue.clone().into());
        spec.insert("payload".into(), c.payload.clone());
        spec.insert("priority".into(), c.priority.get().into());
        spec.insert("id".into(), fire_id(name, Utc::now()).into());
        if let Some(e) = c.expires_in {
            spec.insert("expires_in".into(), format!("{}ns", e.as_nanos()).into());
        }
        if let Some(k) = &c.key {
            spec.insert("key".into(), k.clone().into());
        }
        if let Err(e) = crate::contract::check_spec(&spec, crate::contract::Door::Enqueue, None) {
            errs.push(match e.field() {
                "id" => format!(
                    "cron.{name}: the name makes job ids the contract refuses ({e}); keep it \
                     under 100 characters, without spaces, / ? or #"
                ),
                "payload" => format!(
                    "cron.{name}.payload: {e}; it must be a table, e.g. payload = {{ report = \"daily\" }}"
                ),
                field => format!("cron.{name}.{field}: {e}"),
            });
        }
        if !errs.is_empty() {
            return Err(errs);
        }
        Ok(Schedule {
            name: name.to_string(),
            cron: c.schedule.cron().clone(),
            tz: c.timezone.0,
            config: c.clone(),
        })
    }

    /// The fires after `after` up to and including `upto`, oldest first (at most `limit`).
    pub fn fires_between(
        &self,
        after: DateTime<Utc>,
        upto: DateTime<Utc>,
        limit: usize,
    ) -> Vec<DateTime<Utc>> {
        self.fires_from(after, false, upto, limit)
    }

    /// The fires from `from` (itself too when `inclusive`) up to and including `upto`.
    fn fires_from(
        &self,
        from: DateTime<Utc>,
        inclusive: bool,
        upto: DateTime<Utc>,
        limit: usize,
    ) -> Vec<DateTime<Utc>> {
        let mut out = Vec::new();
        let mut from = from.with_timezone(&self.tz);
        let mut inclusive = inclusive;
        while out.len() < limit {
            let Ok(next) = self.cron.find_next_occurrence(&from, inclusive) else {
                break;
            };
            inclusive = false;
            let at = next.with_timezone(&Utc);
            if at > upto {
                break;
            }
            out.push(at);
            from = next;
        }
        out
    }

    /// The next `n` fires after `after`.
    pub fn next_fires(&self, after: DateTime<Utc>, n: usize) -> Vec<DateTime<Utc>> {
        let mut out = Vec::new();
        let mut from = after.with_timezone(&self.tz);
        while out.len() < n {
            let Ok(next) = self.cron.find_next_occurrence(&from, false) else {
                break;
            };
            out.push(next.with_timezone(&Utc));
            from = next;
        }
        out
    }
}

/// The job id of a schedule's fire: the same for every worker, so a fire is one job.
pub fn fire_id(name: &str, at: DateTime<Utc>) -> String {
    format!("cron:{name}:{}", at.format("%Y-%m-%dT%H:%M:%SZ"))
}

/// What one tick of a schedule enqueues: the fires due since `last`, by the missed-fire
/// policy, and the newest fire it looked at (the schedule's new `last_fire_at`).
#[derive(Debug, Clone, PartialEq)]
pub struct Due {
    pub fires: Vec<DateTime<Utc>>,
    pub newest: Option<DateTime<Utc>>,
}

impl Schedule {
    /// The fires to enqueue after `last` up to `now`. Fires older than [`MISSED_AFTER`] are
    /// missed: never enumerated (a schedule of every second after a day of downtime has
    /// 86,400 of them), only the latest is found, and run once or skipped by the policy.
    /// Fires on time (at most `limit`) are all enqueued.
    pub fn due(&self, last: DateTime<Utc>, now: DateTime<Utc>, limit: usize) -> Due {
        let grace = chrono::Duration::from_std(MISSED_AFTER).expect("a small duration");
        let cutoff = now - grace;
        let mut fires = Vec::new();
        let mut newest = None;
        if last < cutoff {
            // The latest fire strictly before the cutoff, if it is after `last`.
            let missed = self
                .cron
                .find_previous_occurrence(&cutoff.with_timezone(&self.tz), false)
                .ok()
                .map(|t| t.with_timezone(&Utc))
                .filter(|t| *t > last);
            if let Some(m) = missed {
                newest = Some(m);
                if self.config.missed == Missed::RunOnce {
                    fires.push(m);
                }
            }
        }
        // On time: from the cutoff on (inclusive), or from `last` on (exclusive).
        let on_time = if last < cutoff {
            self.fires_from(cutoff, true, now, limit)
        } else {
            self.fires_between(last, now, limit)
        };
        if let Some(n) = on_time.last() {
            newest = Some(*n);
        }
        fires.extend(on_time);
        Due { fires, newest }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn cfg(schedule: &str, tz: &str) -> CronConfig {
        CronConfig {
            schedule: schedule.parse().unwrap(),
            timezone: tz.parse().unwrap(),
            queue: "reports".into(),
            payload: empty_object(),
            priority: Priority::new(5).unwrap(),
            missed: Missed::Skip,
            expires_in: None,
            key: None,
        }
    }

    #[test]
    fn five_and_six_field_schedules_fire_in_their_time_zone() {
        let s = Schedule::new("nightly", &cfg("0 3 * * *", "Europe/Berlin")).unwrap();
        // 2026-01-10 00:00 UTC → the next 03:00 in Berlin (UTC+1) is 02:00 UTC.
        let from = Utc.with_ymd_and_hms(2026, 1, 10, 0, 0, 0).unwrap();
        assert_eq!(
            s.next_fires(from, 1),
            vec![Utc.with_ymd_and_hms(2026, 1, 10, 2, 0, 0).unwrap()]
        );
        let every2 = Schedule::new("tick", &cfg("*/2 * * * * *", "UTC")).unwrap();
        let fires = every2.fires_between(from, from + chrono::Duration::seconds(6), 100);
        assert_eq!(fires.len(), 3);
        assert_eq!(fires[0], from + chrono::Duration::seconds(2));
    }

    #[test]
    fn bad_schedules_name_the_field_and_the_right_form() {
        let e = "every day".parse::<CronExpr>().unwrap_err();
        assert!(e.starts_with("\"every day\" does not parse"), "{e}");
        assert!(e.contains("\"0 3 * * *\""), "{e}");
        let e = "Europe/Berln".parse::<super::TimeZone>().unwrap_err();
        assert!(
            e.starts_with("\"Europe/Berln\" is not a known time zone"),
            "{e}"
        );
        assert_eq!(
            String::from("0 3 * * *".parse::<CronExpr>().unwrap()),
            "0 3 * * *"
        );
        assert_eq!(
            String::from("Europe/Berlin".parse::<super::TimeZone>().unwrap()),
            "Europe/Berlin"
        );
        let e = Priority::new(12).unwrap_err();
        assert_eq!(e, "12 is not a whole number from 0 to 9");
        let mut c = cfg("* * * * *", "UTC");
        c.queue = "bad queue".into();
        let all = Schedule::new("y", &c).unwrap_err().join("\n");
        assert!(all.contains("cron.y.queue: field `queue`"), "{all}");
        let all = Schedule::new("with space", &cfg("* * * * *", "UTC"))
            .unwrap_err()
            .join("\n");
        assert!(
            all.contains("cron.with space: the name makes job ids"),
            "{all}"
        );
    }

    #[test]
    fn missed_fires_are_skipped_or_run_once() {
        let now = Utc.with_ymd_and_hms(2026, 1, 10, 12, 0, 0).unwrap();
        let mut c = cfg("*/10 * * * * *", "UTC");
        let skip = Schedule::new("s", &c).unwrap();
        c.missed = Missed::RunOnce;
        let once = Schedule::new("o", &c).unwrap();
        let last = now - chrono::Duration::seconds(600);
        let on_time: Vec<_> = [30, 20, 10, 0]
            .iter()
            .map(|s| now - chrono::Duration::seconds(*s))
            .collect();
        let d = skip.due(last, now, 1000);
        assert_eq!(d.fires, on_time);
        assert_eq!(d.newest, Some(now));
        let d = once.due(last, now, 1000);
        let mut want = vec![now - chrono::Duration::seconds(40)];
        want.extend(on_time.clone());
        assert_eq!(d.fires, want);
        // Nothing missed: all on time, none twice.
        let d = once.due(now - chrono::Duration::seconds(15), now, 1000);
        assert_eq!(d.fires, on_time[2..].to_vec());
    }

    #[test]
    fn a_long_downtime_runs_a_run_once_schedule_once_not_once_per_thousand_fires() {
        let now = Utc.with_ymd_and_hms(2026, 1, 10, 12, 0, 0).unwrap();
        let mut c = cfg("* * * * * *", "UTC");
        c.missed = Missed::RunOnce;
        let every_second = Schedule::new("tick", &c).unwrap();
        // Two days down: 172,800 fires missed.
        let last = now - chrono::Duration::days(2);
        let d = every_second.due(last, now, 1000);
        let grace = chrono::Duration::from_std(MISSED_AFTER).unwrap();
        let missed: Vec<_> = d.fires.iter().filter(|f| now - **f > grace).collect();
        assert_eq!(missed.len(), 1, "{:?}", &d.fires[..3]);
        assert_eq!(
            d.fires.len(),
            1 + 31,
            "one missed run and the last 31 s on time"
        );
        assert_eq!(d.newest, Some(now));
        // The next tick, a second later, finds only the new fire.
        let next = every_second.due(now, now + chrono::Duration::seconds(1), 1000);
        assert_eq!(next.fires, vec![now + chrono::Duration::seconds(1)]);
    }

    #[test]
    fn fire_ids_are_the_same_on_every_worker() {
        let at = Utc.with_ymd_and_hms(2026, 1, 10, 2, 0, 0).unwrap();
        assert_eq!(fire_id("nightly", at), "cron:nightly:2026-01-10T02:00:00Z");
    }

    #[test]
    fn a_schedule_without_time_zone_or_priority_fires_in_utc_at_the_default_priority() {
        let c: CronConfig =
            toml::from_str("schedule = \"0 3 * * *\"\nqueue = \"reports\"").unwrap();
        assert_eq!(c.timezone.0, Tz::UTC);
        assert_eq!(c.priority.get(), crate::job::DEFAULT_PRIORITY);
        assert_eq!(c.payload, serde_json::json!({}));
        assert_eq!(c.missed, Missed::Skip);
        let s = Schedule::new("nightly", &c).unwrap();
        let from = Utc.with_ymd_and_hms(2026, 7, 10, 0, 0, 0).unwrap();
        assert_eq!(
            s.next_fires(from, 1),
            vec![Utc.with_ymd_and_hms(2026, 7, 10, 3, 0, 0).unwrap()]
        );
    }

    #[test]
    fn fires_between_two_instants_stop_at_the_limit() {
        let every2 = Schedule::new("tick", &cfg("*/2 * * * * *", "UTC")).unwrap();
        let from = Utc.with_ymd_and_hms(2026, 1, 10, 0, 0, 0).unwrap();
        let upto = from + chrono::Duration::seconds(60);
        assert_eq!(every2.fires_between(from, upto, 2).len(), 2);
        assert!(every2.fires_between(from, upto, 0).is_empty());
        assert_eq!(every2.fires_between(from, upto, 1000).len(), 30);
    }

    #[test]
    fn the_last_fire_enqueued_is_never_enqueued_again_whatever_the_policy() {
        // `last` is the newest fire a tick looked at; a tick that comes exactly when it
        // is MISSED_AFTER old, or later, must not hand it out a second time.
        let now = Utc.with_ymd_and_hms(2026, 1, 10, 12, 0, 0).unwrap();
        let s = |n| now - chrono::Duration::seconds(n);
        for missed in [Missed::Skip, Missed::RunOnce] {
            let mut c = cfg("*/10 * * * * *", "UTC");
            c.missed = missed;
            let every10 = Schedule::new("t", &c).unwrap();
            // `last` exactly at the cutoff: everything after it is on time.
            let d = every10.due(s(30), now, 1000);
            assert_eq!(d.fires, vec![s(20), s(10), now], "{missed:?}");
            // `last` the latest fire before the cutoff: nothing was missed.
            let d = every10.due(s(40), now, 1000);
            assert_eq!(d.fires, vec![s(30), s(20), s(10), now], "{missed:?}");
            assert_eq!(d.newest, Some(now));
        }
    }
}
