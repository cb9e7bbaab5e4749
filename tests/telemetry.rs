//! OpenTelemetry over OTLP against a real receiver: an OTLP/HTTP (protobuf) server in the
//! test, decoding what the worker sends with the OpenTelemetry protocol's own types. The
//! spans read back must form the tree docs/operations.md draws, for one job (retried) and
//! for a chained pipeline; `/metrics` must arrive as OTLP metrics with the same numbers.

mod common;

use axum::extract::State;
use axum::routing::post;
use common::TestEnv;
use jobwarden::handler::{from_fn, JobError};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use prost::Message as _;
use serde_json::json;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A span as read back: ids in hex, attributes as text.
#[derive(Debug, Clone)]
struct Got {
    name: String,
    trace: String,
    id: String,
    parent: String,
    kind: i32,
    attrs: HashMap<String, String>,
    links: Vec<String>,
    error: bool,
    service: String,
}

impl Got {
    fn attr(&self, key: &str) -> &str {
        self.attrs.get(key).map(String::as_str).unwrap_or("")
    }
}

/// SpanKind in OTLP's numbering.
const INTERNAL: i32 = 1;
const CLIENT: i32 = 3;
const PRODUCER: i32 = 4;
const CONSUMER: i32 = 5;

#[derive(Clone, Default)]
struct Received {
    spans: Arc<Mutex<Vec<Got>>>,
    metrics: Arc<Mutex<Vec<ExportMetricsServiceRequest>>>,
}

