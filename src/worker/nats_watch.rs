//! The NATS client's watchdog: tells "the client's connection task is gone" from a mere
//! outage, and makes the first a service failure (the process exits and a new one connects).
//!
//! async-nats runs each connection in a task of its own and talks to it over a command
//! channel. If that task ends — async-nats 0.51 panics in it on a received header value that
//! holds a lone CR (`HeaderValue::from` asserts, `connection.rs` builds every received value
//! with it) — the client never works again: every publish, ack and pull fails with "channel
//! closed", while `connection_state()` still says `Connected` (the state's sender died with
//! the task). Read in async-nats 0.51.0 (`Client::flush`, `ConnectionHandler::process`):
//!
//! | the connection task | `client.flush()` |
//! |---|---|
//! | connected | `Ok` after a PING/PONG round trip |
//! | reconnecting (an outage) | waits — the command waits in the channel, and the flush answers once reconnected (also after a wait for room in a full channel) |
//! | gone | `SendError` at once (the channel's receiver is gone), or `FlushError` for a flush it held when it died (the answer's sender was dropped unanswered) |
//!
//! So the watchdog keeps one flush in flight at a time (never more than one command of its
//! own in the channel, however long an outage lasts) and treats an error — never a wait — as
//! the task's death. The `jobwarden` command's panic hook usually reports the panic first;
//! the watchdog needs no hook, and also catches a task that ended without panicking.

use async_nats::client::FlushErrorKind;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often the client is probed while it answers.
pub(crate) const PROBE_EVERY: Duration = Duration::from_secs(1);

/// The client's connection task has ended.
#[derive(Debug, thiserror::Error)]
#[error("the NATS client's connection task has ended ({kind}): every later publish, ack and pull of this process would fail; a new process connects anew (a known cause: async-nats 0.51 panics on a received message whose header value holds a lone CR — see the panic above)")]
pub(crate) struct ClientGone {
    kind: &'static str,
}

/// Probes `client` every [`PROBE_EVERY`] until `cancel` fires (`Ok`) or its connection task
/// is found gone (`Err`).
pub(crate) async fn run(
    client: async_nats::Client,
    cancel: CancellationToken,
) -> Result<(), ClientGone> {
    loop {
        // One flush at a time: during an outage it simply waits here.
        let probe = tokio::select! {
            _ = cancel.cancelled() => return Ok(()),
            r = client.flush() => r,
        };
        if let Err(e) = probe {
            return Err(ClientGone {
                kind: match e.kind() {
                    FlushErrorKind::SendError => "its command channel is closed",
                    FlushErrorKind::FlushError => "it dropped a flush unanswered",
                },
            });
        }
        tokio::select! {
            _ = cancel.cancelled() => return Ok(()),
            _ = tokio::time::sleep(PROBE_EVERY) => {}
        }
    }
}
