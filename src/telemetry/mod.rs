//! OpenTelemetry over OTLP/HTTP: a trace of every job (sampled), and `/metrics` pushed as
//! OTLP metrics. Off unless an endpoint is configured (`[telemetry]`, or the standard
//! `OTEL_EXPORTER_OTLP_ENDPOINT`); off, every call here is a branch on `None`.
//!
//! The trace of one job:
//!
//! ```text
//! <producer's span>                 (its `traceparent`; none: the job starts a trace)
//! └─ job <queue>                    the job from publication to its first claim
//!    ├─ process <queue>             one per attempt: the handler's run (CONSUMER)
//!    │  └─ settle <queue>           its settle: the fenced write, then the ack
//!    └─ process <queue>             a retry …
//!       └─ settle <queue>
//!          └─ job <next queue>      a chain step: the `then` job's own tree
//! ```
//!
//! Each claim statement is a `receive <queue>` span (CLIENT) with
//! `messaging.batch.message_count` and a link to every sampled job it claimed.
//!
//! No job's ids are stored for this: a job's span has ids derived from the job's id (its
//! trace's, when it starts one, too), so every attempt on any worker finds its parent
//! without a lookup, and one sampling decision (the trace id's) holds for all of them. A
//! completed job whose run was sampled keeps that run's context as its `traceparent`, which
//! its `then` jobs inherit: a pipeline is one trace.

pub mod metrics;
pub mod transport;

use crate::config::telemetry::Otlp;
use opentelemetry::trace::{
    Link, Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId,
    TraceState, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{
    IdGenerator, RandomIdGenerator, SamplingDecision, SdkTracer, SdkTracerProvider, ShouldSample,
};
use sha2::{Digest, Sha256};
use std::cell::Cell;
use std::sync::Arc;
use std::time::SystemTime;

/// The exporters of one worker; cheap to clone. [`Telemetry::off`] exports nothing.
#[derive(Clone, Default)]
pub struct Telemetry(Option<Arc<Inner>>);

struct Inner {
    provider: Option<SdkTracerProvider>,
    tracer: Option<SdkTracer>,
    sampler: JobSampler,
    otlp: Otlp,
    transport: transport::Otlp,
    resource: Vec<opentelemetry_proto::tonic::common::v1::KeyValue>,
    started: SystemTime,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Some(i) => write!(f, "Telemetry({:?})", i.otlp),
            None => f.write_str("Telemetry(off)"),
        }
    }
}

thread_local! {
    /// Ids the next span built on this thread takes (see [`JobIds`]).
    static NEXT_IDS: Cell<Option<(TraceId, SpanId)>> = const { Cell::new(None) };
}

/// Random ids, except for a job's span: its ids are derived from the job's id, set just
/// before it is built (span building is synchronous, on one thread).
#[derive(Debug)]
struct JobIds(RandomIdGenerator);

impl IdGenerator for JobIds {
    fn new_trace_id(&self) -> TraceId {
        match NEXT_IDS.with(Cell::get) {
            Some((t, _)) => t,
            None => self.0.new_trace_id(),
        }
    }

    fn new_span_id(&self) -> SpanId {
        match NEXT_IDS.with(Cell::get) {
            Some((_, s)) => s,
            None => self.0.new_span_id(),
        }
    }
}

fn digest(kind: &str, id: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"jobwarden ");
    h.update(kind.as_bytes());
    h.update(b" ");
    h.update(id.as_bytes());
    h.finalize().into()
}

/// The sampler: OpenTelemetry's `parentbased_traceidratio` (or `traceidratio`) rule, decided
/// once per job without building a context (a job not traced costs a hash and a compare), and
/// a claim's `receive` span always kept: one is only made when a job it claimed is traced.
#[derive(Debug, Clone, Copy)]
struct JobSampler {
    parent_based: bool,
    ratio: f64,
}

