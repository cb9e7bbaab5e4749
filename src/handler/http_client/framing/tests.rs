//! The framing against a reference: well-formed responses generated from a model (whose
//! meaning is known by construction) must read as the model says, in whatever pieces they
//! arrive; anything else — mutated responses, token soup, arbitrary bytes — must end in a
//! response or an error, never a panic, and never take bytes past the limits.

use super::{frame, Framed};
use crate::handler::http_client::{FIRST_READ, MAX_HEAD};
use proptest::prelude::*;
use std::time::Duration;

/// How a modelled response's body is delimited.
#[derive(Debug, Clone)]
enum Body {
    Length,
    /// Chunk sizes (cut from the body; the rest is one more chunk), each with an extension
    /// or not, and trailer fields.
    Chunked(Vec<(usize, bool)>, Vec<String>),
    UntilClose,
}

/// A well-formed response.
#[derive(Debug, Clone)]
struct Model {
    /// Interim responses before it, each with its own header lines.
    interim: Vec<(u16, Vec<String>)>,
    http10: bool,
    status: u16,
    /// `Retry-After`: numeric seconds (with spaces around), or the date form.
    retry_after: Option<Result<u64, ()>>,
    /// `Connection`: `close`, `keep-alive` or another token.
    connection: Option<&'static str>,
    /// Other header lines.
    others: Vec<String>,
    body: Vec<u8>,
    framing: Body,
    /// Header names as sent: upper case (else lower).
    upper: bool,
}

impl Model {
    fn no_body(&self) -> bool {
        self.status == 204 || self.status == 304
    }

    /// The bytes on the wire.
    fn render(&self) -> Vec<u8> {
        let name = |n: &str| {
            if self.upper {
                n.to_ascii_uppercase()
            } else {
                n.to_string()
            }
        };
        let mut out = Vec::new();
        for (code, lines) in &self.interim {
            out.extend_from_slice(format!("HTTP/1.1 {code} Interim\r\n").as_bytes());
            for l in lines {
                out.extend_from_slice(format!("{l}\r\n").as_bytes());
            }
            out.extend_from_slice(b"\r\n");
        }
        let version = if self.http10 { "1.0" } else { "1.1" };
        let mut head = format!("HTTP/{version} {} Whatever It Says\r\n", self.status);
        for l in &self.others {
            head.push_str(&format!("{l}\r\n"));
        }
        match self.retry_after {
            Some(Ok(s)) => head.push_str(&format!("{}: {s} \r\n", name("Retry-After"))),
            Some(Err(())) => head.push_str(&format!(
                "{}: Wed, 21 Oct 2015 07:28:00 GMT\r\n",
                name("Retry-After")
            )),
            None => {}
        }
        if let Some(c) = self.connection {
            head.push_str(&format!("{}: {c}\r\n", name("Connection")));
        }
        let body: &[u8] = if self.no_body() { b"" } else { &self.body };
        match &self.framing {
            Body::Length => {
                head.push_str(&format!("{}: {}\r\n", name("Content-Length"), body.len()));
            }
            Body::Chunked(..) => {
                head.push_str(&format!("{}: gzip, chunked\r\n", name("Transfer-Encoding")))
            }
            Body::UntilClose => {}
        }
        head.push_str("\r\n");
        out.extend_from_slice(head.as_bytes());
        match &self.framing {
            _ if self.no_body() => {}
            Body::Length | Body::UntilClose => out.extend_from_slice(body),
            Body::Chunked(sizes, trailers) => {
                let mut rest = body;
                for &(size, ext) in sizes {
                    let size = size.min(rest.len());
                    if size == 0 {
                        continue;
                    }
                    let ext = if ext { ";name=\"v;a\\\"l\" ; x" } else { "" };
                    out.extend_from_slice(format!("{size:X}{ext}\r\n").as_bytes());
                    out.extend_from_slice(&rest[..size]);
                    out.extend_from_slice(b"\r\n");
                    rest = &rest[size..];
                }
                if !rest.is_empty() {
                    out.extend_from_slice(format!("{:x}\r\n", rest.len()).as_bytes());
                    out.extend_from_slice(rest);
                    out.extend_from_slice(b"\r\n");
                }
                out.extend_from_slice(b"0\r\n");
                for t in trailers {
                    out.extend_from_slice(format!("{t}\r\n").as_bytes());
                }
                out.extend_from_slice(b"\r\n");
            }
        }
        out
    }

