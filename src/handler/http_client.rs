//! The http handler's transport: HTTP/1.1 requests to one origin over pooled keep-alive
//! connections, and nothing else (no TLS, no proxies, no redirects, no HTTP/2: the
//! application is local, `http://`).
//!
//! Why not hyper's client: the handler holds one connection per running job, and hyper keeps
//! per connection an 8 KiB write buffer and a request channel whose first block holds 32
//! requests, neither configurable, whatever its read buffer. Measured on 2026-11-26 on the
//! 2-core bench machine (`jobwarden bench --no-recovery --jobs 20000 --rate 500
//! --latency-jobs 1`, 512 slots, four runs of each binary alternating, another build
//! running): hyper 1.12's `client::conn::http1`, driven inside the job's task with a 1 KiB
//! exact read buffer and this file's pool (branch `wip/http-client`, ad75784; 333 lines of
//! code against 465 here), made the worker-alone process peak at 36.0–38.2 MiB against
//! 24.5–25.2 MiB (+50 %), and cost 86–97 µs of CPU per job in the HTTP phase (worker and
//! no-op app) against 66–81 µs (+28 %); jobs/s within the noise. Here an idle connection is
//! its socket, and a request in flight holds its request bytes and a response buffer that
//! grows from 1 KiB. Parsing is `httparse`'s (hyper's parser); the framing is in
//! `http_client/framing.rs`, fuzzed (`fuzz/`).
//!
//! Semantics kept from a general client:
//! - user information in the URL (`http://user:pass@host/`) is sent as `Basic`
//!   authorization, as reqwest did;
//! - connections are reused (most recently used first) and closed after [`IDLE`] unused;
//!   one whose peer closed it meanwhile is noticed before use and dropped;
//! - a request sent on a reused connection that the server closed before answering a
//!   single byte is sent once more on a new connection, as Go's `net/http` does for
//!   requests that carry an `Idempotency-Key` (every job request does): a server closing an
//!   idle keep-alive connection just as it is reused must not cost the job an attempt;
//! - response bodies are framed by `Content-Length`, by chunked transfer coding, or by the
//!   connection's end (RFC 9112 §6.3); `1xx` interim responses are skipped; `Connection:
//!   close` and HTTP/1.0 responses are honoured (the connection is not reused).

use framing::Failed;
use std::collections::VecDeque;
use std::io;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

pub(super) mod framing;

/// How long an unused connection is kept. Short: reconnecting on localhost is cheap, and it
/// keeps clear of servers with short keep-alive timeouts (gunicorn: 2 s, Node: 5 s)
/// closing a pooled connection just as it is reused.
pub(super) const IDLE: Duration = Duration::from_secs(1);
/// Connecting gives up after this long (the exchange as a whole has the job's timeout).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The first read buffer of a response; it grows as the response needs.
const FIRST_READ: usize = 1024;
/// A response head larger than this is refused (hyper's default limit is ~400 KiB of
/// buffer; 64 KiB of headers is far beyond what an application sends back).
const MAX_HEAD: usize = 64 * 1024;
/// Response headers parsed at most (hyper's default is 100).
const MAX_HEADERS: usize = 100;

/// A response, read whole.
#[derive(Debug)]
pub(crate) struct Response {
    pub status: u16,
    /// `Retry-After` in seconds, when the server sent the numeric form.
    pub retry_after: Option<Duration>,
    /// `Jobwarden-Defer` as sent (a `202` with it defers the job).
    pub defer: Option<String>,
    pub body: Vec<u8>,
}

/// One origin (`http://host:port`) and its idle connections.
pub(crate) struct Origin {
    /// `host:port` to connect to (`[v6]:port` for IPv6 literals).
    connect_to: String,
    /// The `Host` header's value.
    host: String,
    /// Path and query of every request.
    path: String,
    /// `Basic` credentials from the URL's user information (`http://user:pass@host/`).
    authorization: Option<String>,
    idle: Arc<Mutex<VecDeque<(TcpStream, Instant)>>>,
    /// Whether the task that closes connections idle past [`IDLE`] runs.
    sweeping: std::sync::atomic::AtomicBool,
}