impl JobSampler {
    /// Whether a span under `parent` (a remote or local span context) in `trace_id` is kept.
    fn keeps(&self, parent: Option<&SpanContext>, trace_id: TraceId) -> bool {
        match parent {
            Some(p) if self.parent_based => p.is_sampled(),
            _ => ratio_keeps(self.ratio, trace_id),
        }
    }
}

/// OpenTelemetry's TraceIdRatioBased rule: the trace id's low 63 bits under the ratio.
fn ratio_keeps(ratio: f64, trace_id: TraceId) -> bool {
    if ratio >= 1.0 {
        return true;
    }
    let bound = (ratio.max(0.0) * (1u64 << 63) as f64) as u64;
    let bytes = trace_id.to_bytes();
    let low = u64::from_be_bytes(bytes[8..].try_into().expect("8 bytes"));
    (low >> 1) < bound
}

impl ShouldSample for JobSampler {
    fn should_sample(
        &self,
        parent: Option<&Context>,
        trace_id: TraceId,
        name: &str,
        _kind: &SpanKind,
        _attributes: &[KeyValue],
        _links: &[Link],
    ) -> opentelemetry_sdk::trace::SamplingResult {
        let parent = parent
            .map(|cx| cx.span().span_context().clone())
            .filter(SpanContext::is_valid);
        let keep = name.starts_with("receive ") || self.keeps(parent.as_ref(), trace_id);
        opentelemetry_sdk::trace::SamplingResult {
            decision: if keep {
                SamplingDecision::RecordAndSample
            } else {
                SamplingDecision::Drop
            },
            attributes: Vec::new(),
            trace_state: parent.map(|p| p.trace_state().clone()).unwrap_or_default(),
        }
    }
}

/// The trace a job without a `traceparent` starts.
pub fn job_trace_id(job_id: &str) -> TraceId {
    let d = digest("trace", job_id);
    TraceId::from_bytes(d[..16].try_into().expect("16 bytes"))
}

/// The id of a job's span.
pub fn job_span_id(job_id: &str) -> SpanId {
    let d = digest("span", job_id);
    SpanId::from_bytes(d[..8].try_into().expect("8 bytes"))
}

/// The span context of a W3C `traceparent` (version 00), as a remote parent.
pub fn parse_traceparent(tp: &str) -> Option<SpanContext> {
    let tp = crate::contract::traceparent(tp)?;
    let mut parts = tp.split('-');
    let (_, trace, span, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let sc = SpanContext::new(
        TraceId::from_hex(trace).ok()?,
        SpanId::from_hex(span).ok()?,
        TraceFlags::new(u8::from_str_radix(flags, 16).ok()?),
        true,
        TraceState::default(),
    );
    sc.is_valid().then_some(sc)
}

/// The `traceparent` of a span context.
pub fn traceparent(sc: &SpanContext) -> String {
    format!(
        "00-{}-{}-{:02x}",
        sc.trace_id(),
        sc.span_id(),
        sc.trace_flags().to_u8()
    )
}

/// The messaging attributes every span of a job carries.
fn job_attributes(job: &JobRef<'_>) -> Vec<KeyValue> {
    vec![
        KeyValue::new("messaging.system", "nats"),
        KeyValue::new("messaging.destination.name", job.subject.to_string()),
        KeyValue::new("messaging.message.id", job.id.to_string()),
        KeyValue::new("jobwarden.queue", job.queue.to_string()),
    ]
}

/// A job, as the spans name it.
#[derive(Debug, Clone, Copy)]
pub struct JobRef<'a> {
    pub id: &'a str,
    pub queue: &'a str,
    /// The subject it was delivered on (`jobs.<queue>[.<band>]`).
    pub subject: &'a str,
    /// Its stored (or delivered) `traceparent`.
    pub traceparent: Option<&'a str>,
}

/// One attempt's open `process` span.
pub struct AttemptSpan {
    cx: Context,
    tracer: SdkTracer,
    queue: String,
    /// When the handler's run ended (the settle's start).
    ended: Option<SystemTime>,
    /// Ended through [`AttemptSpan::settled`]; else its drop ends it as `lost`.
    done: bool,
}

