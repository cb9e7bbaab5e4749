//! The `http` handler: POST each job as JSON to the application's local URL (`id`, `queue`,
//! `attempt`, `max_attempts`, `payload`, `progress_url`, `completion_token`, and `parents`:
//! the results of the jobs it follows, when it follows any).
//!
//! Status codes decide the outcome: 2xx succeeds (a JSON body becomes the job's result),
//! except a `202` with a `Jobwarden-Defer: <deadline>` header, which defers the job: it awaits
//! a completion or failure from outside with the request's `completion_token` (see
//! [`crate::completion`]); 408, 429 and 5xx are worth a retry (429/503 may say when, with `Retry-After`), any
//! other 4xx is permanent. Timeouts, cancellation and transport errors (the application
//! is down or restarting) are retried: the job must never be lost to an outage.
//!
//! The URL may carry credentials (`http://app:pw@…`, sent as `Basic` authorization): every
//! message shows it through [`crate::redact::url`], and an error response's body, which an
//! application may fill with what it was sent, is scrubbed of the password and of the
//! `Basic` credentials before it becomes part of the job's error.

use super::http_client::{Origin, Response};
use super::{Handler, HandlerResult, JobContext, JobError};
use crate::redact::Secrets;
use async_trait::async_trait;
use serde_json::Value;
use std::time::Duration;

/// How much of an error response's body goes into the job's error message.
const BODY_SNIPPET: usize = 500;

/// Hands jobs to an application listening on a (local) HTTP URL.
pub struct HttpHandler {
    /// The URL as messages show it: without its password.
    shown: String,
    /// The URL parsed once, with its pool of keep-alive connections; when it does not
    /// parse, each request reports why.
    origin: Result<Origin, String>,
    /// The URL's credentials, as written, decoded and encoded for `Authorization`.
    secrets: Secrets,
}

/// The request body: the job, borrowed (its payload is not copied to build it).
#[derive(serde::Serialize)]
struct JobRequest<'a> {
    id: &'a str,
    queue: &'a str,
    attempt: u32,
    max_attempts: u32,
    payload: &'a Value,
    /// The results of the jobs it follows (left out for a job that follows none).
    #[serde(skip_serializing_if = "Option::is_none")]
    parents: Option<&'a Value>,
    progress_url: String,
    /// Completes or fails this attempt from outside once the response deferred it.
    completion_token: String,
}

impl HttpHandler {
    pub fn new(url: &str) -> HttpHandler {
        let origin = Origin::parse(url);
        let mut secrets = Secrets::new();
        secrets.add_url(url);
        if let Some(auth) = origin.as_ref().ok().and_then(Origin::authorization) {
            secrets.add(auth.trim_start_matches("Basic "));
        }
        HttpHandler {
            shown: crate::redact::url(url),
            origin,
            secrets,
        }
    }

    /// The start of an error response's body for the job's error: scrubbed of the URL's
    /// credentials first (over enough of it that no secret is cut in two), then cut.
    fn snippet(&self, body: &[u8]) -> String {
        let window = &body[..body.len().min(BODY_SNIPPET + self.secrets.longest())];
        let text = String::from_utf8_lossy(window);
        let mut text = self.secrets.scrub(&text).into_owned();
        if text.len() > BODY_SNIPPET {
            let mut cut = BODY_SNIPPET;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
        }
        text.trim().to_string()
    }

