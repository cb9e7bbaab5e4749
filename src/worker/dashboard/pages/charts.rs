//! `/charts`: the last hour (per minute) or the last 24 hours (per hour) of each queue as
//! three small bar charts — jobs completed, attempts failed, and the wait before a job's
//! last attempt (95th percentile) — drawn on the server as inline SVG from the rollup
//! (`job_rollup`), so a page costs a few rows per queue whatever the history holds.

use super::super::auth::Viewer;
use super::super::layout::{failed, more_link, page as layout};
use super::super::{q, PAGE};
use crate::store::SeriesPoint;
use crate::view::secs;
use crate::worker::Shared;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::{html, Markup};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// A chart's size (CSS pixels).
const WIDTH: f64 = 300.0;
const HEIGHT: f64 = 56.0;

/// The ranges a visitor can pick: (query value, label, bucket in seconds, buckets).
const RANGES: [(&str, &str, f64, usize); 2] = [
    ("1h", "last hour, per minute", 60.0, 60),
    ("24h", "last 24 hours, per hour", 3600.0, 24),
];

/// One queue's series, a value per bucket (oldest first).
#[derive(Debug, Default, PartialEq)]
struct Series {
    completed: Vec<f64>,
    failed: Vec<f64>,
    wait_p95: Vec<f64>,
}

pub(crate) async fn page(
    viewer: Viewer,
    State(shared): State<Arc<Shared>>,
    Query(p): Query<HashMap<String, String>>,
) -> Response {
    let range = p.get("range").map(String::as_str).unwrap_or("1h");
    let Some(&(key, label, step, n)) = RANGES.iter().find(|r| r.0 == range) else {
        return (
            StatusCode::BAD_REQUEST,
            format!(
                "range {:?} is not one the charts know: use range=1h or range=24h",
                range.chars().take(40).collect::<String>()
            ),
        )
            .into_response();
    };
    let after = p.get("after").cloned().unwrap_or_default();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    let first = first_bucket(now, step, n);
    let points = match shared
        .store
        .rollup_series(step > 60.0, first, &after, PAGE)
        .await
    {
        Ok(p) => p,
        Err(e) => return failed(e),
    };
    let queues = series(&points, first, step, n);
    let next = queues
        .keys()
        .last()
        .map(|q_| format!("/charts?range={key}&after={}", q(q_)))
        .unwrap_or_default();
    let full = queues.len() as i64 >= PAGE;
    let body = html! {
        p {
            @for (k, l, _, _) in RANGES {
                @if k == key { b { (l) } } @else { a href={ "/charts?range=" (k) } { (l) } }
                " "
            }
        }
        table id="charts" {
            thead {
                tr {
                    th { "queue" } th { "completed" } th { "failed attempts" }
                    th { "wait before the last attempt (p95)" }
                }
            }
            tbody {
                @if queues.is_empty() {
                    tr { td colspan="4" class="muted" { "nothing finished in this range" } }
                }
                @for (queue, s) in &queues {
                    tr {
                        td { a href={ "/jobs?queue=" (q(queue)) } { (queue) } }
                        td { (bars(queue, "completed", &s.completed, first, step, "#2f8f4e", count)) }
                        td { (bars(queue, "failed", &s.failed, first, step, "#b42318", count)) }
                        td { (bars(queue, "wait_p95", &s.wait_p95, first, step, "#2456c9", wait)) }
                    }
                }
            }
        }
        (more_link("next", full, &next, &format!("next {PAGE} queues")))
        p class="muted" { "from the rollup of finished work (jobwarden's rollup service); times are UTC" }
    };
    layout(viewer, "charts", &format!("Charts: {label}"), body).into_response()
}

/// The start of the oldest of `n` buckets of `step` seconds, the last one holding `now`.
fn first_bucket(now: f64, step: f64, n: usize) -> f64 {
    (now / step).floor() * step - (n as f64 - 1.0) * step
}

/// Each queue's points laid on `n` buckets from `first` (a bucket without a point is 0, a
/// point outside the buckets is left out).
fn series(points: &[SeriesPoint], first: f64, step: f64, n: usize) -> BTreeMap<String, Series> {
    let mut out: BTreeMap<String, Series> = BTreeMap::new();
    for p in points {
        let s = out.entry(p.queue.clone()).or_insert_with(|| Series {
            completed: vec![0.0; n],
            failed: vec![0.0; n],
            wait_p95: vec![0.0; n],
        });
        let slot = ((p.at - first) / step).round();
        if slot < 0.0 || slot >= n as f64 {
            continue;
        }
        let i = slot as usize;
        s.completed[i] += p.completed as f64;
        s.failed[i] += p.failed as f64;
        s.wait_p95[i] = s.wait_p95[i].max(p.wait_p95.unwrap_or(0.0));
    }
    out
}