impl Drop for AttemptSpan {
    fn drop(&mut self) {
        if !self.done {
            let span = self.cx.span();
            span.set_attribute(KeyValue::new("jobwarden.outcome", "lost"));
            span.end_with_timestamp(self.ended.unwrap_or_else(SystemTime::now));
        }
    }
}

impl std::fmt::Debug for AttemptSpan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AttemptSpan({})", self.traceparent())
    }
}

impl AttemptSpan {
    /// Its context, for the handler (its spans become the run's children) and, once the
    /// job completes, for the job's row (its `then` jobs descend from this run).
    pub fn traceparent(&self) -> String {
        traceparent(&self.cx.span().span_context().clone())
    }

    /// The handler's run ended now; the settle starts.
    pub fn run_ended(&mut self, failed: Option<&str>) {
        let now = SystemTime::now();
        self.ended = Some(now);
        if let Some(error) = failed {
            let span = self.cx.span();
            span.set_status(Status::error(error.to_string()));
            span.set_attribute(KeyValue::new("error.type", "handler_error"));
        }
    }

    /// The attempt was settled as `outcome` (`completed`, `retry`, `dead`, `deferred`,
    /// `released`, `lost`): the settle span from the run's end to now, then the run's end.
    pub fn settled(mut self, outcome: &str, retry_in: Option<std::time::Duration>) {
        self.done = true;
        let ended = self.ended.unwrap_or_else(SystemTime::now);
        let mut attributes = vec![
            KeyValue::new("messaging.operation.type", "settle"),
            KeyValue::new("messaging.operation.name", "settle"),
            KeyValue::new("jobwarden.outcome", outcome.to_string()),
        ];
        if let Some(d) = retry_in {
            attributes.push(KeyValue::new("jobwarden.retry_in_ms", d.as_millis() as i64));
        }
        let mut settle = self
            .tracer
            .span_builder(format!("settle {}", self.queue))
            .with_kind(SpanKind::Client)
            .with_start_time(ended)
            .with_attributes(attributes)
            .start_with_context(&self.tracer, &self.cx);
        if matches!(outcome, "dead" | "lost") {
            settle.set_status(Status::error(format!("the job ended {outcome}")));
        }
        settle.end();
        let span = self.cx.span();
        span.set_attribute(KeyValue::new("jobwarden.outcome", outcome.to_string()));
        span.end_with_timestamp(ended);
    }
}

impl Telemetry {
    /// Exports nothing.
    pub fn off() -> Telemetry {
        Telemetry(None)
    }

    /// Starts the exporters `otlp` asks for (inside the worker's runtime). `instance` names
    /// this process (`service.instance.id`).
    pub fn start(otlp: Option<Otlp>, instance: &str) -> Result<Telemetry, String> {
        let Some(otlp) = otlp else {
            return Ok(Telemetry::off());
        };
        let sampler = JobSampler {
            parent_based: otlp.parent_based,
            ratio: otlp.ratio,
        };
        let transport = transport::Otlp::on_current_runtime();
        let resource_attributes = [
            KeyValue::new("service.name", otlp.service_name.clone()),
            KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
            KeyValue::new("service.instance.id", instance.to_string()),
        ];
        let (provider, tracer) = match &otlp.traces_url {
            Some(url) => {
                let exporter = opentelemetry_otlp::SpanExporter::builder()
                    .with_http()
                    .with_http_client(transport.clone())
                    .with_endpoint(url.clone())
                    .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                    .with_timeout(transport::EXPORT_LIMIT)
                    .build()
                    .map_err(|e| format!("telemetry: the OTLP trace exporter for {url}: {e}"))?;
                // Sent as soon as a batch fills; a queue deep enough for a burst of traced
                // jobs (the SDK drops spans beyond it rather than slow the worker).
                let processor = opentelemetry_sdk::trace::BatchSpanProcessor::builder(exporter)
                    .with_batch_config(
                        opentelemetry_sdk::trace::BatchConfigBuilder::default()
                            .with_max_queue_size(16_384)
                            .with_max_export_batch_size(1024)
                            .build(),
                    )
                    .build();
                let provider = SdkTracerProvider::builder()
                    .with_id_generator(JobIds(RandomIdGenerator::default()))
                    .with_sampler(sampler)
                    .with_resource(
                        opentelemetry_sdk::Resource::builder_empty()
                            .with_attributes(resource_attributes.clone())
                            .build(),
                    )
                    .with_span_processor(processor)
                    .build();
                let tracer = provider.tracer("jobwarden");
                (Some(provider), Some(tracer))
            }
            None => (None, None),
        };
        let resource = resource_attributes
            .iter()
            .map(|kv| metrics::string_attribute(kv.key.as_str(), &kv.value.as_str()))
            .collect();
        Ok(Telemetry(Some(Arc::new(Inner {
            provider,
            tracer,
            sampler,
            otlp,
            transport,
            resource,
            started: SystemTime::now(),
        }))))
    }

