//! `[telemetry]`: OpenTelemetry over OTLP/HTTP (protobuf). Off unless an endpoint is given,
//! in the file (or `JOBWARDEN_TELEMETRY__*`) or by the standard `OTEL_*` variables, which
//! fill what the file leaves unset (the file wins, as a program's own settings win over the
//! environment in every OpenTelemetry SDK).

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The service name spans and metrics carry unless one is given.
pub const DEFAULT_SERVICE_NAME: &str = "jobwarden";
/// How often metrics are pushed unless said otherwise (the OpenTelemetry default).
pub const DEFAULT_METRICS_EVERY: Duration = Duration::from_secs(60);

/// The samplers `sampler` (and `OTEL_TRACES_SAMPLER`) may name: OpenTelemetry's own.
pub const SAMPLERS: [&str; 6] = [
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
];

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// The OTLP/HTTP base URL of a collector, e.g. `http://otel-collector:4318`: traces go to
    /// `<it>/v1/traces`, metrics to `<it>/v1/metrics`. Default: `OTEL_EXPORTER_OTLP_ENDPOINT`;
    /// neither set: telemetry is off.
    pub otlp_endpoint: Option<String>,
    /// The full URL for traces alone (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`).
    pub traces_endpoint: Option<String>,
    /// The full URL for metrics alone (`OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`).
    pub metrics_endpoint: Option<String>,
    /// Export traces (`OTEL_TRACES_EXPORTER=none` turns them off).
    pub traces: Option<bool>,
    /// Export metrics (`OTEL_METRICS_EXPORTER=none` turns them off).
    pub metrics: Option<bool>,
    /// `service.name` (`OTEL_SERVICE_NAME`; default `jobwarden`).
    pub service_name: Option<String>,
    /// One of [`SAMPLERS`] (`OTEL_TRACES_SAMPLER`; default `parentbased_traceidratio`).
    pub sampler: Option<String>,
    /// The ratio of traces kept by the `traceidratio` samplers, 0 to 1
    /// (`OTEL_TRACES_SAMPLER_ARG`; default 1).
    pub sample_ratio: Option<f64>,
    /// How often metrics are pushed (`OTEL_METRIC_EXPORT_INTERVAL`, in ms; default 60 s).
    #[serde(with = "humantime_serde")]
    pub metrics_every: Option<Duration>,
    /// Only `http/protobuf` is spoken (`OTEL_EXPORTER_OTLP_PROTOCOL`); anything else is
    /// refused at start-up rather than ignored.
    pub protocol: Option<String>,
}

/// What the worker exports, and where, once every default is applied.
#[derive(Debug, Clone, PartialEq)]
pub struct Otlp {
    pub traces_url: Option<String>,
    pub metrics_url: Option<String>,
    pub service_name: String,
    /// Whether a span with a parent follows its parent's decision.
    pub parent_based: bool,
    /// The ratio of root traces kept.
    pub ratio: f64,
    pub metrics_every: Duration,
}

impl TelemetryConfig {
    /// Fills the settings left unset from the standard `OTEL_*` variables (`var` reads one).
    pub fn fill_from_env(&mut self, var: impl Fn(&str) -> Option<String>) {
        let var = |k: &str| {
            var(k)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        if var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            self.traces.get_or_insert(false);
            self.metrics.get_or_insert(false);
        }
        fill(&mut self.otlp_endpoint, var("OTEL_EXPORTER_OTLP_ENDPOINT"));
        fill(
            &mut self.traces_endpoint,
            var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
        );
        fill(
            &mut self.metrics_endpoint,
            var("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"),
        );
        fill(&mut self.service_name, var("OTEL_SERVICE_NAME"));
        fill(&mut self.sampler, var("OTEL_TRACES_SAMPLER"));
        fill(&mut self.protocol, var("OTEL_EXPORTER_OTLP_PROTOCOL"));
        if self.sample_ratio.is_none() {
            if let Some(arg) = var("OTEL_TRACES_SAMPLER_ARG") {
                // A ratio that does not parse is kept as NaN, refused with the variable named.
                self.sample_ratio = Some(arg.parse().unwrap_or(f64::NAN));
            }
        }
        if self.metrics_every.is_none() {
            if let Some(ms) = var("OTEL_METRIC_EXPORT_INTERVAL") {
                self.metrics_every = Some(ms.parse().map_or(Duration::ZERO, Duration::from_millis));
            }
        }
        if var("OTEL_TRACES_EXPORTER").is_some_and(|v| v == "none") {
            self.traces.get_or_insert(false);
        }
        if var("OTEL_METRICS_EXPORTER").is_some_and(|v| v == "none") {
            self.metrics.get_or_insert(false);
        }
    }