    /// What reading it must give: written from RFC 9112 (§6.3, §9.3), not from the code.
    fn expected(&self) -> Framed {
        let mut keep_alive = match self.connection {
            Some("close") => false,
            Some("keep-alive") => true,
            _ => !self.http10,
        };
        if matches!(self.framing, Body::UntilClose) && !self.no_body() {
            keep_alive = false;
        }
        Framed {
            status: self.status,
            retry_after: match self.retry_after {
                Some(Ok(s)) => Some(Duration::from_secs(s)),
                _ => None,
            },
            body: if self.no_body() {
                Vec::new()
            } else {
                self.body.clone()
            },
            keep_alive,
        }
    }
}

fn header_line() -> impl Strategy<Value = String> {
    prop_oneof![
        "[A-Za-z][A-Za-z0-9-]{0,12}: [ -~]{0,40}",
        Just("Server: x \t".to_string()),
        Just("X-Empty:".to_string()),
    ]
    // Not one the model writes itself.
    .prop_filter("a framing or connection header", |l| {
        let name = l.split(':').next().unwrap_or("").to_ascii_lowercase();
        ![
            "content-length",
            "transfer-encoding",
            "connection",
            "retry-after",
        ]
        .contains(&name.as_str())
    })
}

fn model() -> impl Strategy<Value = Model> {
    let interim = prop::collection::vec(
        (
            prop::sample::select(vec![100u16, 102, 103]),
            prop::collection::vec(header_line(), 0..3),
        ),
        0..3,
    );
    let status = prop::sample::select(vec![200u16, 201, 202, 204, 304, 404, 408, 429, 500, 503]);
    let retry_after = prop::option::of(prop_oneof![(0u64..100_000).prop_map(Ok), Just(Err(()))]);
    let connection = prop::option::of(prop::sample::select(vec!["close", "keep-alive", "upgrade"]));
    let others = prop::collection::vec(header_line(), 0..6);
    let body = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..64),
        prop::collection::vec(any::<u8>(), 0..5000),
    ];
    let framing = prop_oneof![
        Just(Body::Length),
        (
            prop::collection::vec((1usize..3000, any::<bool>()), 0..6),
            prop::collection::vec(header_line(), 0..3)
        )
            .prop_map(|(s, t)| Body::Chunked(s, t)),
        Just(Body::UntilClose),
    ];
    (
        (interim, any::<bool>(), status, retry_after, connection),
        (others, body, framing, any::<bool>()),
    )
        .prop_map(
            |(
                (interim, http10, status, retry_after, connection),
                (others, body, framing, upper),
            )| {
                // HTTP/1.0 has no chunked transfer coding.
                let framing = match framing {
                    Body::Chunked(..) if http10 => Body::Length,
                    f => f,
                };
                Model {
                    interim,
                    http10,
                    status,
                    retry_after,
                    connection,
                    others,
                    body,
                    framing,
                    upper,
                }
            },
        )
}

/// Where the bytes are cut into the pieces a reader gets: a few anywhere, or many.
fn cuts(max: usize) -> impl Strategy<Value = Vec<usize>> {
    prop_oneof![
        prop::collection::vec(0..=max, 0..8),
        prop::collection::vec(0..=max, 0..200),
        // Byte by byte.
        Just((0..=max).collect()),
    ]
}