fn text(v: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    match v.as_ref().and_then(|v| v.value.as_ref()) {
        Some(Any::StringValue(s)) => s.clone(),
        Some(Any::IntValue(i)) => i.to_string(),
        Some(Any::BoolValue(b)) => b.to_string(),
        Some(Any::DoubleValue(d)) => d.to_string(),
        _ => String::new(),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

async fn traces(State(r): State<Received>, body: bytes::Bytes) -> axum::http::StatusCode {
    let Ok(req) = ExportTraceServiceRequest::decode(body) else {
        return axum::http::StatusCode::BAD_REQUEST;
    };
    let mut spans = r.spans.lock().unwrap();
    for rs in req.resource_spans {
        let service = rs
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|a| a.key == "service.name")
            .map(|a| text(&a.value))
            .unwrap_or_default();
        for ss in rs.scope_spans {
            for s in ss.spans {
                spans.push(Got {
                    name: s.name,
                    trace: hex(&s.trace_id),
                    id: hex(&s.span_id),
                    parent: hex(&s.parent_span_id),
                    kind: s.kind,
                    attrs: s
                        .attributes
                        .iter()
                        .map(|a| (a.key.clone(), text(&a.value)))
                        .collect(),
                    links: s.links.iter().map(|l| hex(&l.span_id)).collect(),
                    error: s.status.as_ref().is_some_and(|st| st.code == 2),
                    service: service.clone(),
                });
            }
        }
    }
    axum::http::StatusCode::OK
}

async fn metrics(State(r): State<Received>, body: bytes::Bytes) -> axum::http::StatusCode {
    match ExportMetricsServiceRequest::decode(body) {
        Ok(req) => {
            r.metrics.lock().unwrap().push(req);
            axum::http::StatusCode::OK
        }
        Err(_) => axum::http::StatusCode::BAD_REQUEST,
    }
}

/// An OTLP/HTTP receiver on a free port: its base URL and what it received.
async fn receiver() -> (String, Received) {
    let received = Received::default();
    let app = axum::Router::new()
        .route("/v1/traces", post(traces))
        .route("/v1/metrics", post(metrics))
        .with_state(received.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, received)
}

const PRODUCER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PRODUCER_SPAN: &str = "00f067aa0ba902b7";

fn config(endpoint: &str, extra: &str) -> String {
    format!(
        "[telemetry]\notlp_endpoint = \"{endpoint}\"\nservice_name = \"jw-test\"\n\
         metrics_every = \"1s\"\n{extra}\n\
         [queues.work]\nconcurrency = 4\nmax_attempts = 3\n\
         backoff = {{ kind = \"fixed\", base = \"50ms\" }}\nhandler = {{ kind = \"rust\", name = \"h\" }}\n"
    )
}

/// Publishes `body` to jobs.work with the producer's traceparent.
async fn publish_traced(env: &TestEnv, body: serde_json::Value) {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(
        "traceparent",
        format!("00-{PRODUCER_TRACE}-{PRODUCER_SPAN}-01").as_str(),
    );
    env.broker
        .js
        .publish_with_headers("jobs.work", headers, body.to_string().into())
        .await
        .unwrap()
        .await
        .unwrap();
}

/// The spans received, once `ready` holds of them (or after 15 s).
async fn spans_when(received: &Received, ready: impl Fn(&[Got]) -> bool) -> Vec<Got> {
    common::wait_for(Duration::from_secs(15), || async {
        ready(&received.spans.lock().unwrap())
    })
    .await;
    received.spans.lock().unwrap().clone()
}

fn one<'a>(spans: &'a [Got], what: &str, pick: impl Fn(&Got) -> bool) -> &'a Got {
    let found: Vec<&Got> = spans.iter().filter(|s| pick(s)).collect();
    assert_eq!(found.len(), 1, "one {what}: {found:#?}\nall: {spans:#?}");
    found[0]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_jobs_trace_is_read_back_as_a_tree_under_its_producer() {
    let (url, received) = receiver().await;
    let env = TestEnv::new(&config(&url, "")).await;
    // The handler sees the run's own context; its first attempt fails.
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let s = seen.clone();
    let h = from_fn(move |job| {
        let s = s.clone();
        async move {
            s.lock()
                .unwrap()
                .push(job.traceparent.clone().unwrap_or_default());
            if job.attempt < 2 {
                return Err(JobError::retry("flaky"));
            }
            Ok(Some(json!({"ok": true})))
        }
    });
    let w = env.worker(&[("h", h)]).await;
    publish_traced(&env, json!({"id": "traced-1", "payload": {"n": 1}})).await;
    assert!(env.wait_status("traced-1", "completed", 20).await);
    w.shutdown().await;
    let spans = spans_when(&received, |s| {
        s.iter().filter(|g| g.name.starts_with("settle")).count() >= 2
    })
    .await;
    let job_span_id = hex(&jobwarden::telemetry::job_span_id("traced-1").to_bytes());

    // The job's span, under the producer's, with the id derived from the job's.
    let job = one(&spans, "job span", |s| s.name == "job work");
    assert_eq!(job.trace, PRODUCER_TRACE);
    assert_eq!(job.parent, PRODUCER_SPAN);
    assert_eq!(job.id, job_span_id);
    assert_eq!(job.kind, INTERNAL);
    assert_eq!(job.service, "jw-test");
    assert_eq!(job.attr("messaging.message.id"), "traced-1");

    // Two runs, each the job span's child, each with its settle.
    let mut runs: Vec<&Got> = spans.iter().filter(|s| s.name == "process work").collect();
    runs.sort_by_key(|s| s.attr("jobwarden.attempt").to_string());
    assert_eq!(runs.len(), 2, "{spans:#?}");
    for (n, run) in runs.iter().enumerate() {
        assert_eq!(run.trace, PRODUCER_TRACE);
        assert_eq!(run.parent, job_span_id, "run {n}");
        assert_eq!(run.kind, CONSUMER);
        assert_eq!(run.attr("messaging.system"), "nats");
        assert_eq!(run.attr("messaging.destination.name"), "jobs.work");
        assert_eq!(run.attr("messaging.message.id"), "traced-1");
        assert_eq!(run.attr("messaging.operation.type"), "process");
        assert_eq!(run.attr("jobwarden.attempt"), (n + 1).to_string());
    }
    assert!(runs[0].error, "the failed run's status is an error");
    assert!(!runs[1].error);
    assert_eq!(runs[0].attr("jobwarden.outcome"), "retry");
    assert_eq!(runs[1].attr("jobwarden.outcome"), "completed");
    for (run, outcome) in runs.iter().zip(["retry", "completed"]) {
        let settle = one(&spans, "settle", |s| s.parent == run.id);
        assert_eq!(settle.name, "settle work");
        assert_eq!(settle.kind, CLIENT);
        assert_eq!(settle.trace, PRODUCER_TRACE);
        assert_eq!(settle.attr("jobwarden.outcome"), outcome);
        assert_eq!(settle.attr("messaging.operation.type"), "settle");
    }
    // The retry's publication, under the job.
    let again = one(&spans, "retry's publish", |s| s.name == "send jobs.work");
    assert_eq!(
        (again.kind, again.parent.as_str()),
        (PRODUCER, job_span_id.as_str())
    );
    assert_eq!(again.attr("jobwarden.publish.reason"), "again");
    // The handler was given each run's own context.
    let handed = seen.lock().unwrap().clone();
    assert_eq!(
        handed,
        runs.iter()
            .map(|r| format!("00-{PRODUCER_TRACE}-{}-01", r.id))
            .collect::<Vec<_>>()
    );
    // Each claim that took it: a receive span linked to the job, with the batch's size.
    let claims: Vec<&Got> = spans
        .iter()
        .filter(|s| s.name == "receive work" && s.links.contains(&job_span_id))
        .collect();
    assert_eq!(claims.len(), 2, "{spans:#?}");
    for c in claims {
        assert_eq!(c.kind, CLIENT);
        assert_eq!(c.attr("messaging.batch.message_count"), "1");
        assert_eq!(c.attr("messaging.operation.type"), "receive");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipelines_steps_are_one_trace_each_under_the_run_that_made_it() {
    let (url, received) = receiver().await;
    let env = TestEnv::new(&config(&url, "")).await;
    let h = from_fn(|_job| async move { Ok(Some(json!({"ok": true}))) });
    let w = env.worker(&[("h", h)]).await;
    publish_traced(
        &env,
        json!({"id": "pipe-a", "payload": {}, "then": [
            {"id": "pipe-b", "queue": "work", "payload": {}, "then": [
                {"id": "pipe-c", "queue": "work", "payload": {}}
            ]}
        ]}),
    )
    .await;
    assert!(env.wait_status("pipe-c", "completed", 20).await);
    w.shutdown().await;
    let spans = spans_when(&received, |s| {
        s.iter().filter(|g| g.name == "process work").count() >= 3
    })
    .await;
    let run_of = |id: &str| {
        one(&spans, &format!("run of {id}"), |s| {
            s.name == "process work" && s.attr("messaging.message.id") == id
        })
        .clone()
    };
    let job_of = |id: &str| {
        one(&spans, &format!("job span of {id}"), |s| {
            s.name == "job work" && s.attr("messaging.message.id") == id
        })
        .clone()
    };
    // A under the producer; B under A's run; C under B's run: one trace.
    let (a, b, c) = (job_of("pipe-a"), job_of("pipe-b"), job_of("pipe-c"));
    assert_eq!(a.parent, PRODUCER_SPAN);
    assert_eq!(
        b.parent,
        run_of("pipe-a").id,
        "B hangs from the run of A that made it"
    );
    assert_eq!(
        c.parent,
        run_of("pipe-b").id,
        "C hangs from the run of B that made it"
    );
    for id in ["pipe-a", "pipe-b", "pipe-c"] {
        assert_eq!(job_of(id).trace, PRODUCER_TRACE, "{id}");
        assert_eq!(run_of(id).trace, PRODUCER_TRACE, "{id}");
        assert_eq!(run_of(id).parent, job_of(id).id, "{id}");
    }
    // B and C were published by the scheduler: their publications are in the tree too.
    for id in ["pipe-b", "pipe-c"] {
        let sent = one(&spans, &format!("publish of {id}"), |s| {
            s.name == "send jobs.work" && s.attr("messaging.message.id") == id
        });
        assert_eq!(sent.parent, job_of(id).id);
        assert_eq!(sent.attr("jobwarden.publish.reason"), "due");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_without_a_traceparent_starts_its_own_trace_and_sampling_keeps_or_drops_it_whole() {
    let (url, received) = receiver().await;
    // Kept: every root at ratio 1.
    let env = TestEnv::new(&config(&url, "")).await;
    let h = from_fn(|_job| async move { Ok(None) });
    let w = env.worker(&[("h", h.clone())]).await;
    env.publish_raw("work", json!({"id": "root-1", "payload": {}}).to_string())
        .await;
    assert!(env.wait_status("root-1", "completed", 20).await);
    w.shutdown().await;
    let spans = spans_when(&received, |s| s.iter().any(|g| g.name == "settle work")).await;
    let trace = jobwarden::telemetry::job_trace_id("root-1").to_string();
    let job = one(&spans, "job span", |s| s.name == "job work");
    assert_eq!(
        (job.trace.as_str(), job.parent.as_str()),
        (trace.as_str(), "")
    );
    assert!(spans
        .iter()
        .filter(|s| s.name != "receive work")
        .all(|s| s.trace == trace));
    drop(env);

    // Dropped: at ratio 0 a job without a sampled parent leaves no span at all, and a
    // producer's sampled trace is followed all the same (parent-based).
    received.spans.lock().unwrap().clear();
    let env = TestEnv::new(&config(&url, "sample_ratio = 0.0")).await;
    let w = env.worker(&[("h", h)]).await;
    env.publish_raw("work", json!({"id": "root-2", "payload": {}}).to_string())
        .await;
    publish_traced(&env, json!({"id": "followed", "payload": {}})).await;
    assert!(env.wait_status("root-2", "completed", 20).await);
    assert!(env.wait_status("followed", "completed", 20).await);
    w.shutdown().await;
    let spans = spans_when(&received, |s| s.iter().any(|g| g.name == "settle work")).await;
    assert!(
        spans
            .iter()
            .all(|s| s.attr("messaging.message.id") != "root-2"),
        "{spans:#?}"
    );
    assert!(spans
        .iter()
        .any(|s| s.name == "process work" && s.attr("messaging.message.id") == "followed"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_arrive_over_otlp_with_the_numbers_of_the_metrics_endpoint() {
    let (url, received) = receiver().await;
    let env = TestEnv::new(&config(&url, "")).await;
    let h = from_fn(|_job| async move { Ok(None) });
    let w = env.worker(&[("h", h)]).await;
    for i in 0..5 {
        env.publish_raw(
            "work",
            json!({"id": format!("m-{i}"), "payload": {}}).to_string(),
        )
        .await;
    }
    assert!(env.wait_count("completed", 5, 20).await);
    let completed_in = |req: &ExportMetricsServiceRequest| -> Option<f64> {
        let m = req.resource_metrics[0].scope_metrics[0]
            .metrics
            .iter()
            .find(|m| m.name == "jobwarden_jobs")?;
        let Some(Data::Sum(sum)) = &m.data else {
            return None;
        };
        assert!(sum.is_monotonic);
        sum.data_points
            .iter()
            .find(|p| {
                p.attributes
                    .iter()
                    .any(|a| a.key == "outcome" && text(&a.value) == "completed")
                    && p.attributes
                        .iter()
                        .any(|a| a.key == "queue" && text(&a.value) == "work")
            })
            .and_then(|p| match p.value {
                Some(
                    opentelemetry_proto::tonic::metrics::v1::number_data_point::Value::AsDouble(v),
                ) => Some(v),
                _ => None,
            })
    };
    let arrived = common::wait_for(Duration::from_secs(10), || async {
        received
            .metrics
            .lock()
            .unwrap()
            .iter()
            .any(|r| completed_in(r) == Some(5.0))
    })
    .await;
    let prometheus = common::metrics(&w).await;
    assert!(
        arrived,
        "no OTLP reading with 5 completed jobs; /metrics says:\n{prometheus}"
    );
    assert!(
        prometheus.contains("jobwarden_jobs_total{queue=\"work\",outcome=\"completed\"} 5"),
        "{prometheus}"
    );
    let last = received.metrics.lock().unwrap().last().cloned().unwrap();
    let resource = &last.resource_metrics[0]
        .resource
        .as_ref()
        .unwrap()
        .attributes;
    assert!(resource
        .iter()
        .any(|a| a.key == "service.name" && text(&a.value) == "jw-test"));
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovered_job_shows_its_recovery_and_its_next_run_under_the_same_job() {
    let (url, received) = receiver().await;
    // Short thresholds (in [worker]), so a dead worker's job is taken back within seconds.
    let env = TestEnv::new(&format!(
        "heartbeat_every = \"500ms\"\ndead_after = \"3s\"\nreap_every = \"200ms\"\n{}",
        config(&url, "")
    ))
    .await;
    // The first attempt hangs; the next completes.
    let h = from_fn(|job| async move {
        if job.attempt < 2 {
            tokio::time::sleep(Duration::from_secs(60)).await;
        }
        Ok(None)
    });
    let first = env.worker(&[("h", h.clone())]).await;
    publish_traced(&env, json!({"id": "rec-1", "payload": {}})).await;
    assert!(env.wait_status("rec-1", "processing", 10).await);
    first.abort(); // as a crash: nothing settled, its heartbeat stops
    let second = env.worker(&[("h", h)]).await;
    assert!(env.wait_status("rec-1", "completed", 30).await);
    second.shutdown().await;
    let spans = spans_when(&received, |s| {
        s.iter().any(|g| g.name == "recover work") && s.iter().any(|g| g.name == "settle work")
    })
    .await;
    let job_span_id = hex(&jobwarden::telemetry::job_span_id("rec-1").to_bytes());
    let recover = one(&spans, "recover span", |s| s.name == "recover work");
    assert_eq!(recover.trace, PRODUCER_TRACE);
    assert_eq!(recover.parent, job_span_id);
    // Its owner stopped beating: the reaper's reason (a start-up reconciliation would say
    // `restarted`, were the dead worker's process gone).
    assert!(
        ["owner_dead", "restarted"].contains(&recover.attr("jobwarden.recovery.reason")),
        "{recover:#?}"
    );
    assert_eq!(recover.attr("messaging.message.id"), "rec-1");
    let rerun = one(&spans, "the second run", |s| {
        s.name == "process work" && s.attr("jobwarden.attempt") == "2"
    });
    assert_eq!(rerun.parent, job_span_id);
    assert_eq!(rerun.attr("jobwarden.outcome"), "completed");
    // Published again by the scheduler after the recovery, under the job too.
    let again = one(&spans, "the republication", |s| s.name == "send jobs.work");
    assert_eq!(again.parent, job_span_id);
}