    /// Sends the job and reads the whole response (status, `Retry-After`, body).
    async fn exchange(&self, job: &JobContext) -> std::io::Result<Response> {
        let origin = self
            .origin
            .as_ref()
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.clone()))?;
        let body = serde_json::to_vec(&JobRequest {
            id: &job.id,
            queue: &job.queue,
            attempt: job.attempt,
            max_attempts: job.max_attempts,
            payload: &job.payload,
            parents: job.parents.as_ref(),
            progress_url: job.progress_url(),
            completion_token: job.completion_token(),
        })?;
        let deadline_ms = u64::try_from(job.timeout.as_millis()).unwrap_or(u64::MAX);
        let mut req = origin.post(body.len());
        req.header("idempotency-key", job.idempotency_key().as_bytes())?;
        req.header("x-jobwarden-job-id", job.id.as_bytes())?;
        req.header("x-jobwarden-attempt", job.attempt.to_string().as_bytes())?;
        req.header("x-jobwarden-worker", job.worker_id.as_bytes())?;
        req.header(
            "x-jobwarden-deadline-ms",
            deadline_ms.to_string().as_bytes(),
        )?;
        if let Some(tp) = &job.traceparent {
            // It came with the message; a malformed one is left out rather than failing
            // the job.
            if req.header("traceparent", tp.as_bytes()).is_err() {
                tracing::debug!(job.id = %job.id, "traceparent {tp:?} is not a valid header value, not sent");
            }
        }
        origin.send(req, &body).await
    }

    /// Turns a complete response into the attempt's outcome.
    fn outcome(&self, code: u16, retry_after: Option<Duration>, body: &[u8]) -> HandlerResult {
        if (200..300).contains(&code) {
            if body.iter().all(u8::is_ascii_whitespace) {
                return Ok(None);
            }
            return match serde_json::from_slice::<Value>(body) {
                Ok(v) => Ok(Some(v)),
                Err(e) => {
                    tracing::debug!(url = %self.shown, "2xx body is not JSON ({e}), no result");
                    Ok(None)
                }
            };
        }
        let mut message = format!("HTTP {code} from {}", self.shown);
        let snippet = self.snippet(body);
        if !snippet.is_empty() {
            message.push_str(": ");
            message.push_str(&snippet);
        }
        match code {
            408 | 429 | 500..=599 => Err(JobError::Retry {
                message,
                // Only 429 and 503 give `Retry-After` a meaning for us.
                retry_after: if code == 429 || code == 503 {
                    retry_after
                } else {
                    None
                },
            }),
            400..=499 => Err(JobError::Permanent(message)),
            // 1xx/3xx: the URL points at the wrong thing. Operators fix configuration, so
            // keep the job (retry) rather than dead-letter it.
            _ => Err(JobError::retry(format!(
                "{message} (unexpected status; redirects are not followed, check handler.url)"
            ))),
        }
    }
}

#[async_trait]
impl Handler for HttpHandler {
    /// The request is dropped at `job.timeout`.
    fn enforces_timeout(&self) -> bool {
        true
    }

    async fn handle(&self, job: &JobContext) -> HandlerResult {
        // Dropping the exchange future aborts the request (its connection is closed),
        // which is how both the timeout and cancellation stop it. The timeout covers the
        // whole exchange, reading the body included.
        let res = tokio::select! {
            biased;
            _ = job.cancel.cancelled() => return Err(JobError::retry("cancelled")),
            r = tokio::time::timeout(job.timeout, self.exchange(job)) => r,
        };
        match res {
            Err(_elapsed) => Err(timed_out(job.timeout)),
            Ok(Ok(Response {
                status: 202,
                defer: Some(deadline),
                ..
            })) => match crate::completion::parse_deadline(&deadline) {
                Ok(d) => job.defer(d),
                Err(e) => Err(JobError::retry(format!(
                    "HTTP 202 from {} with {}: {e}",
                    self.shown,
                    crate::completion::DEFER_HEADER
                ))),
            },
            Ok(Ok(r)) => self.outcome(r.status, r.retry_after, &r.body),
            Ok(Err(e)) => Err(JobError::retry(format!(
                "request to {} failed: {} (is the application running?)",
                self.shown,
                self.secrets.scrub(&e.to_string())
            ))),
        }
    }
}