/// Pieces of responses, and garbage, to glue together: what a confused or hostile server
/// might send.
fn token() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => prop::sample::select(vec![
            "HTTP/1.1 200 OK\r\n", "HTTP/1.0 200 OK\r\n", "HTTP/1.1 100 Continue\r\n",
            "HTTP/1.1 101 Switching\r\n", "HTTP/1.1 204 No Content\r\n", "HTTP/1.1 304 NM\r\n",
            "HTTP/1.1 999 ?\r\n", "HTTP/2 200\r\n", "\r\n", "\n", "\r", "content-length: 5\r\n",
            "Content-Length: 0\r\n", "content-length: 18446744073709551615\r\n",
            "content-length: 18446744073709551616\r\n", "content-length: 99999999999999\r\n",
            "content-length: -1\r\n", "content-length: 5, 5\r\n",
            "transfer-encoding: chunked\r\n", "Transfer-Encoding: gzip\r\n",
            "transfer-encoding: chunked, identity\r\n", "connection: close\r\n",
            "connection: keep-alive\r\n", "retry-after: 3\r\n", "retry-after: 99999999999999999999\r\n",
            "0\r\n", "5\r\nhello\r\n", "3;a=b\r\nabc\r\n", "ffffffffffffffff\r\n",
            "fffffffffffffff\r\n", "7fffffffffffffff\r\n", "10000000000000000\r\n", "1\r\n",
            "0;ext\r\n", "x-trailer: 1\r\n", "hello", " ", "\t", ":",
        ])
        .prop_map(|t| t.as_bytes().to_vec()),
        1 => prop::collection::vec(any::<u8>(), 0..40),
    ]
}

/// A status line, header lines (framing headers that may lie among them), the empty line,
/// then pieces of chunked bodies: heads that parse, with bodies that may not.
fn soup_response() -> impl Strategy<Value = Vec<u8>> {
    let pick = |v: Vec<&'static str>| prop::sample::select(v).prop_map(|t| t.as_bytes().to_vec());
    let status = pick(vec![
        "HTTP/1.1 200 OK\r\n",
        "HTTP/1.0 200 OK\r\n",
        "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n",
        "HTTP/1.1 204 No Content\r\n",
    ]);
    let header = pick(vec![
        "content-length: 5\r\n",
        "content-length: 0\r\n",
        "content-length: 18446744073709551615\r\n",
        "content-length: 18446744073709551616\r\n",
        "content-length: 99999999999999\r\n",
        "transfer-encoding: chunked\r\n",
        "transfer-encoding: chunked\r\n",
        "transfer-encoding: gzip\r\n",
        "connection: close\r\n",
        "x-other: 1\r\n",
    ]);
    let piece = prop_oneof![
        4 => pick(vec![
            "0\r\n", "0\r\n\r\n", "5\r\nhello\r\n", "3;a=b\r\nabc\r\n", "ffffffffffffffff\r\n",
            "fffffffffffffff\r\n", "7fffffffffffffff\r\n", "fffffffffffffffd\r\n",
            "10000000000000000\r\n", "1\r\n", "0;ext\r\n", "x-trailer: 1\r\n", "\r\n", "hello",
        ]),
        1 => prop::collection::vec(any::<u8>(), 0..20),
    ];
    (
        status,
        prop::collection::vec(header, 0..4),
        prop::collection::vec(piece, 0..10),
    )
        .prop_map(|(status, headers, pieces)| {
            [vec![status], headers, vec![b"\r\n".to_vec()], pieces]
                .concat()
                .concat()
        })
}

/// Bytes changed, inserted or removed at a few places.
fn mutate(mut bytes: Vec<u8>, edits: &[(prop::sample::Index, u8, u8)]) -> Vec<u8> {
    for (at, op, b) in edits {
        if bytes.is_empty() {
            bytes.push(*b);
            continue;
        }
        let i = at.index(bytes.len());
        match op % 3 {
            0 => bytes[i] = *b,
            1 => bytes.insert(i, *b),
            _ => {
                bytes.remove(i);
            }
        }
    }
    bytes
}

