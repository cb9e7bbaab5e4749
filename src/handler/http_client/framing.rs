//! Reading one response off a connection: its head (skipping interim `1xx` responses), then
//! its body as the head frames it — by `Content-Length`, by chunked transfer coding, or by
//! the connection's end (RFC 9112 §6.3) — and whether the connection can carry another
//! request.
//!
//! Generic over the byte source, so that the property tests below and the fuzz target
//! (`fuzz/fuzz_targets/http_response.rs`, through [`frame`]) feed it bytes split at
//! arbitrary points, without a socket.

use super::{Response, FIRST_READ, MAX_HEAD, MAX_HEADERS};
use std::io;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt};

pub(super) enum Failed {
    /// The connection failed before a single byte of response came back.
    BeforeAnswer(io::Error),
    Other(io::Error),
}

/// Reads one response from `conn`; the connection comes back when it can carry another
/// request.
pub(super) async fn receive<R: AsyncRead + Unpin>(
    mut conn: R,
) -> Result<(Response, Option<R>), Failed> {
    let mut buf = Vec::with_capacity(FIRST_READ);
    match fill(&mut conn, &mut buf).await {
        Ok(0) => {
            return Err(Failed::BeforeAnswer(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the connection was closed before a response came",
            )))
        }
        Ok(_) => {}
        Err(e) => return Err(Failed::BeforeAnswer(e)),
    }
    read_response(conn, buf).await.map_err(Failed::Other)
}

/// Reads more of the stream into `buf`'s spare room (growing it when full). `Ok(0)` is the
/// end of the stream.
async fn fill<R: AsyncRead + Unpin>(conn: &mut R, buf: &mut Vec<u8>) -> io::Result<usize> {
    if buf.len() == buf.capacity() {
        buf.reserve(buf.capacity().max(FIRST_READ));
    }
    conn.read_buf(buf).await
}

fn invalid(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

fn cut_short() -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "the connection was closed in the middle of the response",
    )
}

/// The longest `Jobwarden-Defer` value kept (a deadline is a few bytes; more is an error,
/// which quotes what was kept).
const MAX_DEFER_TEXT: usize = 64;

/// How the body of a response is delimited.
enum Framing {
    None,
    Length(usize),
    Chunked,
    UntilClose,
}

/// Parses the response in `buf` (reading more as needed) to its end.
async fn read_response<R: AsyncRead + Unpin>(
    mut conn: R,
    mut buf: Vec<u8>,
) -> io::Result<(Response, Option<R>)> {
    // The head, skipping interim (1xx) responses.
    let Head {
        status,
        retry_after,
        defer,
        framing,
        mut keep_alive,
        len: head_len,
    } = loop {
        match parse_head(&buf)? {
            Parsed::Final(head) => break head,
            Parsed::Interim(len) => {
                buf.drain(..len);
            }
            Parsed::Partial => {
                if buf.len() > MAX_HEAD {
                    return Err(invalid(format!(
                        "the response head is over {} KiB",
                        MAX_HEAD / 1024
                    )));
                }
                if fill(&mut conn, &mut buf).await? == 0 {
                    return Err(cut_short());
                }
            }
        }
    };
    buf.drain(..head_len);
    let body = match framing {
        Framing::None => {
            keep_alive &= buf.is_empty();
            Vec::new()
        }
        Framing::Length(n) => {
            while buf.len() < n {
                // The declared length is trusted only so far ahead of the bytes that came:
                // a huge one meets the end of the stream, not an allocation of its size.
                buf.reserve((n - buf.len()).min(MAX_HEAD));
                if conn.read_buf(&mut buf).await? == 0 {
                    return Err(cut_short());
                }
            }
            // Bytes past the body: the server is out of step with us.
            keep_alive &= buf.len() == n;
            buf.truncate(n);
            buf
        }
        Framing::Chunked => {
            let (body, rest) = dechunk(&mut conn, buf).await?;
            keep_alive &= rest == 0;
            body
        }
        Framing::UntilClose => {
            keep_alive = false;
            while fill(&mut conn, &mut buf).await? != 0 {}
            buf
        }
    };
    let reuse = keep_alive.then_some(conn);
    Ok((
        Response {
            status,
            retry_after,
            defer,
            body,
        },
        reuse,
    ))
}

/// A final response's head.
struct Head {
    status: u16,
    retry_after: Option<Duration>,
    /// The `Jobwarden-Defer` header's value, as sent (at most [`MAX_DEFER_TEXT`] bytes).
    defer: Option<String>,
    framing: Framing,
    keep_alive: bool,
    /// Its length in bytes (the body starts there).
    len: usize,
}