fn timed_out(timeout: Duration) -> JobError {
    JobError::retry(format!(
        "timed out after {}",
        humantime::format_duration(timeout)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// Serves one connection: reads one request, waits `delay`, answers `status` + `body`
    /// (after `headers`, each ending in CRLF). Returns the URL and the raw request text.
    async fn serve(
        status: &str,
        headers: &str,
        body: &str,
        delay: Duration,
    ) -> (String, tokio::task::JoinHandle<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/jobs", listener.local_addr().unwrap());
        let len = body.len();
        let response = format!(
            "HTTP/1.1 {status}\r\n{headers}Content-Length: {len}\r\nConnection: close\r\n\r\n{body}"
        );
        let task = tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.unwrap();
            let (mut req, mut chunk) = (String::new(), [0u8; 4096]);
            // The request is complete once its body (a JSON object) parses.
            let complete = |r: &str| {
                let body = r.split_once("\r\n\r\n").map(|(_, b)| b);
                body.is_some_and(|b| serde_json::from_str::<Value>(b).is_ok())
            };
            while !complete(&req) {
                let n = sock.read(&mut chunk).await.unwrap();
                assert!(n > 0, "request cut short: {req}");
                req.push_str(&String::from_utf8_lossy(&chunk[..n]));
            }
            tokio::time::sleep(delay).await;
            let _ = sock.write_all(response.as_bytes()).await;
            req
        });
        (url, task)
    }

    async fn call(url: &str, job: &JobContext) -> HandlerResult {
        HttpHandler::new(url).handle(job).await
    }

    fn job() -> JobContext {
        let mut job = JobContext::detached("job-1", "emails", json!({"to": "a@b.c"}));
        (job.attempt, job.max_attempts) = (2, 5);
        job.api_base = "http://127.0.0.1:7433".into();
        job.traceparent = Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into());
        job
    }

    #[tokio::test]
    async fn success_and_request_shape() {
        let (url, server) = serve("200 OK", "", r#"{"ok":true}"#, Duration::ZERO).await;
        assert_eq!(call(&url, &job()).await, Ok(Some(json!({"ok": true}))));

        let req = server.await.unwrap();
        let (head, body) = req.split_once("\r\n\r\n").unwrap();
        // Every header line ends in CRLF (the last one's was split off with the blank line).
        let head = format!("{}\r\n", head.to_ascii_lowercase());
        assert!(head.starts_with("post /jobs http/1.1\r\n"), "{req}");
        for h in [
            "idempotency-key: job-1",
            "x-jobwarden-job-id: job-1",
            "x-jobwarden-attempt: 2",
            "x-jobwarden-deadline-ms: 30000",
            "traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ] {
            assert!(
                head.contains(&format!("\r\n{h}\r\n")),
                "{h} missing in {req}"
            );
        }
        let expected = json!({
            "id": "job-1", "queue": "emails", "attempt": 2, "max_attempts": 5,
            "payload": {"to": "a@b.c"},
            "progress_url": "http://127.0.0.1:7433/v1/jobs/job-1/progress?lease=1",
            "completion_token": job().completion_token(),
        });
        assert_eq!(serde_json::from_str::<Value>(body).unwrap(), expected);

        // A 202 with Jobwarden-Defer defers the job (a plain 202 succeeds, below).
        let (url, _s) = serve(
            "202 Accepted",
            "Jobwarden-Defer: 10m\r\n",
            "{}",
            Duration::ZERO,
        )
        .await;
        let ctx = job();
        assert_eq!(call(&url, &ctx).await, Ok(None));
        assert_eq!(ctx.deferred(), Some(Duration::from_secs(600)));
        let (url, _s) = serve("202 Accepted", "", "{}", Duration::ZERO).await;
        let ctx = job();
        assert_eq!(call(&url, &ctx).await, Ok(Some(json!({}))));
        assert_eq!(ctx.deferred(), None);

        // No body, or not JSON: success without a result.
        let (url, _s) = serve("204 No Content", "", "", Duration::ZERO).await;
        assert_eq!(call(&url, &job()).await, Ok(None));
        let (url, _s) = serve("200 OK", "", "done", Duration::ZERO).await;
        assert_eq!(call(&url, &job()).await, Ok(None));
    }

    #[tokio::test]
    async fn error_statuses() {
        let ra = "Retry-After: 7\r\n";
        let (url, _s) = serve("503 Service Unavailable", ra, "maintenance", Duration::ZERO).await;
        let message = format!("HTTP 503 from {url}: maintenance");
        let retry_after = Some(Duration::from_secs(7));
        assert_eq!(
            call(&url, &job()).await,
            Err(JobError::Retry {
                message,
                retry_after
            })
        );

        let (url, _s) = serve("404 Not Found", "", "no route!", Duration::ZERO).await;
        let message = format!("HTTP 404 from {url}: no route!");
        assert_eq!(call(&url, &job()).await, Err(JobError::Permanent(message)));
    }

    #[tokio::test]
    async fn connection_refused_is_retried() {
        let dead = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/jobs", dead.local_addr().unwrap());
        drop(dead);
        let res = call(&url, &job()).await;
        assert!(
            matches!(&res, Err(JobError::Retry { message, retry_after: None })
                if message.starts_with(&format!("request to {url} failed: "))
                    && message.ends_with("(is the application running?)")),
            "{res:?}"
        );
    }

    #[tokio::test]
    async fn timeout_and_cancellation_abort_the_request() {
        let (url, _s) = serve("200 OK", "", "", Duration::from_secs(10)).await;
        let mut job = job();
        job.timeout = Duration::from_millis(300);
        let started = std::time::Instant::now();
        assert_eq!(
            call(&url, &job).await,
            Err(JobError::retry("timed out after 300ms"))
        );
        assert!(started.elapsed() < Duration::from_secs(2));

        let (url, _s) = serve("200 OK", "", "", Duration::from_secs(10)).await;
        let job = self::job();
        let cancel = job.cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            cancel.cancel();
        });
        assert_eq!(call(&url, &job).await, Err(JobError::retry("cancelled")));
    }

    #[tokio::test]
    async fn errors_show_the_url_without_its_credentials() {
        // Refused: the URL is named, its password masked.
        let dead = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let at = dead.local_addr().unwrap();
        drop(dead);
        let res = call(&format!("http://app:s3cr3t-Pw@{at}/jobs"), &job()).await;
        let expected = format!("request to http://app:****@{at}/jobs failed: ");
        assert!(
            matches!(&res, Err(JobError::Retry { message, .. }) if message.starts_with(&expected)),
            "{res:?}"
        );

        // An error page that repeats the credentials, decoded and as sent.
        let basic = "YXBwOnAmc3MtV29yZA=="; // app:p&ss-Word
        let page = format!("denied p&ss-Word, p%26ss-Word, authorization: Basic {basic}");
        let (url, _s) = serve("500 Oops", "", &page, Duration::ZERO).await;
        let url = url.replace("http://", "http://app:p%26ss-Word@");
        let res = call(&url, &job()).await;
        let shown = url.replace("p%26ss-Word", "****");
        assert_eq!(
            res,
            Err(JobError::retry(format!(
                "HTTP 500 from {shown}: denied ****, ****, authorization: Basic ****"
            )))
        );

        // A password across the cut of the body is masked whole, not cut in two.
        let page = format!("{}s3cr3t-Pw and more", "x".repeat(BODY_SNIPPET - 3));
        let (url, _s) = serve("500 Oops", "", &page, Duration::ZERO).await;
        let url = url.replace("http://", "http://app:s3cr3t-Pw@");
        let Err(JobError::Retry { message, .. }) = call(&url, &job()).await else {
            panic!("a 500 is retried");
        };
        assert!(!message.contains("s3c"), "{message}");
        assert!(message.ends_with("xxx***"), "{message}");

        // A URL that does not parse is named without its password too.
        let res = call("http://app:s3cr3t-Pw@127.0.0.1:99999/jobs", &job()).await;
        assert!(
            matches!(&res, Err(JobError::Retry { message, .. })
                if message.contains("http://app:****@127.0.0.1:99999/jobs") && !message.contains("s3cr3t")),
            "{res:?}"
        );
    }

    #[tokio::test]
    async fn status_classification() {
        let h = HttpHandler::new("http://127.0.0.1:1/x");
        let secs = Some(Duration::from_secs(3));
        let kind = |code, retry_after, body: &[u8]| match h.outcome(code, retry_after, body) {
            Ok(_) => "ok".to_string(),
            Err(JobError::Retry { retry_after, .. }) => format!("retry {retry_after:?}"),
            Err(JobError::Permanent(m)) => format!("permanent {}", m.len()),
        };
        assert_eq!(kind(408, None, b""), "retry None");
        assert_eq!(kind(429, secs, b""), "retry Some(3s)");
        // Retry-After only counts for 429 and 503.
        assert_eq!(kind(500, secs, b""), "retry None");
        assert_eq!(kind(302, None, b""), "retry None");
        // The body is cut to 500 bytes in the message.
        assert_eq!(kind(422, None, &[b'x'; 2000]), "permanent 536");
    }
}