/// Shown without its credentials (`authorization: Basic ****`).
impl std::fmt::Debug for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Origin")
            .field("connect_to", &self.connect_to)
            .field("host", &self.host)
            .field(
                "path",
                &crate::redact::url(&format!("http://{}{}", self.host, self.path)),
            )
            .field(
                "authorization",
                &self
                    .authorization
                    .as_deref()
                    .map(|a| crate::redact::header("authorization", a)),
            )
            .finish_non_exhaustive()
    }
}

impl Origin {
    /// Parses an `http://` URL; the error names what is wrong with it (and shows the URL
    /// without its password).
    pub fn parse(url: &str) -> Result<Origin, String> {
        let shown = crate::redact::url(url);
        let u = url::Url::parse(url).map_err(|e| format!("{shown:?} is not a URL: {e}"))?;
        if u.scheme() != "http" {
            return Err(format!(
                "{shown:?}: only http:// URLs are supported (the application is local)"
            ));
        }
        let host = u
            .host_str()
            .ok_or_else(|| format!("{shown:?} has no host"))?
            .to_string();
        let port = u.port_or_known_default().unwrap_or(80);
        let mut path = u.path().to_string();
        if let Some(q) = u.query() {
            path.push('?');
            path.push_str(q);
        }
        let authorization = (!u.username().is_empty() || u.password().is_some()).then(|| {
            use base64::Engine;
            let decode = |s| percent_encoding::percent_decode_str(s).decode_utf8_lossy();
            let pair = format!(
                "{}:{}",
                decode(u.username()),
                decode(u.password().unwrap_or(""))
            );
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(pair)
            )
        });
        Ok(Origin {
            authorization,
            connect_to: format!("{host}:{port}"),
            host: match u.port() {
                Some(p) => format!("{host}:{p}"),
                None => host,
            },
            path,
            idle: Arc::default(),
            sweeping: Default::default(),
        })
    }

    /// The `Authorization` header's value sent with every request (`Basic <credentials>`
    /// from the URL's user information), if any: a secret.
    pub fn authorization(&self) -> Option<&str> {
        self.authorization.as_deref()
    }

    /// Starts a request: `POST <path> HTTP/1.1` with the `Host`, `Content-Type` and
    /// `Content-Length` headers written; add more with [`Request::header`].
    pub fn post(&self, body_len: usize) -> Request {
        self.post_as(body_len, "application/json")
    }

    /// [`Origin::post`] with another content type.
    pub fn post_as(&self, body_len: usize, content_type: &str) -> Request {
        let mut head = Vec::with_capacity(256 + body_len);
        head.extend_from_slice(b"POST ");
        head.extend_from_slice(self.path.as_bytes());
        head.extend_from_slice(b" HTTP/1.1\r\nhost: ");
        head.extend_from_slice(self.host.as_bytes());
        head.extend_from_slice(b"\r\ncontent-type: ");
        head.extend_from_slice(content_type.as_bytes());
        head.extend_from_slice(b"\r\ncontent-length: ");
        head.extend_from_slice(body_len.to_string().as_bytes());
        head.extend_from_slice(b"\r\n");
        if let Some(auth) = &self.authorization {
            head.extend_from_slice(b"authorization: ");
            head.extend_from_slice(auth.as_bytes());
            head.extend_from_slice(b"\r\n");
        }
        Request { bytes: head }
    }

    /// Sends `req` (its head, then `body`) and reads the whole response.
    pub async fn send(&self, req: Request, body: &[u8]) -> io::Result<Response> {
        let mut bytes = req.bytes;
        bytes.extend_from_slice(b"\r\n");
        bytes.extend_from_slice(body);
        // A pooled connection first; if the server closed it before answering anything,
        // once more on a new one.
        if let Some(conn) = self.checkout() {
            match exchange(conn, &bytes).await {
                Ok((resp, reuse)) => return Ok(self.finish(resp, reuse)),
                Err(Failed::BeforeAnswer(_)) => {}
                Err(Failed::Other(e)) => return Err(e),
            }
        }
        let conn = self.connect().await?;
        match exchange(conn, &bytes).await {
            Ok((resp, reuse)) => Ok(self.finish(resp, reuse)),
            Err(Failed::BeforeAnswer(e) | Failed::Other(e)) => Err(e),
        }
    }

    fn finish(&self, resp: Response, reuse: Option<TcpStream>) -> Response {
        if let Some(conn) = reuse {
            self.checkin(conn);
        }
        resp
    }

    async fn connect(&self) -> io::Result<TcpStream> {
        let conn = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&self.connect_to))
            .await
            .map_err(|_| {
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("connecting to {} timed out after 5s", self.connect_to),
                )
            })??;
        conn.set_nodelay(true)?;
        Ok(conn)
    }

    /// The most recently used idle connection that is still open.
    fn checkout(&self) -> Option<TcpStream> {
        // Stale sockets are closed after the lock is released.
        let mut stale = Vec::new();
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        while let Some((conn, since)) = idle.pop_back() {
            if since.elapsed() < IDLE && still_open(&conn) {
                return Some(conn);
            }
            stale.push(conn);
        }
        drop(idle);
        drop(stale);
        None
    }

    fn checkin(&self, conn: TcpStream) {
        let now = Instant::now();
        {
            let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
            evict(&mut idle, now);
            idle.push_back((conn, now));
        }
        // Connections idle past `IDLE` are closed even when no request comes to evict
        // them: a task per origin, started with its first idle connection, ending with it.
        if !self
            .sweeping
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(sweep(Arc::downgrade(&self.idle)));
            }
        }
    }
}

