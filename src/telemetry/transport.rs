//! OTLP requests over the worker's own HTTP/1.1 client (`handler::http_client`): no second
//! HTTP stack for a few posts a second. The SDK's batch processor exports from a thread of
//! its own, outside tokio: each request is run on the worker's runtime and awaited from there.

use crate::handler::http_client::Origin;
use bytes::Bytes;
use http::{Request, Response};
use opentelemetry_http::{HttpClient, HttpError};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The longest an export may take; the SDK drops the batch after it.
pub const EXPORT_LIMIT: Duration = Duration::from_secs(10);

/// Posts to OTLP endpoints (one pooled origin per URL) on the runtime it was made on.
#[derive(Clone)]
pub struct Otlp {
    runtime: tokio::runtime::Handle,
    origins: Arc<Mutex<HashMap<String, Arc<Origin>>>>,
    /// The URLs whose last export failed: said once when one starts failing, once when it
    /// works again.
    failing: Arc<Mutex<std::collections::HashSet<String>>>,
}

impl std::fmt::Debug for Otlp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Otlp")
    }
}

impl Otlp {
    /// Runs its requests on the current runtime (call it inside the worker's).
    pub fn on_current_runtime() -> Otlp {
        Otlp {
            runtime: tokio::runtime::Handle::current(),
            origins: Arc::default(),
            failing: Arc::default(),
        }
    }

    fn origin(&self, url: &str) -> Result<Arc<Origin>, String> {
        let mut origins = self.origins.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(o) = origins.get(url) {
            return Ok(o.clone());
        }
        let o = Arc::new(Origin::parse(url)?);
        origins.insert(url.to_string(), o.clone());
        Ok(o)
    }

    /// Posts `body` (`content_type`, extra `headers`) to `url`; returns the status and body.
    pub async fn post(
        &self,
        url: &str,
        content_type: &str,
        headers: Vec<(String, Vec<u8>)>,
        body: Bytes,
    ) -> Result<(u16, Vec<u8>), String> {
        let origin = self.origin(url)?;
        let content_type = content_type.to_string();
        let call = async move {
            let mut req = origin.post_as(body.len(), &content_type);
            for (name, value) in &headers {
                req.header(name, value).map_err(|e| e.to_string())?;
            }
            let resp = origin.send(req, &body).await.map_err(|e| e.to_string())?;
            Ok::<_, String>((resp.status, resp.body))
        };
        let task = self
            .runtime
            .spawn(async move { tokio::time::timeout(EXPORT_LIMIT, call).await });
        let answer = match task.await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err(format!("no answer within {}s", EXPORT_LIMIT.as_secs())),
            Err(e) => Err(format!("the export task ended: {e}")),
        };
        self.said(url, &answer);
        answer
    }

    /// Says once when exports to `url` start failing, and once when they work again.
    fn said(&self, url: &str, answer: &Result<(u16, Vec<u8>), String>) {
        let failed = match answer {
            Ok((status, _)) if (200..300).contains(status) => None,
            Ok((status, body)) => Some(format!(
                "answered {status}: {}",
                String::from_utf8_lossy(&body[..body.len().min(200)])
            )),
            Err(e) => Some(e.clone()),
        };
        let mut failing = self.failing.lock().unwrap_or_else(|e| e.into_inner());
        match failed {
            Some(cause) if failing.insert(url.to_string()) => tracing::warn!(
                "OpenTelemetry: the export to {url} failed ({cause}); what is not exported \
                 meanwhile is dropped (said once, and again when it works)"
            ),
            None if failing.remove(url) => {
                tracing::info!("OpenTelemetry: the export to {url} works again")
            }
            _ => {}
        }
    }
}

#[async_trait::async_trait]
impl HttpClient for Otlp {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let (parts, body) = request.into_parts();
        let url = parts.uri.to_string();
        let content_type = parts
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("application/x-protobuf")
            .to_string();
        let headers = parts
            .headers
            .iter()
            .filter(|(name, _)| {
                !matches!(
                    name.as_str(),
                    "content-type" | "content-length" | "host" | "connection"
                )
            })
            .map(|(name, value)| (name.as_str().to_string(), value.as_bytes().to_vec()))
            .collect();
        let (status, body) = self.post(&url, &content_type, headers, body).await?;
        Ok(Response::builder().status(status).body(Bytes::from(body))?)
    }
}