/// Whatever came of them, reading `bytes` took none past the end, and a response it
/// accepts holds no more body than the bytes it took.
fn check_limits(bytes: &[u8], cuts: &[usize]) -> Result<(), TestCaseError> {
    let (result, took) = frame(bytes, cuts);
    prop_assert!(took <= bytes.len());
    if let Ok(r) = &result {
        prop_assert!(
            r.body.len() <= took,
            "{} body bytes of {took}",
            r.body.len()
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// A well-formed response reads as its model says, in whatever pieces it comes; a
    /// connection kept for reuse had exactly the response taken from it (nothing of what
    /// followed).
    #[test]
    fn well_formed_responses_read_as_the_reference_says(
        m in model(),
        after in prop::sample::select(vec!["", "HTTP/1.1 200 OK\r\n\r\n", "x"]),
        cut_at_end in any::<bool>(),
        mut cuts in cuts(12_000),
    ) {
        let response = m.render();
        let until_close = matches!(m.framing, Body::UntilClose) && !m.no_body();
        // What follows a response delimited by the connection's end is its body.
        let after = if until_close { "" } else { after };
        let mut bytes = response.clone();
        bytes.extend_from_slice(after.as_bytes());
        if cut_at_end {
            cuts.push(response.len());
        }
        let (result, took) = frame(&bytes, &cuts);
        let mut expected = m.expected();
        let got = result.map_err(|(_, e)| TestCaseError::fail(format!("{e} from {:?}", String::from_utf8_lossy(&response))))?;
        if got.keep_alive {
            prop_assert_eq!(took, response.len());
        }
        // Bytes read past the response (they came with its end) cost the connection.
        if !after.is_empty() && !cut_at_end {
            expected.keep_alive = got.keep_alive && expected.keep_alive;
        }
        prop_assert_eq!(got, expected);
    }

    /// Mutated responses, token soup and arbitrary bytes, in arbitrary pieces: a response
    /// or an error, never a panic, never past the end.
    #[test]
    fn any_bytes_end_in_a_response_or_an_error(
        input in prop_oneof![
            (model(), prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), any::<u8>()), 1..6))
                .prop_map(|(m, edits)| mutate(m.render(), &edits)),
            prop::collection::vec(token(), 0..30).prop_map(|t| t.concat()),
            soup_response(),
            prop::collection::vec(any::<u8>(), 0..300),
        ],
        cuts in cuts(400),
    ) {
        check_limits(&input, &cuts)?;
    }
}

/// Endless heads, chunk size lines and trailers are refused once past [`MAX_HEAD`], having
/// taken no more than that and one read.
#[test]
fn heads_chunk_lines_and_trailers_are_bounded() {
    let endless = |start: &str, filler: &str| {
        let mut b = start.as_bytes().to_vec();
        while b.len() < 4 * MAX_HEAD {
            b.extend_from_slice(filler.as_bytes());
        }
        b
    };
    for (bytes, says) in [
        (endless("HTTP/1.1 200 OK\r\nx-h: ", "h"), "head is over"),
        (
            endless(
                "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5;",
                "e",
            ),
            "chunk size line is over",
        ),
        (
            endless(
                "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\n",
                "t: 1\r\n",
            ),
            "trailers are over",
        ),
    ] {
        let (result, took) = frame(&bytes, &[]);
        let e = result.expect_err("refused").1;
        assert!(e.to_string().contains(says), "{e}");
        assert!(took <= 2 * MAX_HEAD + FIRST_READ, "took {took}");
    }
}

/// Sizes the peer declares are not trusted ahead of its bytes: a huge `Content-Length` or
/// chunk size meets the end of the stream as an error (no huge allocation, no overflow).
#[test]
fn declared_sizes_are_not_trusted_ahead_of_the_bytes() {
    for bytes in [
        "HTTP/1.1 200 OK\r\ncontent-length: 18446744073709551615\r\n\r\nabc",
        "HTTP/1.1 200 OK\r\ncontent-length: 99999999999999\r\n\r\nabc",
        "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nffffffffffffffff\r\nabc",
        "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n7fffffffffffffff\r\nabc",
        "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nfffffffffffffffd\r\nabc",
    ] {
        let (result, _) = frame(bytes.as_bytes(), &[]);
        assert!(result.is_err(), "{bytes:?}: {result:?}");
    }
}

#[test]
fn nothing_at_all_is_an_error_before_any_answer() {
    let (result, took) = frame(b"", &[]);
    assert!(matches!(result, Err((true, _))), "{result:?}");
    assert_eq!(took, 0);
}
