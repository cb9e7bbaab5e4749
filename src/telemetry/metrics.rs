//! `/metrics` over OTLP: the same text the Prometheus endpoint serves, read back and sent as
//! an OTLP `ExportMetricsServiceRequest`, so both show the same numbers by construction.
//! Counters become cumulative monotonic sums, gauges (and `info` and untyped families)
//! gauges, histograms histograms (Prometheus' cumulative buckets turned into OTLP's
//! per-bucket counts).

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::{
    metric::Data, number_data_point, AggregationTemporality, Gauge, Histogram, HistogramDataPoint,
    Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use std::collections::BTreeMap;

/// One sample line: its name, labels (in order) and value.
#[derive(Debug, Clone, PartialEq)]
struct Sample {
    name: String,
    labels: Vec<(String, String)>,
    value: f64,
}

/// A metric family as the text declares it.
#[derive(Debug, Default)]
struct Family {
    name: String,
    kind: String,
    help: String,
    unit: String,
    samples: Vec<Sample>,
}

/// Reads OpenMetrics (or Prometheus 0.0.4) text into families, in the order they come.
/// Lines it cannot read are skipped: the text is our own, and one odd line must not cost
/// the rest.
fn families(text: &str) -> Vec<Family> {
    let mut out: Vec<Family> = Vec::new();
    for line in text.lines() {
        let line = line.trim_end();
        if let Some(rest) = line.strip_prefix("# ") {
            let mut parts = rest.splitn(3, ' ');
            let (what, name, value) = (
                parts.next().unwrap_or(""),
                parts.next().unwrap_or(""),
                parts.next().unwrap_or(""),
            );
            if !matches!(what, "TYPE" | "HELP" | "UNIT") || name.is_empty() {
                continue;
            }
            if out.last().is_none_or(|f| f.name != name) {
                out.push(Family {
                    name: name.to_string(),
                    kind: "unknown".into(),
                    ..Default::default()
                });
            }
            let f = out.last_mut().expect("pushed");
            match what {
                "TYPE" => f.kind = value.to_string(),
                "HELP" => f.help = value.to_string(),
                _ => f.unit = value.to_string(),
            }
            continue;
        }
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some(sample) = sample(line) else { continue };
        let belongs = out
            .last()
            .is_some_and(|f| sample.name.starts_with(f.name.as_str()));
        if !belongs {
            out.push(Family {
                name: sample.name.clone(),
                kind: "unknown".into(),
                ..Default::default()
            });
        }
        out.last_mut().expect("pushed").samples.push(sample);
    }
    out
}

/// `name{a="1",b="x\"y"} 3.5 [timestamp]`.
fn sample(line: &str) -> Option<Sample> {
    let b = line.as_bytes();
    let mut i = line.find(['{', ' '])?;
    let name = line[..i].to_string();
    let mut labels = Vec::new();
    if b[i] == b'{' {
        i += 1;
        loop {
            while i < b.len() && matches!(b[i], b',' | b' ') {
                i += 1;
            }
            if *b.get(i)? == b'}' {
                i += 1;
                break;
            }
            let eq = i + line[i..].find('=')?;
            let key = line[i..eq].trim().to_string();
            i = eq + 1;
            if b.get(i) != Some(&b'"') {
                return None;
            }
            i += 1;
            let mut value = String::new();
            loop {
                let c = line[i..].chars().next()?;
                i += c.len_utf8();
                match c {
                    '\\' => {
                        let n = line[i..].chars().next()?;
                        i += n.len_utf8();
                        value.push(if n == 'n' { '\n' } else { n });
                    }
                    '"' => break,
                    c => value.push(c),
                }
            }
            labels.push((key, value));
        }
    }
    let value = match line[i..].split_whitespace().next()? {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Sample {
        name,
        labels,
        value,
    })
}

fn attributes(labels: &[(String, String)]) -> Vec<KeyValue> {
    labels.iter().map(|(k, v)| string_attribute(k, v)).collect()
}

/// A string attribute.
pub fn string_attribute(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.to_string())),
        }),
        ..Default::default()
    }
}

fn number(labels: &[(String, String)], value: f64, start: u64, now: u64) -> NumberDataPoint {
    NumberDataPoint {
        attributes: attributes(labels),
        start_time_unix_nano: start,
        time_unix_nano: now,
        value: Some(number_data_point::Value::AsDouble(value)),
        ..Default::default()
    }
}