    /// Whether anything is exported.
    pub fn is_on(&self) -> bool {
        self.0.is_some()
    }

    /// One line for the log at start-up.
    pub fn describe(&self) -> String {
        match &self.0 {
            None => "OpenTelemetry: off (set OTEL_EXPORTER_OTLP_ENDPOINT or [telemetry] \
                     otlp_endpoint to export traces and metrics over OTLP)"
                .to_string(),
            Some(i) => {
                let o = &i.otlp;
                format!(
                    "OpenTelemetry: traces {}, metrics {} over OTLP/HTTP (protobuf) as \
                     service {}; sampler {}{}",
                    o.traces_url
                        .as_deref()
                        .map_or("off".to_string(), |u| format!("to {u}")),
                    o.metrics_url
                        .as_deref()
                        .map_or("off".to_string(), |u| format!(
                            "to {u} every {}",
                            crate::config::fmt_dur(o.metrics_every)
                        )),
                    o.service_name,
                    if o.parent_based { "parent-based, " } else { "" },
                    format_args!("{} of root traces kept", o.ratio)
                )
            }
        }
    }

    fn tracer(&self) -> Option<&SdkTracer> {
        self.0.as_ref()?.tracer.as_ref()
    }

    /// Whether job `id` (with its stored `traceparent`) is traced: traces on, and its trace
    /// sampled.
    pub fn traces(&self, id: &str, traceparent: Option<&str>) -> bool {
        let job = JobRef {
            id,
            queue: "",
            subject: "",
            traceparent,
        };
        self.job_context(&job).is_some()
    }

    /// The context a job's spans hang from, when its trace is kept: its producer's span
    /// context (if any) and its own span's (ids derived from its id, under its
    /// `traceparent`). `None` when traces are off or the job's trace is not sampled: one
    /// decision, from the trace id, holds for the whole job.
    fn job_context(&self, job: &JobRef<'_>) -> Option<(Option<SpanContext>, SpanContext)> {
        let inner = self.0.as_ref()?;
        inner.tracer.as_ref()?;
        let parent = job.traceparent.and_then(parse_traceparent);
        let trace_id = parent
            .as_ref()
            .map(SpanContext::trace_id)
            .unwrap_or_else(|| job_trace_id(job.id));
        if !inner.sampler.keeps(parent.as_ref(), trace_id) {
            return None;
        }
        let own = SpanContext::new(
            trace_id,
            job_span_id(job.id),
            TraceFlags::SAMPLED,
            true,
            TraceState::default(),
        );
        Some((parent, own))
    }