    /// What to export, or `None` when telemetry is off. The error names the setting (and
    /// the variable it may have come from), the value and the fix.
    pub fn resolve(&self) -> Result<Option<Otlp>, Vec<String>> {
        let mut errs = Vec::new();
        let (traces_url, metrics_url) = self.endpoints(&mut errs);
        if let Some(p) = &self.protocol {
            if p != "http/protobuf" {
                errs.push(format!(
                    "telemetry.protocol (or OTEL_EXPORTER_OTLP_PROTOCOL) {p:?}: jobwarden speaks \
                     OTLP over http/protobuf only; unset it or set \"http/protobuf\" (the \
                     collector's port 4318)"
                ));
            }
        }
        let sampler = self
            .sampler
            .as_deref()
            .unwrap_or("parentbased_traceidratio");
        if !SAMPLERS.contains(&sampler) {
            errs.push(format!(
                "telemetry.sampler (or OTEL_TRACES_SAMPLER) {sampler:?} is not one of {}",
                SAMPLERS.join(", ")
            ));
        }
        let ratio = self.sample_ratio.unwrap_or(1.0);
        if !(0.0..=1.0).contains(&ratio) {
            errs.push(format!(
                "telemetry.sample_ratio (or OTEL_TRACES_SAMPLER_ARG) {ratio} is not a ratio from \
                 0 to 1; e.g. 0.1 keeps one trace in ten"
            ));
        }
        let metrics_every = self.metrics_every.unwrap_or(DEFAULT_METRICS_EVERY);
        if metrics_every < Duration::from_secs(1) {
            errs.push(format!(
                "telemetry.metrics_every (or OTEL_METRIC_EXPORT_INTERVAL, in milliseconds) \
                 {:?} is under a second; e.g. \"60s\"",
                metrics_every
            ));
        }
        let service_name = self
            .service_name
            .clone()
            .unwrap_or_else(|| DEFAULT_SERVICE_NAME.to_string());
        if !errs.is_empty() {
            return Err(errs);
        }
        let traces_url = traces_url.filter(|_| self.traces != Some(false));
        let metrics_url = metrics_url.filter(|_| self.metrics != Some(false));
        if traces_url.is_none() && metrics_url.is_none() {
            return Ok(None);
        }
        let (parent_based, ratio) = match sampler {
            "always_on" => (false, 1.0),
            "always_off" => (false, 0.0),
            "traceidratio" => (false, ratio),
            "parentbased_always_on" => (true, 1.0),
            "parentbased_always_off" => (true, 0.0),
            _ => (true, ratio),
        };
        Ok(Some(Otlp {
            traces_url,
            metrics_url,
            service_name,
            parent_based,
            ratio,
            metrics_every,
        }))
    }

    /// The trace and metric URLs given (checked: `http://` with a host), each from its own
    /// setting or from `otlp_endpoint`; what is wrong goes to `errs`.
    fn endpoints(&self, errs: &mut Vec<String>) -> (Option<String>, Option<String>) {
        let url = |key: &str, given: &Option<String>, path: &str, errs: &mut Vec<String>| {
            let base = given.as_deref()?;
            let full = if path.is_empty() {
                base.to_string()
            } else {
                format!("{}{path}", base.trim_end_matches('/'))
            };
            match url::Url::parse(&full) {
                Ok(u) if u.scheme() == "http" && u.host_str().is_some() => Some(full),
                Ok(u) if u.scheme() == "https" => {
                    errs.push(format!(
                        "telemetry.{key} {:?}: https is not spoken; send to a collector agent \
                         beside the worker over http (e.g. http://localhost:4318), which \
                         forwards over TLS",
                        crate::redact::url(base)
                    ));
                    None
                }
                _ => {
                    errs.push(format!(
                        "telemetry.{key} {:?} is not an http:// URL with a host; e.g. \
                         http://otel-collector:4318",
                        crate::redact::url(base)
                    ));
                    None
                }
            }
        };
        let traces_url = url("traces_endpoint", &self.traces_endpoint, "", errs)
            .or_else(|| url("otlp_endpoint", &self.otlp_endpoint, "/v1/traces", errs));
        let metrics_url = url("metrics_endpoint", &self.metrics_endpoint, "", errs).or_else(|| {
            // Said once: the base URL's error is already in `errs`.
            let mut again = Vec::new();
            url(
                "otlp_endpoint",
                &self.otlp_endpoint,
                "/v1/metrics",
                &mut again,
            )
        });
        (traces_url, metrics_url)
    }
}