/// The OTLP form of one family, or `None` for one with no samples.
fn metric(f: &Family, start: u64, now: u64) -> Option<Metric> {
    let data = match f.kind.as_str() {
        "counter" => Data::Sum(Sum {
            data_points: f
                .samples
                .iter()
                .filter(|s| s.name.ends_with("_total") || s.name == f.name)
                .map(|s| number(&s.labels, s.value, start, now))
                .collect(),
            aggregation_temporality: AggregationTemporality::Cumulative as i32,
            is_monotonic: true,
        }),
        "histogram" => Data::Histogram(Histogram {
            data_points: histogram_points(f, start, now),
            aggregation_temporality: AggregationTemporality::Cumulative as i32,
        }),
        _ => Data::Gauge(Gauge {
            data_points: f
                .samples
                .iter()
                .map(|s| number(&s.labels, s.value, start, now))
                .collect(),
        }),
    };
    let empty = match &data {
        Data::Sum(s) => s.data_points.is_empty(),
        Data::Gauge(g) => g.data_points.is_empty(),
        Data::Histogram(h) => h.data_points.is_empty(),
        _ => true,
    };
    (!empty).then(|| Metric {
        name: f.name.clone(),
        description: f.help.clone(),
        unit: f.unit.clone(),
        data: Some(data),
        ..Default::default()
    })
}

/// A histogram's series (one per label set but `le`): bounds, per-bucket counts, count, sum.
fn histogram_points(f: &Family, start: u64, now: u64) -> Vec<HistogramDataPoint> {
    #[derive(Default)]
    struct Series {
        buckets: Vec<(f64, f64)>,
        count: f64,
        sum: Option<f64>,
    }
    let mut series: BTreeMap<Vec<(String, String)>, Series> = BTreeMap::new();
    for s in &f.samples {
        let suffix = &s.name[f.name.len()..];
        let mut le = None;
        let labels: Vec<(String, String)> = s
            .labels
            .iter()
            .filter(|(k, v)| {
                if k == "le" {
                    le = Some(if v == "+Inf" {
                        f64::INFINITY
                    } else {
                        v.parse().unwrap_or(f64::NAN)
                    });
                    false
                } else {
                    true
                }
            })
            .cloned()
            .collect();
        let one = series.entry(labels).or_default();
        match (suffix, le) {
            ("_bucket", Some(le)) if !le.is_nan() => one.buckets.push((le, s.value)),
            ("_count", _) => one.count = s.value,
            ("_sum", _) => one.sum = Some(s.value),
            _ => {}
        }
    }
    series
        .into_iter()
        .map(|(labels, mut s)| {
            s.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
            let bounds: Vec<f64> = s
                .buckets
                .iter()
                .map(|(le, _)| *le)
                .filter(|le| le.is_finite())
                .collect();
            // Cumulative counts to per-bucket ones; the last bucket (above every bound)
            // holds the rest of the count.
            let mut counts = Vec::with_capacity(bounds.len() + 1);
            let mut below = 0.0;
            for (le, cumulative) in &s.buckets {
                if le.is_finite() {
                    counts.push((cumulative - below).max(0.0) as u64);
                    below = *cumulative;
                }
            }
            counts.push((s.count - below).max(0.0) as u64);
            HistogramDataPoint {
                attributes: attributes(&labels),
                start_time_unix_nano: start,
                time_unix_nano: now,
                count: s.count as u64,
                sum: s.sum,
                bucket_counts: counts,
                explicit_bounds: bounds,
                ..Default::default()
            }
        })
        .collect()
}

