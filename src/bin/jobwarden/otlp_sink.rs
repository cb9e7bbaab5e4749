//! An OTLP/HTTP sink for `jobwarden bench --trace-ratio`: takes every export, counts it and
//! throws it away, so the benchmark measures what tracing costs the worker (not a
//! collector's own work).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

#[derive(Default)]
pub struct Counts {
    pub trace_exports: AtomicU64,
    pub trace_bytes: AtomicU64,
    pub metric_exports: AtomicU64,
}

pub struct OtlpSink {
    pub url: String,
    pub counts: Arc<Counts>,
    task: tokio::task::JoinHandle<()>,
}

impl OtlpSink {
    pub async fn start() -> anyhow::Result<OtlpSink> {
        use axum::routing::post;
        let counts = Arc::new(Counts::default());
        let (t, m) = (counts.clone(), counts.clone());
        let app = axum::Router::new()
            .route(
                "/v1/traces",
                post(move |body: axum::body::Bytes| {
                    let t = t.clone();
                    async move {
                        t.trace_exports.fetch_add(1, Ordering::Relaxed);
                        t.trace_bytes
                            .fetch_add(body.len() as u64, Ordering::Relaxed);
                    }
                }),
            )
            .route(
                "/v1/metrics",
                post(move || {
                    let m = m.clone();
                    async move {
                        m.metric_exports.fetch_add(1, Ordering::Relaxed);
                    }
                }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(OtlpSink { url, counts, task })
    }

    /// What it took so far, in one line.
    pub fn summary(&self) -> String {
        let c = &self.counts;
        format!(
            "OTLP sink: {} trace exports ({} KiB), {} metric exports",
            c.trace_exports.load(Ordering::Relaxed),
            c.trace_bytes.load(Ordering::Relaxed) / 1024,
            c.metric_exports.load(Ordering::Relaxed)
        )
    }
}

impl Drop for OtlpSink {
    fn drop(&mut self) {
        self.task.abort();
    }
}
