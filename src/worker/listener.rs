//! How every HTTP listener of the worker is served (the local API, the ops listener, the
//! dashboard): one function, with the limits a busy or careless neighbour needs.
//!
//! - **Header-read timeout.** A connection that has not sent a whole request head within
//!   [`HEADER_READ_TIMEOUT`] is closed — a new one, and an idle keep-alive one alike (hyper
//!   starts the timer whenever it waits for a request head). `axum::serve` has no such
//!   timeout, so a neighbour that opens connections and sends half a line held a task and a
//!   file descriptor each, for ever.
//! - **Header size.** A request head (start line with the URL, and headers) over
//!   [`MAX_HEADER_BYTES`] is answered `431` and the connection closed.
//! - **Bodies.** A route that reads a body reads it with [`LimitedBody`]: at most its own
//!   limit (`413` past it, before reading when `Content-Length` says so), all of it within
//!   [`BODY_READ_TIMEOUT`] (`408` otherwise). Routes that read no body never read one.
//! - **Cross-site requests.** [`NotCrossSite`] refuses a state-changing request that a
//!   browser sent from another site (`403`): nothing a web page shows can drain a worker or
//!   act on the dashboard. Programs (curl, the kubelet, the application) send neither
//!   `Origin` nor `Sec-Fetch-Site` and pass.
//!
//! - **Connections.** At most [`MAX_CONNECTIONS`] are served at once per listener; past it
//!   the listener stops accepting until one closes (new ones wait in the kernel's backlog),
//!   so a neighbour opening connections by the thousand cannot take every file descriptor
//!   of the process, which the worker's own connections to PostgreSQL and NATS need.
//!
//! On cancel the listener stops accepting, asks open connections to finish their request and
//! close, and waits at most [`CLOSE_WAIT`] for them.

use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::{header, request::Parts, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use bytes::Bytes;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

/// Longest a client may take to send a request head (from the connection's start, or from
/// the end of its previous request).
pub(crate) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest request head (start line and headers) accepted.
pub(crate) const MAX_HEADER_BYTES: usize = 16 * 1024;
/// Longest a client may take to send a request body, once its head arrived.
pub(crate) const BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long open connections get to finish after the listener is told to stop.
const CLOSE_WAIT: Duration = Duration::from_secs(5);
/// Most connections served at once by one listener.
pub(crate) const MAX_CONNECTIONS: usize = 256;
/// Pause after a failed accept (out of file descriptors, …) before the next one.
const ACCEPT_PAUSE: Duration = Duration::from_millis(200);

/// Serves `app` on `listener` until `cancel`; `name` says which listener in the log.
pub(crate) async fn serve(
    name: &'static str,
    listener: TcpListener,
    app: Router,
    cancel: CancellationToken,
) {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_header_size(MAX_HEADER_BYTES);
    let graceful = GracefulShutdown::new();
    let mut accept_failures = 0u64;
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let permit = tokio::select! {
            _ = cancel.cancelled() => break,
            p = slots.clone().acquire_owned() => p.expect("the semaphore is never closed"),
        };
        let stream = tokio::select! {
            _ = cancel.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // One line for the first failure of a run, then every 100th: a
                    // neighbour exhausting file descriptors must not flood the log too.
                    if accept_failures.is_multiple_of(100) {
                        warn!(listener = name, cause = %e, failures = accept_failures + 1,
                              "cannot accept a connection; retrying");
                    }
                    accept_failures += 1;
                    tokio::time::sleep(ACCEPT_PAUSE).await;
                    continue;
                }
            },
        };
        accept_failures = 0;
        let service = TowerToHyperService::new(app.clone());
        let conn = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            // Timeouts, resets and malformed requests end one connection; nothing to act on.
            if let Err(e) = conn.await {
                debug!(listener = name, cause = %e, "connection closed");
            }
            drop(permit);
        });
    }
    drop(listener);
    if tokio::time::timeout(CLOSE_WAIT, graceful.shutdown())
        .await
        .is_err()
    {
        warn!(
            listener = name,
            "connections still open {}s after the listener stopped; leaving them",
            CLOSE_WAIT.as_secs()
        );
    }
}

