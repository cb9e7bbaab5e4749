//! Cron schedules (`[cron.<name>]` in the configuration): parsing, the fires between two
//! instants in the schedule's time zone, and the missed-fire policy. Pure logic; the
//! worker's `cron` service enqueues the fires (see `src/worker/cron.rs`).

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;
use serde::{Deserialize, Serialize};
use std::time::Duration;

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
    pub schedule: String,
    /// An IANA time zone name; UTC by default.
    #[serde(default = "utc")]
    pub timezone: String,
    pub queue: String,
    /// The payload of every fire's job (a table); empty by default.
    #[serde(default = "empty_object")]
    pub payload: serde_json::Value,
    #[serde(default = "default_priority")]
    pub priority: i16,
    #[serde(default)]
    pub missed: Missed,
}

fn utc() -> String {
    "UTC".into()
}

fn empty_object() -> serde_json::Value {
    serde_json::json!({})
}

fn default_priority() -> i16 {
    crate::job::DEFAULT_PRIORITY
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
    /// Parses and checks a configured schedule; every problem is named with its field and
    /// the right form.
    pub fn new(name: &str, c: &CronConfig) -> Result<Schedule, Vec<String>> {
        let mut errs = Vec::new();
        let cron = parse_expression(&c.schedule)
            .map_err(|e| {
                errs.push(format!(
                    "cron.{name}.schedule {:?} does not parse ({e}): use 5 fields (minute hour \
                     day month weekday) or 6 with seconds first, e.g. \"0 3 * * *\" or \
                     \"*/10 * * * * *\"",
                    c.schedule
                ))
            })
            .ok();
        let tz = c
            .timezone
            .parse::<Tz>()
            .map_err(|_| {
                errs.push(format!(
                    "cron.{name}.timezone {:?} is not a known time zone: use an IANA name such \
                     as \"Europe/Berlin\", \"America/New_York\" or \"UTC\"",
                    c.timezone
                ))
            })
            .ok();
        if let Err(e) = crate::job::validate_queue_name(&c.queue) {
            errs.push(format!("cron.{name}.queue: {e}"));
        }
        if !c.payload.is_object() {
            errs.push(format!(
                "cron.{name}.payload must be a table, e.g. payload = {{ report = \"daily\" }}"
            ));
        }
        if !(0..=9).contains(&c.priority) {
            errs.push(format!(
                "cron.{name}.priority ({}) must be from 0 (first) to 9 (last)",
                c.priority
            ));
        }
        if crate::job::validate_id(&fire_id(name, Utc::now())).is_err() {
            errs.push(format!(
                "cron.{name}: the name is too long (keep it under 100 characters)"
            ));
        }
        match (cron, tz) {
            (Some(cron), Some(tz)) if errs.is_empty() => Ok(Schedule {
                name: name.to_string(),
                cron,
                tz,
                config: c.clone(),
            }),
            _ => Err(errs),
        }
    }

    /// The fires after `after` up to and including `upto`, oldest first (at most `limit`).
    pub fn fires_between(
        &self,
        after: DateTime<Utc>,
        upto: DateTime<Utc>,
        limit: usize,
    ) -> Vec<DateTime<Utc>> {
        let mut out = Vec::new();
        let mut from = after.with_timezone(&self.tz);
        while out.len() < limit {
            let Ok(next) = self.cron.find_next_occurrence(&from, false) else {
                break;
            };
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

/// Which of `fires` (oldest first, all at or before `now`) to enqueue: those on time, and
/// for the missed ones (older than [`MISSED_AFTER`]) what the policy says.
pub fn plan(fires: &[DateTime<Utc>], now: DateTime<Utc>, missed: Missed) -> Vec<DateTime<Utc>> {
    let grace = chrono::Duration::from_std(MISSED_AFTER).expect("a small duration");
    let (late, on_time): (Vec<DateTime<Utc>>, Vec<DateTime<Utc>>) =
        fires.iter().partition(|f| now - **f > grace);
    let mut out = Vec::new();
    if missed == Missed::RunOnce {
        out.extend(late.last().copied());
    }
    out.extend(on_time);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn cfg(schedule: &str, tz: &str) -> CronConfig {
        CronConfig {
            schedule: schedule.into(),
            timezone: tz.into(),
            queue: "reports".into(),
            payload: empty_object(),
            priority: 5,
            missed: Missed::Skip,
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
        let errs = Schedule::new("x", &cfg("every day", "Europe/Berln")).unwrap_err();
        let all = errs.join("\n");
        assert!(
            all.contains("cron.x.schedule \"every day\" does not parse"),
            "{all}"
        );
        assert!(all.contains("\"0 3 * * *\""), "{all}");
        assert!(
            all.contains("cron.x.timezone \"Europe/Berln\" is not a known time zone"),
            "{all}"
        );
        let mut c = cfg("* * * * *", "UTC");
        c.priority = 12;
        c.queue = "bad queue".into();
        let all = Schedule::new("y", &c).unwrap_err().join("\n");
        assert!(all.contains("cron.y.priority (12)"), "{all}");
        assert!(all.contains("cron.y.queue"), "{all}");
    }

    #[test]
    fn missed_fires_are_skipped_or_run_once() {
        let now = Utc.with_ymd_and_hms(2026, 1, 10, 12, 0, 0).unwrap();
        let fires: Vec<_> = [600, 300, 120, 10, 0]
            .iter()
            .map(|s| now - chrono::Duration::seconds(*s))
            .collect();
        assert_eq!(plan(&fires, now, Missed::Skip), fires[3..].to_vec());
        let once = plan(&fires, now, Missed::RunOnce);
        assert_eq!(once, vec![fires[2], fires[3], fires[4]]);
    }

    #[test]
    fn fire_ids_are_the_same_on_every_worker() {
        let at = Utc.with_ymd_and_hms(2026, 1, 10, 2, 0, 0).unwrap();
        assert_eq!(fire_id("nightly", at), "cron:nightly:2026-01-10T02:00:00Z");
    }
}