    /// An attempt of a job starts: on its first attempt, the job's own span (from
    /// `queued_since`, its publication, to now); then the attempt's `process` span. `None`
    /// when traces are off or the job's trace is not sampled.
    pub fn attempt(
        &self,
        job: &JobRef<'_>,
        attempt: u32,
        max_attempts: u32,
        queued_since: Option<SystemTime>,
    ) -> Option<AttemptSpan> {
        let (parent, own) = self.job_context(job)?;
        let tracer = self.tracer()?.clone();
        if attempt <= 1 {
            NEXT_IDS.with(|c| c.set(Some((own.trace_id(), own.span_id()))));
            let mut builder = tracer
                .span_builder(format!("job {}", job.queue))
                .with_kind(SpanKind::Internal)
                .with_attributes(job_attributes(job));
            if let Some(t) = queued_since {
                builder = builder.with_start_time(t);
            }
            let producer = match parent {
                Some(sc) => Context::new().with_remote_span_context(sc),
                None => Context::new(),
            };
            let span = builder.start_with_context(&tracer, &producer);
            NEXT_IDS.with(|c| c.set(None));
            let mut span = span;
            span.end();
        }
        let mut attributes = job_attributes(job);
        attributes.extend([
            KeyValue::new("messaging.operation.type", "process"),
            KeyValue::new("messaging.operation.name", "process"),
            KeyValue::new("jobwarden.attempt", i64::from(attempt)),
            KeyValue::new("jobwarden.max_attempts", i64::from(max_attempts)),
        ]);
        let job_cx = Context::new().with_remote_span_context(own);
        let span = tracer
            .span_builder(format!("process {}", job.queue))
            .with_kind(SpanKind::Consumer)
            .with_attributes(attributes)
            .start_with_context(&tracer, &job_cx);
        Some(AttemptSpan {
            cx: job_cx.with_span(span),
            tracer,
            queue: job.queue.to_string(),
            ended: None,
            done: false,
        })
    }

