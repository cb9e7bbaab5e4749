//! The http handler's response framing (`src/handler/http_client/framing.rs`) on arbitrary
//! bytes cut into arbitrary pieces: a response or an error, never a panic, never a byte past
//! the end taken, never more body than bytes taken.
//!
//! The input: its first byte says how many cuts follow (0–7), each two bytes (little
//! endian); the rest is what the server sends, then the connection ends.

#![no_main]

use jobwarden::handler::fuzzing::frame;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (n, rest) = match data.split_first() {
        Some((n, rest)) => (usize::from(*n % 8).min(rest.len() / 2), rest),
        None => (0, data),
    };
    let (cuts, bytes) = rest.split_at(n * 2);
    let cuts: Vec<usize> = cuts
        .chunks(2)
        .map(|c| usize::from(u16::from_le_bytes([c[0], c[1]])))
        .collect();
    let (result, took) = frame(bytes, &cuts);
    assert!(took <= bytes.len());
    if let Ok(r) = &result {
        assert!(r.body.len() <= took, "{} body bytes of {took}", r.body.len());
    }
});