fn fill<T>(slot: &mut Option<T>, value: Option<T>) {
    if slot.is_none() {
        *slot = value;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn from_env(vars: &[(&str, &str)]) -> TelemetryConfig {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut c = TelemetryConfig::default();
        c.fill_from_env(|k| vars.get(k).cloned());
        c
    }

    #[test]
    fn off_without_an_endpoint_on_with_the_standard_variables() {
        assert_eq!(TelemetryConfig::default().resolve(), Ok(None));
        assert_eq!(from_env(&[("OTEL_SERVICE_NAME", "x")]).resolve(), Ok(None));
        let on = from_env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.1"),
            ("OTEL_SERVICE_NAME", "billing-worker"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "5000"),
        ])
        .resolve()
        .unwrap()
        .unwrap();
        assert_eq!(
            on,
            Otlp {
                traces_url: Some("http://collector:4318/v1/traces".into()),
                metrics_url: Some("http://collector:4318/v1/metrics".into()),
                service_name: "billing-worker".into(),
                parent_based: true,
                ratio: 0.1,
                metrics_every: Duration::from_secs(5),
            }
        );
        // Per signal: as given; `none` turns one off.
        let traces_only = from_env(&[
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://t:4318/custom"),
            ("OTEL_METRICS_EXPORTER", "none"),
        ])
        .resolve()
        .unwrap()
        .unwrap();
        assert_eq!(
            traces_only.traces_url.as_deref(),
            Some("http://t:4318/custom")
        );
        assert_eq!(traces_only.metrics_url, None);
        assert_eq!(
            from_env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                ("OTEL_SDK_DISABLED", "true")
            ])
            .resolve(),
            Ok(None)
        );
    }

    #[test]
    fn the_file_wins_over_the_environment() {
        let mut c = TelemetryConfig {
            otlp_endpoint: Some("http://file:4318".into()),
            sample_ratio: Some(0.5),
            ..Default::default()
        };
        c.fill_from_env(|k| match k {
            "OTEL_EXPORTER_OTLP_ENDPOINT" => Some("http://env:4318".into()),
            "OTEL_TRACES_SAMPLER_ARG" => Some("0.01".into()),
            _ => None,
        });
        let on = c.resolve().unwrap().unwrap();
        assert_eq!(on.traces_url.as_deref(), Some("http://file:4318/v1/traces"));
        assert_eq!(on.ratio, 0.5);
    }

    #[test]
    fn bad_values_are_named_with_their_fix() {
        let errs = |vars: &[(&str, &str)]| from_env(vars).resolve().unwrap_err().join("\n");
        let e = errs(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c:4318")]);
        assert!(e.contains("https is not spoken"), "{e}");
        let e = errs(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318")]);
        assert!(e.contains("is not an http:// URL with a host"), "{e}");
        let e = errs(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ]);
        assert!(e.contains("http/protobuf only"), "{e}");
        let e = errs(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_TRACES_SAMPLER", "jaeger_remote"),
        ]);
        assert!(e.contains("is not one of always_on"), "{e}");
        for bad in ["1.5", "ten", "-0.1"] {
            let e = errs(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                ("OTEL_TRACES_SAMPLER_ARG", bad),
            ]);
            assert!(e.contains("is not a ratio from 0 to 1"), "{bad}: {e}");
        }
        let e = errs(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "10"),
        ]);
        assert!(e.contains("is under a second"), "{e}");
    }

    #[test]
    fn samplers_map_to_a_parent_rule_and_a_ratio() {
        for (name, parent_based, ratio) in [
            ("always_on", false, 1.0),
            ("always_off", false, 0.0),
            ("traceidratio", false, 0.25),
            ("parentbased_always_on", true, 1.0),
            ("parentbased_always_off", true, 0.0),
            ("parentbased_traceidratio", true, 0.25),
        ] {
            let on = from_env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                ("OTEL_TRACES_SAMPLER", name),
                ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
            ])
            .resolve()
            .unwrap()
            .unwrap();
            assert_eq!((on.parent_based, on.ratio), (parent_based, ratio), "{name}");
        }
    }
}