fn count(v: f64) -> String {
    format!("{v:.0}")
}

fn wait(v: f64) -> String {
    secs(Some(v))
}

/// A bar chart of `values` (one bar per bucket, scaled to the largest), with the largest
/// value written in its corner and each bar's bucket and value as its tooltip.
fn bars(
    queue: &str,
    name: &str,
    values: &[f64],
    first: f64,
    step: f64,
    color: &str,
    fmt: fn(f64) -> String,
) -> Markup {
    let max = values.iter().copied().fold(0.0_f64, f64::max);
    let total: f64 = values.iter().sum();
    let w = WIDTH / values.len().max(1) as f64;
    let top = 12.0;
    html! {
        svg xmlns="http://www.w3.org/2000/svg" width=(WIDTH) height=(HEIGHT)
            viewBox={ "0 0 " (WIDTH) " " (HEIGHT) } role="img"
            aria-label={ (name) " of " (queue) }
            data-queue=(queue) data-series=(name) data-total=(count(total)) data-max=(max) {
            // `{}`, not `;`: inside an SVG, HTML has no void elements; an unclosed frame
            // would hold (and hide) every bar after it.
            rect x="0" y="0" width=(WIDTH) height=(HEIGHT) fill="#fff" stroke="#e7e9ee" {}
            text x="4" y="10" font-size="9" fill="#5b6474" { "max " (fmt(max)) }
            @for (i, v) in values.iter().enumerate() {
                @if *v > 0.0 {
                    @let h = (HEIGHT - top - 1.0) * v / max;
                    rect x=(format!("{:.2}", i as f64 * w + 0.5))
                        y=(format!("{:.2}", HEIGHT - 1.0 - h))
                        width=(format!("{:.2}", (w - 1.0).max(0.5)))
                        height=(format!("{h:.2}")) fill=(color) {
                        title { (bucket_label(first + i as f64 * step, step)) ": " (fmt(*v)) }
                    }
                }
            }
        }
    }
}

/// "14:05" for a minute, "14:00" for an hour, UTC.
fn bucket_label(at: f64, step: f64) -> String {
    let t = chrono::DateTime::from_timestamp(at as i64, 0).unwrap_or_default();
    if step >= 3600.0 {
        t.format("%H:00").to_string()
    } else {
        t.format("%H:%M").to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(queue: &str, at: f64, completed: i64, failed: i64, p95: f64) -> SeriesPoint {
        SeriesPoint {
            queue: queue.into(),
            at,
            completed,
            failed,
            wait_p50: None,
            wait_p95: Some(p95),
        }
    }

    #[test]
    fn points_land_in_their_buckets_and_missing_ones_are_zero() {
        let first = first_bucket(10_000.0 * 60.0 + 30.0, 60.0, 60);
        assert_eq!(first, (10_000.0 - 59.0) * 60.0);
        let points = [
            point("a", first, 5, 1, 0.5),
            point("a", first + 59.0 * 60.0, 7, 0, 2.0),
            // Before the first bucket and after the last: left out.
            point("a", first - 60.0, 100, 100, 100.0),
            point("a", first + 60.0 * 60.0, 100, 100, 100.0),
            point("b", first + 600.0, 1, 2, 0.1),
        ];
        let s = series(&points, first, 60.0, 60);
        assert_eq!(s.len(), 2);
        let a = &s["a"];
        assert_eq!((a.completed[0], a.completed[59]), (5.0, 7.0));
        assert_eq!(a.completed.iter().sum::<f64>(), 12.0);
        assert_eq!(a.failed.iter().sum::<f64>(), 1.0);
        assert_eq!(a.wait_p95[59], 2.0);
        assert_eq!(s["b"].failed[10], 2.0);
    }

    #[test]
    fn the_tallest_bar_fills_the_chart_and_empty_buckets_draw_nothing() {
        let svg = bars("q", "completed", &[0.0, 2.0, 4.0], 0.0, 60.0, "#000", count).into_string();
        assert_eq!(svg.matches("<rect").count(), 3, "{svg}"); // frame + two bars
        assert_eq!(svg.matches("</rect>").count(), 3, "{svg}"); // each closed
        assert!(svg.contains(r#"data-total="6""#), "{svg}");
        assert!(
            svg.contains(&format!(r#"height="{:.2}""#, HEIGHT - 13.0)),
            "{svg}"
        );
        assert!(svg.contains("00:02: 4"), "{svg}");
        // A queue name is escaped like every value in a page.
        let svg = bars("<q>", "completed", &[1.0], 0.0, 60.0, "#000", count).into_string();
        assert!(!svg.contains("<q>") && svg.contains("&lt;q&gt;"), "{svg}");
    }
}