    /// A claim statement for `n` messages of `subject` ran from `started` to now: a
    /// `receive` span linked to each sampled job's span.
    pub fn claimed(&self, queue: &str, subject: &str, started: SystemTime, jobs: &[JobRef<'_>]) {
        let Some(tracer) = self.tracer() else { return };
        let links: Vec<Link> = jobs
            .iter()
            .filter_map(|j| self.job_context(j))
            .map(|(_, own)| Link::with_context(own))
            .collect();
        // Only a claim that took a traced job is a span (and then always kept: see JobSampler).
        if links.is_empty() {
            return;
        }
        let mut span = tracer
            .span_builder(format!("receive {queue}"))
            .with_kind(SpanKind::Client)
            .with_start_time(started)
            .with_attributes([
                KeyValue::new("messaging.system", "nats"),
                KeyValue::new("messaging.destination.name", subject.to_string()),
                KeyValue::new("messaging.operation.type", "receive"),
                KeyValue::new("messaging.operation.name", "claim"),
                KeyValue::new("messaging.batch.message_count", jobs.len() as i64),
                KeyValue::new("jobwarden.queue", queue.to_string()),
            ])
            .with_links(links)
            .start(tracer);
        span.end();
    }

    /// A job is published (its first publication, a retry's, a chain step's, a recovered
    /// job's): a PRODUCER span under the job's context, from `started` to now.
    pub fn published(&self, job: &JobRef<'_>, why: &str, started: SystemTime) {
        let Some((_, own)) = self.job_context(job) else {
            return;
        };
        let Some(tracer) = self.tracer() else { return };
        let mut attributes = job_attributes(job);
        attributes.extend([
            KeyValue::new("messaging.operation.type", "send"),
            KeyValue::new("messaging.operation.name", "publish"),
            KeyValue::new("jobwarden.publish.reason", why.to_string()),
        ]);
        let mut span = tracer
            .span_builder(format!("send {}", job.subject))
            .with_kind(SpanKind::Producer)
            .with_start_time(started)
            .with_attributes(attributes)
            .start_with_context(tracer, &Context::new().with_remote_span_context(own));
        span.end();
    }

    /// Jobs were taken back from their owner (`why`: `owner_dead`, `stale`, `adopted`…): a
    /// `recover` span per sampled job, under the job's context.
    pub fn recovered(&self, jobs: &[JobRef<'_>], why: &str) {
        let Some(tracer) = self.tracer() else { return };
        for job in jobs {
            let Some((_, own)) = self.job_context(job) else {
                continue;
            };
            let mut attributes = job_attributes(job);
            attributes.push(KeyValue::new("jobwarden.recovery.reason", why.to_string()));
            let mut span = tracer
                .span_builder(format!("recover {}", job.queue))
                .with_kind(SpanKind::Internal)
                .with_attributes(attributes)
                .start_with_context(tracer, &Context::new().with_remote_span_context(own));
            span.end();
        }
    }

    /// Pushes `text` (this worker's `/metrics`) as OTLP metrics, if metrics are on.
    pub async fn push_metrics(&self, text: &str) -> Result<(), String> {
        let Some(inner) = &self.0 else { return Ok(()) };
        let Some(url) = &inner.otlp.metrics_url else {
            return Ok(());
        };
        let nanos = |t: SystemTime| {
            t.duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0)
        };
        let request = metrics::request(
            text,
            inner.resource.clone(),
            nanos(inner.started),
            nanos(SystemTime::now()),
        );
        let body = prost::Message::encode_to_vec(&request);
        let (status, _) = inner
            .transport
            .post(url, "application/x-protobuf", Vec::new(), body.into())
            .await?;
        if (200..300).contains(&status) {
            Ok(())
        } else {
            Err(format!("{url} answered {status}"))
        }
    }

    /// How often metrics are pushed, when they are.
    pub fn metrics_every(&self) -> Option<std::time::Duration> {
        let inner = self.0.as_ref()?;
        inner.otlp.metrics_url.as_ref()?;
        Some(inner.otlp.metrics_every)
    }

    /// Sends what is buffered and stops the exporters (blocking: call it from a blocking
    /// thread while the runtime still runs).
    pub fn shutdown(&self) {
        if let Some(provider) = self.0.as_ref().and_then(|i| i.provider.as_ref()) {
            let _ = provider.force_flush();
            let _ = provider.shutdown();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparents_read_and_write_alike() {
        let tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let sc = parse_traceparent(tp).unwrap();
        assert!(sc.is_remote() && sc.is_sampled());
        assert_eq!(traceparent(&sc), tp);
        assert!(
            parse_traceparent("00-00000000000000000000000000000000-b7ad6b7169203331-01").is_none()
        );
        assert!(parse_traceparent("garbage").is_none());
    }

    #[test]
    fn the_ratio_rule_is_opentelemetrys_own() {
        for ratio in [0.0, 0.1, 0.5, 0.99] {
            let sdk = opentelemetry_sdk::trace::Sampler::TraceIdRatioBased(ratio);
            let mut kept = 0;
            for i in 0..4000 {
                let t = job_trace_id(&i.to_string());
                let theirs = sdk
                    .should_sample(None, t, "x", &SpanKind::Internal, &[], &[])
                    .decision
                    == SamplingDecision::RecordAndSample;
                assert_eq!(ratio_keeps(ratio, t), theirs, "{ratio} {t}");
                kept += usize::from(theirs);
            }
            let share = kept as f64 / 4000.0;
            assert!((share - ratio).abs() < 0.03, "{ratio}: kept {share}");
        }
        // Parent-based: a remote parent's flag decides, whatever the ratio.
        let s = JobSampler {
            parent_based: true,
            ratio: 0.0,
        };
        let sampled = parse_traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
        let not = parse_traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00");
        let t = job_trace_id("x");
        assert!(s.keeps(sampled.as_ref(), t));
        assert!(!s.keeps(not.as_ref(), t));
        assert!(!s.keeps(None, t));
    }

    #[test]
    fn a_jobs_ids_depend_on_its_id_alone() {
        assert_eq!(job_span_id("a"), job_span_id("a"));
        assert_ne!(job_span_id("a"), job_span_id("b"));
        assert_eq!(job_trace_id("a"), job_trace_id("a"));
        assert!(job_trace_id("a") != TraceId::INVALID && job_span_id("a") != SpanId::INVALID);
    }
}