/// A request's head being written.
pub(crate) struct Request {
    bytes: Vec<u8>,
}

impl Request {
    /// Adds a header. A value with a control character (CR, LF, NUL…) would break the
    /// request's framing: it is refused, and the error names the header.
    pub fn header(&mut self, name: &str, value: &[u8]) -> io::Result<()> {
        if let Some(c) = value
            .iter()
            .find(|&&c| (c < 0x20 && c != b'\t') || c == 0x7f)
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("header {name} has a control character ({c:#04x}) in its value"),
            ));
        }
        self.bytes.extend_from_slice(name.as_bytes());
        self.bytes.extend_from_slice(b": ");
        self.bytes.extend_from_slice(value);
        self.bytes.extend_from_slice(b"\r\n");
        Ok(())
    }
}

/// Closes connections idle past [`IDLE`], every [`IDLE`], until the origin is dropped.
async fn sweep(idle: Weak<Mutex<VecDeque<(TcpStream, Instant)>>>) {
    loop {
        tokio::time::sleep(IDLE).await;
        let Some(idle) = idle.upgrade() else { return };
        let mut idle = idle.lock().unwrap_or_else(|e| e.into_inner());
        evict(&mut idle, Instant::now());
    }
}

/// Drops the connections idle past [`IDLE`] (the oldest are at the front).
fn evict(idle: &mut VecDeque<(TcpStream, Instant)>, now: Instant) {
    while idle
        .front()
        .is_some_and(|(_, since)| now.duration_since(*since) >= IDLE)
    {
        idle.pop_front();
    }
}