/// A request body of at most `MAX` bytes, received within [`BODY_READ_TIMEOUT`]. Refusals
/// name the limit: `413` over it, `408` too slow, `400` a broken body.
pub(crate) struct LimitedBody<const MAX: usize>(pub Bytes);

impl<S: Send + Sync, const MAX: usize> FromRequest<S> for LimitedBody<MAX> {
    type Rejection = Response;

    async fn from_request(req: Request, _state: &S) -> Result<Self, Response> {
        let too_large = || {
            (
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("request body over {MAX} bytes, the most this route accepts; send less"),
            )
                .into_response()
        };
        let declared = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > MAX as u64) {
            return Err(too_large());
        }
        let limited = http_body_util::Limited::new(req.into_body(), MAX);
        let read = http_body_util::BodyExt::collect(limited);
        match tokio::time::timeout(BODY_READ_TIMEOUT, read).await {
            Ok(Ok(body)) => Ok(LimitedBody(body.to_bytes())),
            Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(too_large()),
            Ok(Err(e)) => Err((
                StatusCode::BAD_REQUEST,
                format!("request body not read: {e}"),
            )
                .into_response()),
            Err(_) => Err((
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "request body not received within {}s; send the whole body at once",
                    BODY_READ_TIMEOUT.as_secs()
                ),
            )
                .into_response()),
        }
    }
}

/// Why a browser request came from another site, if it did: `Sec-Fetch-Site` says
/// `cross-site` or `same-site` (a sibling subdomain, or another port of the same host, is
/// still someone else's page), or `Origin` names another origin than the one the request was
/// sent to (`Host`). A request with neither header (curl, the kubelet, the application, a
/// script) is not a browser's and passes.
pub(crate) fn cross_site(headers: &HeaderMap) -> Option<String> {
    let get = |h: &str| headers.get(h).map(|v| v.to_str().unwrap_or("(not text)"));
    if let Some(site @ ("cross-site" | "same-site")) = get("sec-fetch-site") {
        return Some(format!("Sec-Fetch-Site is {site}"));
    }
    let origin = get("origin")?;
    let host = get("host");
    let authority = origin.split_once("://").map(|(_, a)| a);
    match (authority, host) {
        (Some(a), Some(h)) if a.eq_ignore_ascii_case(h) => None,
        _ => Some(format!(
            "Origin {origin:?} is not this listener ({})",
            host.unwrap_or("no Host header")
        )),
    }
}

/// Extractor for state-changing routes: rejects (`403`, saying why) a request a browser sent
/// from another site, see [`cross_site`].
pub(crate) struct NotCrossSite;

impl<S: Send + Sync> FromRequestParts<S> for NotCrossSite {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Response> {
        match cross_site(&parts.headers) {
            None => Ok(NotCrossSite),
            Some(why) => {
                warn!(path = %parts.uri.path(), %why, "a state-changing request from another site was refused");
                Err((
                    StatusCode::FORBIDDEN,
                    format!(
                        "refused: a browser sent this request from another site ({why}); \
                         state changes are accepted from programs (curl, the kubelet, the \
                         application) or from this listener's own pages only"
                    ),
                )
                    .into_response())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::cross_site;
    use axum::http::HeaderMap;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn programs_and_same_origin_pages_pass_other_sites_do_not() {
        assert_eq!(cross_site(&headers(&[("host", "10.0.0.5:7434")])), None);
        assert_eq!(
            cross_site(&headers(&[
                ("host", "dash.example:8080"),
                ("origin", "http://dash.example:8080"),
                ("sec-fetch-site", "same-origin"),
            ])),
            None
        );
        for refused in [
            headers(&[
                ("host", "10.0.0.5:7434"),
                ("origin", "https://evil.example"),
            ]),
            headers(&[("host", "10.0.0.5:7434"), ("origin", "null")]),
            headers(&[("origin", "http://10.0.0.5:7434")]),
            headers(&[("host", "127.0.0.1:7433"), ("sec-fetch-site", "cross-site")]),
            headers(&[("host", "127.0.0.1:7433"), ("sec-fetch-site", "same-site")]),
            // Another port of the same host is another origin.
            headers(&[
                ("host", "127.0.0.1:7433"),
                ("origin", "http://127.0.0.1:8080"),
            ]),
        ] {
            assert!(cross_site(&refused).is_some(), "{refused:?}");
        }
    }
}