/// The request carrying every family of `text`, under `resource`; `start` is when the
/// counters started counting (the process's start), `now` the time of the reading, both in
/// nanoseconds since the Unix epoch.
pub fn request(
    text: &str,
    resource: Vec<KeyValue>,
    start: u64,
    now: u64,
) -> ExportMetricsServiceRequest {
    let metrics = families(text)
        .iter()
        .filter_map(|f| metric(f, start, now))
        .collect();
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: Some(Resource {
                attributes: resource,
                ..Default::default()
            }),
            scope_metrics: vec![ScopeMetrics {
                scope: Some(InstrumentationScope {
                    name: "jobwarden".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    ..Default::default()
                }),
                metrics,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP jobwarden_jobs Jobs that ended, by outcome.
# TYPE jobwarden_jobs counter
jobwarden_jobs_total{queue="email",outcome="completed"} 7
jobwarden_jobs_total{queue="a \"b\" \\ c",outcome="dead"} 1
# HELP jobwarden_job_duration_seconds How long handlers ran.
# TYPE jobwarden_job_duration_seconds histogram
# UNIT jobwarden_job_duration_seconds seconds
jobwarden_job_duration_seconds_sum{queue="email"} 2.5
jobwarden_job_duration_seconds_count{queue="email"} 7
jobwarden_job_duration_seconds_bucket{le="0.1",queue="email"} 2
jobwarden_job_duration_seconds_bucket{le="1.0",queue="email"} 6
jobwarden_job_duration_seconds_bucket{le="+Inf",queue="email"} 7
# TYPE jobwarden_running gauge
jobwarden_running 3
# TYPE jobwarden_build info
jobwarden_build_info{version="0.1.0"} 1
jobwarden_untyped_thing 4.5
# EOF
"#;

    fn by_name(r: &ExportMetricsServiceRequest) -> BTreeMap<String, Metric> {
        r.resource_metrics[0].scope_metrics[0]
            .metrics
            .iter()
            .map(|m| (m.name.clone(), m.clone()))
            .collect()
    }

    fn value(p: &NumberDataPoint) -> f64 {
        match p.value {
            Some(number_data_point::Value::AsDouble(v)) => v,
            _ => panic!("not a double"),
        }
    }

    #[test]
    fn every_family_keeps_its_kind_labels_and_values() {
        let r = request(TEXT, vec![string_attribute("service.name", "w")], 10, 20);
        let m = by_name(&r);
        assert_eq!(
            m.keys().collect::<Vec<_>>(),
            [
                "jobwarden_build",
                "jobwarden_job_duration_seconds",
                "jobwarden_jobs",
                "jobwarden_running",
                "jobwarden_untyped_thing"
            ]
        );
        let Some(Data::Sum(jobs)) = &m["jobwarden_jobs"].data else {
            panic!("a sum")
        };
        assert!(jobs.is_monotonic);
        assert_eq!(jobs.data_points.len(), 2);
        assert_eq!(value(&jobs.data_points[0]), 7.0);
        assert_eq!(
            jobs.data_points[1].attributes[0],
            string_attribute("queue", "a \"b\" \\ c")
        );
        assert_eq!(jobs.data_points[0].start_time_unix_nano, 10);
        assert_eq!(jobs.data_points[0].time_unix_nano, 20);
        let Some(Data::Histogram(h)) = &m["jobwarden_job_duration_seconds"].data else {
            panic!("a histogram")
        };
        assert_eq!(m["jobwarden_job_duration_seconds"].unit, "seconds");
        let p = &h.data_points[0];
        assert_eq!(p.attributes, vec![string_attribute("queue", "email")]);
        assert_eq!((p.count, p.sum), (7, Some(2.5)));
        assert_eq!(p.explicit_bounds, vec![0.1, 1.0]);
        // Cumulative 2, 6, 7 → per bucket 2, 4, 1.
        assert_eq!(p.bucket_counts, vec![2, 4, 1]);
        let Some(Data::Gauge(g)) = &m["jobwarden_running"].data else {
            panic!("a gauge")
        };
        assert_eq!(value(&g.data_points[0]), 3.0);
        assert!(g.data_points[0].attributes.is_empty());
        let Some(Data::Gauge(info)) = &m["jobwarden_build"].data else {
            panic!("info as a gauge")
        };
        assert_eq!(
            info.data_points[0].attributes,
            vec![string_attribute("version", "0.1.0")]
        );
        assert_eq!(
            r.resource_metrics[0].resource.as_ref().unwrap().attributes,
            vec![string_attribute("service.name", "w")]
        );
    }

    #[test]
    fn odd_lines_are_skipped_not_fatal() {
        let r = request(
            "# TYPE a gauge\na{x=\"1\" 3\na 2\nb{y=\"unterminated} 1\n# TYPE c counter\nc_total 5\n",
            vec![],
            0,
            1,
        );
        let m = by_name(&r);
        let Some(Data::Gauge(a)) = &m["a"].data else {
            panic!()
        };
        assert_eq!(a.data_points.len(), 1);
        assert_eq!(value(&a.data_points[0]), 2.0);
        assert!(m.contains_key("c"));
    }
}