/// An idle connection is open if reading it would wait: no end of stream (the server
/// closed it), no stray bytes, no error pending.
fn still_open(conn: &TcpStream) -> bool {
    let mut probe = [0u8; 1];
    matches!(conn.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
}

/// Writes the request and reads the response; the connection comes back when it can carry
/// another request.
async fn exchange(
    mut conn: TcpStream,
    request: &[u8],
) -> Result<(Response, Option<TcpStream>), Failed> {
    if let Err(e) = conn.write_all(request).await {
        return Err(Failed::BeforeAnswer(e));
    }
    framing::receive(conn).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;

    /// A server that answers each request on each connection with the next of `answers`
    /// (raw bytes), then closes the connection if the answer says `close`. Returns the URL
    /// and a count of connections accepted.
    async fn server(answers: Vec<&'static str>) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/jobs?x=1", listener.local_addr().unwrap());
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        let answers = Arc::new(Mutex::new(VecDeque::from(answers)));
        tokio::spawn(async move {
            loop {
                let (mut sock, _) = listener.accept().await.unwrap();
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let answers = answers.clone();
                tokio::spawn(async move {
                    let mut req = Vec::new();
                    loop {
                        // One request: head, then Content-Length bytes.
                        let mut chunk = [0u8; 4096];
                        let complete = |r: &[u8]| {
                            let text = String::from_utf8_lossy(r);
                            let (head, body) = text.split_once("\r\n\r\n")?;
                            let len: usize = head
                                .lines()
                                .find_map(|l| l.strip_prefix("content-length: "))?
                                .parse()
                                .ok()?;
                            (body.len() >= len).then_some(head.len() + 4 + len)
                        };
                        while complete(&req).is_none() {
                            let n = sock.read(&mut chunk).await.unwrap_or(0);
                            if n == 0 {
                                return;
                            }
                            req.extend_from_slice(&chunk[..n]);
                        }
                        let used = complete(&req).unwrap();
                        req.drain(..used);
                        let answer = answers.lock().unwrap().pop_front().unwrap_or("");
                        if answer.is_empty() {
                            return; // closes without answering
                        }
                        sock.write_all(answer.as_bytes()).await.unwrap();
                        if answer.contains("close") || answers.lock().unwrap().is_empty() {
                            return;
                        }
                    }
                });
            }
        });
        (url, accepted)
    }

    async fn post(o: &Origin) -> io::Result<Response> {
        let mut req = o.post(2);
        req.header("x-test", b"1")?;
        o.send(req, b"{}").await
    }

    #[tokio::test]
    async fn framings_and_reuse() {
        let (url, accepted) = server(vec![
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
            "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;ext=1\r\nde\r\n0\r\nX-Trailer: 1\r\n\r\n",
            "HTTP/1.1 204 No Content\r\n\r\n",
            "HTTP/1.1 503 Unavailable\r\nretry-after: 7\r\ncontent-length: 0\r\n\r\n",
            "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nto the end",
        ])
        .await;
        let o = Origin::parse(&url).unwrap();
        let r = post(&o).await.unwrap();
        assert_eq!((r.status, r.body.as_slice()), (200, &b"hello"[..]));
        let r = post(&o).await.unwrap();
        assert_eq!((r.status, r.body.as_slice()), (201, &b"abcde"[..]));
        let r = post(&o).await.unwrap();
        assert_eq!((r.status, r.body.len()), (204, 0));
        let r = post(&o).await.unwrap();
        assert_eq!(
            (r.status, r.retry_after),
            (503, Some(Duration::from_secs(7)))
        );
        let r = post(&o).await.unwrap();
        assert_eq!((r.status, r.body.as_slice()), (200, &b"to the end"[..]));
        // All five on one keep-alive connection; the last closed it, so none is idle.
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert!(o.checkout().is_none());
    }

    #[tokio::test]
    async fn a_connection_closed_by_the_server_is_not_reused_and_costs_no_error() {
        // The first connection answers once and then closes without answering the
        // second request; the second request goes out again on a new connection.
        let (url, accepted) = server(vec![
            "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\na",
            "",
            "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nb",
        ])
        .await;
        let o = Origin::parse(&url).unwrap();
        assert_eq!(post(&o).await.unwrap().body, b"a");
        assert_eq!(post(&o).await.unwrap().body, b"b");
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 2);

        // A fresh connection that fails before answering is an error, not a loop.
        let (url, _) = server(vec![""]).await;
        let o = Origin::parse(&url).unwrap();
        let e = post(&o).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{e}");
    }

    #[tokio::test]
    async fn idle_connections_expire() {
        let (url, accepted) = server(vec!["HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"; 2]).await;
        let o = Origin::parse(&url).unwrap();
        post(&o).await.unwrap();
        assert_eq!(o.idle.lock().unwrap().len(), 1);
        tokio::time::sleep(IDLE * 2 + Duration::from_millis(200)).await;
        // The sweep closed it without a request coming.
        assert_eq!(o.idle.lock().unwrap().len(), 0);
        post(&o).await.unwrap();
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn bad_responses_are_errors_that_say_what_was_wrong() {
        for (answer, says) in [
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort",
                "middle of the response",
            ),
            ("SMTP ready\r\n\r\n", "not HTTP/1.x"),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
                "bad Content-Length \"x\"",
            ),
            (
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
                "bad chunk size",
            ),
        ] {
            let (url, _) = server(vec![answer]).await;
            let o = Origin::parse(&url).unwrap();
            // The server closes after its last answer, so a short body meets the end of
            // the stream.
            let e = tokio::time::timeout(Duration::from_secs(5), post(&o))
                .await
                .expect("no hang")
                .unwrap_err();
            assert!(e.to_string().contains(says), "{answer:?}: {e}");
        }
    }

    #[test]
    fn a_request_in_flight_does_not_hold_the_parsers_header_array() {
        // Every running HTTP job holds its exchange; with the header array (3,200 bytes) in
        // its state it was 3.7 KB in a release build, copied on each move, and 512 slots
        // held 1.2 MiB more (the worker-alone RSS in the bench).
        let o = Origin::parse("http://127.0.0.1:9/x").unwrap();
        let exchange = o.send(o.post(0), b"");
        let size = std::mem::size_of_val(&exchange);
        assert!(
            size < std::mem::size_of::<[httparse::Header; MAX_HEADERS]>(),
            "the exchange future is {size} bytes"
        );
    }

    #[test]
    fn urls_and_headers() {
        let o = Origin::parse("http://localhost:8080/a/b?c=d").unwrap();
        assert_eq!(
            (o.connect_to.as_str(), o.host.as_str()),
            ("localhost:8080", "localhost:8080")
        );
        assert_eq!(o.path, "/a/b?c=d");
        let o = Origin::parse("http://[::1]/").unwrap();
        assert_eq!(
            (o.connect_to.as_str(), o.host.as_str()),
            ("[::1]:80", "[::1]")
        );
        assert!(o.authorization.is_none());
        assert!(Origin::parse("https://x/")
            .unwrap_err()
            .contains("only http://"));
        // Credentials in the URL are sent as Basic authorization, percent-decoded.
        let creds = Origin::parse("http://us%40er:p%3Ass@127.0.0.1:1/x").unwrap();
        let text = String::from_utf8(creds.post(0).bytes).unwrap();
        assert!(
            text.contains("\r\nauthorization: Basic dXNAZXI6cDpzcw==\r\n"),
            "{text}"
        );
        // Its `Debug` shows neither the credentials nor the password.
        let debug = format!("{creds:?}");
        assert!(
            debug.contains("Basic ****") && !debug.contains("dXNAZXI6cDpzcw=="),
            "{debug}"
        );
        assert!(Origin::parse("http://app:s3cr3t@[bad/x")
            .unwrap_err()
            .contains("\"http://app:****@[bad/x\" is not a URL"));
        assert!(Origin::parse("not a url")
            .unwrap_err()
            .contains("is not a URL"));

        let mut req = o.post(0);
        let e = req.header("traceparent", b"a\r\nx-evil: 1").unwrap_err();
        assert!(
            e.to_string()
                .contains("header traceparent has a control character"),
            "{e}"
        );
        req.header("x-ok", "caf\u{e9}\tok".as_bytes()).unwrap();
        let text = String::from_utf8_lossy(&req.bytes).to_string();
        assert!(
            text.starts_with("POST / HTTP/1.1\r\nhost: [::1]\r\n"),
            "{text}"
        );
        assert!(
            text.ends_with("content-length: 0\r\nx-ok: caf\u{e9}\tok\r\n"),
            "{text}"
        );
    }
}