/// What the start of a response buffer holds.
enum Parsed {
    Final(Head),
    /// An interim (1xx) response's head of this many bytes, to skip.
    Interim(usize),
    /// Not a whole head yet.
    Partial,
}

/// Parses the head at the start of `buf`. Not async on purpose: the parser's header array
/// (`MAX_HEADERS` entries, 3,200 bytes) lives only here, not in the state of every request
/// in flight (it made the exchange future 3,728 bytes, copied as it moved and boxed per
/// request).
fn parse_head(buf: &[u8]) -> io::Result<Parsed> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    match resp.parse(buf) {
        Ok(httparse::Status::Complete(len)) => {
            let status = resp.code.unwrap_or(0);
            if (100..200).contains(&status) && status != 101 {
                return Ok(Parsed::Interim(len));
            }
            let (framing, keep_alive, retry_after, defer) = read_head(&resp, status)?;
            Ok(Parsed::Final(Head {
                status,
                retry_after,
                defer,
                framing,
                keep_alive,
                len,
            }))
        }
        Ok(httparse::Status::Partial) => Ok(Parsed::Partial),
        Err(e) => Err(invalid(format!("the response is not HTTP/1.x ({e})"))),
    }
}

/// What the head says: how the body is framed, whether the connection can be reused, a
/// numeric `Retry-After`, and a `Jobwarden-Defer`.
fn read_head(
    resp: &httparse::Response,
    status: u16,
) -> io::Result<(Framing, bool, Option<Duration>, Option<String>)> {
    // HTTP/1.1 keeps the connection unless told otherwise; HTTP/1.0 closes it unless told
    // otherwise.
    let mut keep_alive = resp.version == Some(1);
    let (mut length, mut chunked, mut coded) = (None::<usize>, false, false);
    let mut retry_after = None;
    let mut defer = None;
    for h in resp.headers.iter() {
        let value = std::str::from_utf8(h.value).unwrap_or("").trim();
        if h.name.eq_ignore_ascii_case("content-length") {
            let n = value
                .parse::<usize>()
                .map_err(|_| invalid(format!("bad Content-Length {value:?}")))?;
            if length.is_some_and(|l| l != n) {
                return Err(invalid("two different Content-Length headers"));
            }
            length = Some(n);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            coded = true;
            // Chunked must be the last coding for the body to be delimited by it.
            chunked = value
                .rsplit(',')
                .next()
                .is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked"));
        } else if h.name.eq_ignore_ascii_case("connection") {
            for token in value.split(',').map(str::trim) {
                if token.eq_ignore_ascii_case("close") {
                    keep_alive = false;
                } else if token.eq_ignore_ascii_case("keep-alive") && resp.version == Some(0) {
                    keep_alive = true;
                }
            }
        } else if h.name.eq_ignore_ascii_case("retry-after") {
            retry_after = value.parse::<u64>().ok().map(Duration::from_secs);
        } else if h.name.eq_ignore_ascii_case(crate::completion::DEFER_HEADER) {
            let mut cut = value.len().min(MAX_DEFER_TEXT);
            while !value.is_char_boundary(cut) {
                cut -= 1;
            }
            defer = Some(value[..cut].to_string());
        }
    }
    let framing = if status == 204 || status == 304 || (100..200).contains(&status) {
        Framing::None
    } else if coded {
        // Transfer-Encoding overrides Content-Length (RFC 9112 §6.3).
        if chunked {
            Framing::Chunked
        } else {
            Framing::UntilClose
        }
    } else if let Some(n) = length {
        Framing::Length(n)
    } else {
        Framing::UntilClose
    };
    if status == 101 {
        // Switching protocols: the connection no longer speaks HTTP/1.1 (never asked for).
        keep_alive = false;
    }
    if coded && length.is_some() {
        // A message with both is suspect (smuggling); do not reuse the connection.
        keep_alive = false;
    }
    Ok((framing, keep_alive, retry_after, defer))
}

