//! JetStream: connection, idempotent provisioning of the stream and per-queue consumers, and
//! publishing jobs.
//!
//! Subject scheme (chosen so priority bands fit later without breaking producers):
//! - `<prefix>.<queue>` — a job for `queue` at the default priority. Plain producers publish
//!   here, with or without an envelope.
//! - `<prefix>.<queue>.<p>` (p = 0…9) — reserved for priority bands. These filters do not
//!   overlap the bare subject, so each band can get its own durable consumer on the
//!   work-queue stream (JetStream 2.9 forbids overlapping filters there).
//!
//! One durable pull consumer per queue (`jobwarden-<queue>`), shared by every pod: explicit
//! ack, `max_deliver` -1 (Postgres counts attempts, not the broker), no backoff list, and
//! `ack_wait` above stale_after + sweep_every (invariant 5).

use crate::config::NatsConfig;
use crate::job::Envelope;
use async_nats::jetstream::{self, consumer, stream};
use async_nats::HeaderMap;
use std::time::Duration;
use tracing::info;

#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("NATS at {url} is unreachable: {cause}; check nats.url and that nats-server is running with JetStream (-js)")]
    Unreachable { url: String, cause: String },
    #[error("JetStream is not enabled on the NATS server at {url} ({cause}); start nats-server with -js")]
    NoJetStream { url: String, cause: String },
    #[error("stream {stream}: {cause}")]
    Stream { stream: String, cause: String },
    #[error("consumer {consumer}: {cause}")]
    Consumer { consumer: String, cause: String },
    #[error("publish to {subject} failed: {cause}")]
    Publish { subject: String, cause: String },
}

pub type Result<T, E = BrokerError> = std::result::Result<T, E>;

#[derive(Clone)]
pub struct Broker {
    pub client: async_nats::Client,
    pub js: jetstream::Context,
    cfg: NatsConfig,
}

impl Broker {
    /// Connects (the client reconnects by itself afterwards) and checks that JetStream answers.
    pub async fn connect(cfg: &NatsConfig) -> Result<Broker> {
        let redacted = crate::config::redact_url(&cfg.url);
        let mut opts = async_nats::ConnectOptions::new()
            .name("jobwarden")
            .connection_timeout(Duration::from_secs(5))
            .max_reconnects(None);
        if let Some(path) = &cfg.credentials_file {
            opts = opts
                .credentials_file(path)
                .await
                .map_err(|e| BrokerError::Unreachable {
                    url: redacted.clone(),
                    cause: format!("cannot read nats.credentials_file {path}: {e}"),
                })?;
        }
        let client =
            opts.connect(cfg.url.as_str())
                .await
                .map_err(|e| BrokerError::Unreachable {
                    url: redacted.clone(),
                    cause: e.to_string(),
                })?;
        let js = jetstream::new(client.clone());
        // Ask the JetStream API directly: async-nats' typed account query does not parse
        // 2.9's answer, and all we need is "JetStream answers".
        let reply = client
            .request("$JS.API.INFO", "".into())
            .await
            .map_err(|e| BrokerError::NoJetStream {
                url: redacted.clone(),
                cause: e.to_string(),
            })?;
        let info: serde_json::Value = serde_json::from_slice(&reply.payload).unwrap_or_default();
        if let Some(err) = info.get("error") {
            return Err(BrokerError::NoJetStream {
                url: redacted,
                cause: err.to_string(),
            });
        }
        Ok(Broker {
            client,
            js,
            cfg: cfg.clone(),
        })
    }

    /// The server's version, e.g. "2.9.10".
    pub fn server_version(&self) -> String {
        self.client.server_info().version
    }

    /// One line saying which server features this worker relies on.
    pub fn features_line(&self) -> String {
        let v = self.server_version();
        let (major, minor) = parse_version(&v);
        let newer = (major, minor) >= (2, 10);
        format!(
            "nats-server {v}: using JetStream work-queue stream, durable pull consumers, \
             explicit acks, in-progress acks, message dedup (Nats-Msg-Id); {}",
            if newer {
                "2.10+ detected (term reasons available; not required)"
            } else {
                "pre-2.10 server: term reasons are not sent (not required)"
            }
        )
    }

    pub fn stream_name(&self) -> &str {
        &self.cfg.stream
    }

    /// The subject a queue's default-priority jobs are published to.
    pub fn subject(&self, queue: &str) -> String {
        format!("{}.{}", self.cfg.subject_prefix, queue)
    }

    /// The durable consumer name of a queue.
    pub fn consumer_name(queue: &str) -> String {
        format!("jobwarden-{queue}")
    }

