//! jobwarden: a worker sidecar that makes background jobs impossible to lose.
//!
//! NATS JetStream delivers, PostgreSQL owns. Producers publish jobs to `jobs.<queue>`; every
//! pod runs `jobwarden run` beside its application; it pulls jobs, claims each one atomically
//! in PostgreSQL, hands it to the application, records progress, retries with backoff and
//! dead-letters what cannot succeed. See `docs/architecture.md`.
//!
//! As a library: build a [`config::Config`], register Rust handlers with
//! [`worker::Worker::rust_handler`], and [`worker::Worker::start`] it; enqueue with
//! [`client::Client`].

// No function over 100 lines (clippy.toml) unless it says why.
#![warn(clippy::too_many_lines)]

#[macro_use]
mod macros;

pub mod backoff;
pub mod broker;
pub mod causes;
pub mod client;
pub mod completion;
pub mod config;
pub mod contract;
pub mod cron;
pub mod handler;
pub mod job;
pub mod jsonb;
pub mod liveness;
#[cfg(test)]
mod module_graph;
pub mod pg_url;
pub mod redact;
pub mod store;
pub mod telemetry;
pub mod view;
pub mod worker;

pub use handler::{Handler, HandlerResult, JobContext, JobError, Progress};
pub use worker::{RunningWorker, Worker};
