//! Presentation: what an operator reads about jobs, workers, queues and pipelines, in the CLI
//! and on the dashboard alike. Plain data made from the store's rows ([`JobView`]), the text
//! tables the CLI prints, and the one place durations are put into words. No I/O, and no
//! HTML: the dashboard's templates escape whatever they are given.

mod job;
mod tables;

pub use job::{format_job, pretty, AttemptView, JobView, WorkerLine};
pub use tables::{format_paused, format_pipeline, format_stats, format_unserved, format_workers};

/// A duration for a page or a sentence: `35 ms`, `1.2 s`, `4 min`, `3 h`, `2 d`; `–` for none.
pub fn secs(v: Option<f64>) -> String {
    match v {
        None => "–".into(),
        Some(s) if s < 1.0 => format!("{:.0} ms", s * 1000.0),
        Some(s) if s < 120.0 => format!("{s:.1} s"),
        Some(s) if s < 7200.0 => format!("{:.0} min", s / 60.0),
        Some(s) if s < 172_800.0 => format!("{:.0} h", s / 3600.0),
        Some(s) => format!("{:.0} d", s / 86400.0),
    }
}

/// A duration for a column of an aligned text table: `42s`, `17m`, `5h`, `3d` (never
/// negative; a clock a little ahead of PostgreSQL's says `0s`).
pub fn ago(secs: f64) -> String {
    let s = secs.max(0.0);
    if s < 100.0 {
        format!("{s:.0}s")
    } else if s < 6000.0 {
        format!("{:.0}m", s / 60.0)
    } else if s < 48.0 * 3600.0 {
        format!("{:.0}h", s / 3600.0)
    } else {
        format!("{:.0}d", s / 86400.0)
    }
}

/// Characters of a result a pipeline's table shows (the CLI's and the dashboard's).
pub const RESULT_SHOWN: usize = 120;

/// `text` cut to `max` characters, with `…` when it was longer.
pub fn cut(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text.to_string(),
        Some((at, _)) => format!("{}…", &text[..at]),
    }
}

/// A point in time to the second, RFC 3339 in UTC (`2026-11-26T03:00:00Z`).
pub fn utc(t: chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_well() {
        assert_eq!(secs(None), "–");
        assert_eq!(secs(Some(0.035)), "35 ms");
        assert_eq!(secs(Some(4.25)), "4.2 s");
        assert_eq!(secs(Some(600.0)), "10 min");
        assert_eq!(secs(Some(3.0 * 86400.0)), "3 d");
        assert_eq!(ago(-1.0), "0s");
        assert_eq!(ago(1020.0), "17m");
        assert_eq!(ago(3.0 * 86400.0), "3d");
    }
}