    /// Creates the stream if missing, or updates the settings jobwarden owns (subjects,
    /// duplicate window) while keeping an operator's other settings (replicas, limits).
    pub async fn provision_stream(&self) -> Result<()> {
        let name = self.cfg.stream.clone();
        let subjects = format!("{}.>", self.cfg.subject_prefix);
        let err = |cause: String| BrokerError::Stream {
            stream: name.clone(),
            cause,
        };
        match self.js.get_stream(&name).await {
            Ok(mut s) => {
                let info = s.info().await.map_err(|e| err(e.to_string()))?;
                let mut config = info.config.clone();
                if config.retention != stream::RetentionPolicy::WorkQueue {
                    return Err(err(format!(
                        "exists with retention {:?}; jobwarden needs a work-queue stream: \
                         delete it or set nats.stream to another name",
                        config.retention
                    )));
                }
                let mut changed = false;
                if !config.subjects.contains(&subjects) {
                    config.subjects.push(subjects);
                    changed = true;
                }
                if config.duplicate_window < self.cfg.duplicate_window {
                    config.duplicate_window = self.cfg.duplicate_window;
                    changed = true;
                }
                if changed {
                    self.js
                        .update_stream(config)
                        .await
                        .map_err(|e| err(e.to_string()))?;
                }
            }
            Err(_) => {
                self.js
                    .create_stream(stream::Config {
                        name: name.clone(),
                        subjects: vec![subjects],
                        retention: stream::RetentionPolicy::WorkQueue,
                        storage: stream::StorageType::File,
                        duplicate_window: self.cfg.duplicate_window,
                        ..Default::default()
                    })
                    .await
                    .map_err(|e| err(e.to_string()))?;
                info!(stream = %name, "created stream");
            }
        }
        Ok(())
    }

    /// Creates or updates a queue's durable pull consumer.
    pub async fn provision_consumer(&self, queue: &str) -> Result<consumer::PullConsumer> {
        let name = Self::consumer_name(queue);
        let stream = self.stream().await?;
        stream
            .create_consumer(consumer::pull::Config {
                durable_name: Some(name.clone()),
                filter_subject: self.subject(queue),
                ack_policy: consumer::AckPolicy::Explicit,
                ack_wait: self.cfg.ack_wait,
                max_deliver: -1,
                max_ack_pending: self.cfg.max_ack_pending,
                max_waiting: 512,
                ..Default::default()
            })
            .await
            .map_err(|e| BrokerError::Consumer {
                consumer: name,
                cause: e.to_string(),
            })
    }

    /// Gets a queue's existing consumer (when provisioning is off).
    pub async fn consumer(&self, queue: &str) -> Result<consumer::PullConsumer> {
        let name = Self::consumer_name(queue);
        self.stream()
            .await?
            .get_consumer(&name)
            .await
            .map_err(|e| BrokerError::Consumer {
                consumer: name.clone(),
                cause: format!(
                    "{e}; create it (filter {}) or enable nats.provision",
                    self.subject(queue)
                ),
            })
    }

    pub async fn stream(&self) -> Result<stream::Stream> {
        self.js
            .get_stream(&self.cfg.stream)
            .await
            .map_err(|e| BrokerError::Stream {
                stream: self.cfg.stream.clone(),
                cause: format!("{e}; create it or enable nats.provision"),
            })
    }

    /// Publishes a job envelope with `Nats-Msg-Id: <id>:<generation>` and waits for the
    /// stream's acknowledgement. A new generation per republish keeps JetStream's duplicate
    /// window from silently dropping a legitimate republish.
    pub async fn publish_job(
        &self,
        queue: &str,
        envelope: &Envelope,
        generation: i32,
    ) -> Result<jetstream::context::PublishAckFuture> {
        let subject = self.subject(queue);
        let body = serde_json::to_vec(envelope).expect("an envelope always serialises");
        let mut headers = HeaderMap::new();
        if let Some(id) = &envelope.id {
            headers.insert(
                async_nats::header::NATS_MESSAGE_ID,
                format!("{id}:{generation}").as_str(),
            );
        }
        self.js
            .publish_with_headers(subject.clone(), headers, body.into())
            .await
            .map_err(|e| BrokerError::Publish {
                subject,
                cause: e.to_string(),
            })
    }
}

fn parse_version(v: &str) -> (u32, u32) {
    let mut it = v.trim_start_matches('v').split('.');
    let major = it.next().and_then(|s| s.parse().ok()).unwrap_or(0);
    let minor = it.next().and_then(|s| s.parse().ok()).unwrap_or(0);
    (major, minor)
}

#[cfg(test)]
mod tests {
    #[test]
    fn versions_parse() {
        assert_eq!(super::parse_version("2.9.10"), (2, 9));
        assert_eq!(super::parse_version("v2.15.1"), (2, 15));
        assert_eq!(super::parse_version("junk"), (0, 0));
    }
}