/// Decodes a chunked body; `buf` holds what was read past the head. Also returns how many
/// bytes came after the body (none, from a server in step with us).
async fn dechunk<R: AsyncRead + Unpin>(
    conn: &mut R,
    mut buf: Vec<u8>,
) -> io::Result<(Vec<u8>, usize)> {
    let mut body = Vec::new();
    let mut at = 0;
    loop {
        // The chunk size line.
        let (size_len, size) = loop {
            match httparse::parse_chunk_size(&buf[at..]) {
                Ok(httparse::Status::Complete((len, size))) => break (len, size),
                Ok(httparse::Status::Partial) => {
                    // Its extensions are skipped, but not without end.
                    if buf.len() - at > MAX_HEAD {
                        return Err(invalid(format!(
                            "a chunk size line is over {} KiB",
                            MAX_HEAD / 1024
                        )));
                    }
                    if fill(conn, &mut buf).await? == 0 {
                        return Err(cut_short());
                    }
                }
                Err(_) => return Err(invalid("a bad chunk size in a chunked body")),
            }
        };
        at += size_len;
        // Where the chunk and its CRLF end, checked: a size near 2^64 (16 hex digits pass
        // the parser) would overflow.
        let (size, end) = usize::try_from(size)
            .ok()
            .and_then(|s| Some((s, at.checked_add(s)?.checked_add(2)?)))
            .ok_or_else(|| invalid("a chunk too large"))?;
        if size == 0 {
            // Trailers (ignored), up to the empty line; not without end.
            let trailers = at;
            loop {
                if let Some(end) = find_crlf(&buf[at..]) {
                    if end == 0 {
                        return Ok((body, buf.len() - at - 2));
                    }
                    at += end + 2;
                    continue;
                }
                if buf.len() - trailers > MAX_HEAD {
                    return Err(invalid(format!(
                        "the trailers are over {} KiB",
                        MAX_HEAD / 1024
                    )));
                }
                if fill(conn, &mut buf).await? == 0 {
                    return Err(cut_short());
                }
            }
        }
        // The chunk and its CRLF.
        while buf.len() < end {
            if fill(conn, &mut buf).await? == 0 {
                return Err(cut_short());
            }
        }
        body.extend_from_slice(&buf[at..at + size]);
        if &buf[at + size..end] != b"\r\n" {
            return Err(invalid("a chunk not followed by CRLF"));
        }
        at = end;
        // Keep the buffer small: drop what was consumed.
        if at > FIRST_READ {
            buf.drain(..at);
            at = 0;
        }
    }
}

fn find_crlf(b: &[u8]) -> Option<usize> {
    b.windows(2).position(|w| w == b"\r\n")
}

/// What [`frame`] made of a response.
#[cfg(any(test, feature = "fuzzing"))]
#[derive(Debug, PartialEq)]
pub struct Framed {
    pub status: u16,
    pub retry_after: Option<Duration>,
    pub body: Vec<u8>,
    /// Whether the connection would carry another request.
    pub keep_alive: bool,
}

/// Reads one response from `bytes`, handed out in pieces that end at `cuts` (the reader's
/// own buffer may cut them shorter), then the end of the stream. Returns what it made of
/// them (an error says whether it came before any byte), and how many bytes it took.
#[cfg(any(test, feature = "fuzzing"))]
pub fn frame(bytes: &[u8], cuts: &[usize]) -> (Result<Framed, (bool, io::Error)>, usize) {
    let mut cuts = cuts.to_vec();
    cuts.sort_unstable();
    let mut source = Pieces {
        bytes,
        cuts: &cuts,
        at: 0,
    };
    let result = futures::executor::block_on(receive(&mut source));
    let result = match result {
        Ok((r, reuse)) => Ok(Framed {
            status: r.status,
            retry_after: r.retry_after,
            body: r.body,
            keep_alive: reuse.is_some(),
        }),
        Err(Failed::BeforeAnswer(e)) => Err((true, e)),
        Err(Failed::Other(e)) => Err((false, e)),
    };
    (result, source.at)
}

/// A byte source that hands out `bytes` up to the next cut at a time, never waiting.
#[cfg(any(test, feature = "fuzzing"))]
struct Pieces<'a> {
    bytes: &'a [u8],
    /// Ascending.
    cuts: &'a [usize],
    /// Bytes handed out so far.
    at: usize,
}

#[cfg(any(test, feature = "fuzzing"))]
impl AsyncRead for Pieces<'_> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        let at = self.at;
        let end = self
            .cuts
            .iter()
            .copied()
            .find(|&c| c > at && c < self.bytes.len())
            .unwrap_or(self.bytes.len());
        let n = (end - at).min(buf.remaining());
        buf.put_slice(&self.bytes[at..at + n]);
        self.at += n;
        std::task::Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests;
