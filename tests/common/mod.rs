//! Shared test harness: each test gets a throwaway nats-server (free port, temp store, killed
//! on drop) and its own PostgreSQL schema (dropped on drop) in the test database
//! (`JOBWARDEN_TEST_DATABASE_URL`, default `postgres://postgres@127.0.0.1:5432/test`).
#![allow(dead_code)]

use jobwarden::broker::Broker;
use jobwarden::config::Config;
use jobwarden::store::Store;
use jobwarden::testkit::{unique_name, NatsServer};
use jobwarden::worker::{RunningWorker, Stats, Worker};
use jobwarden::Handler;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

pub fn test_database_url() -> String {
    std::env::var("JOBWARDEN_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

pub fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,jobwarden=info".into()),
        )
        .with_test_writer()
        .try_init();
}

pub struct TestEnv {
    pub nats: NatsServer,
    pub config: Config,
    pub store: Store,
    pub broker: Broker,
}

impl TestEnv {
    /// Starts a nats-server, migrates a fresh schema and parses `queues_toml` (queue sections
    /// and anything else) on top of test-friendly defaults.
    pub async fn new(extra_toml: &str) -> TestEnv {
        init_logs();
        let nats = NatsServer::start().expect("start nats-server");
        let schema = unique_name("t");
        let text = format!(
            "[database]\nurl = \"{}\"\nschema = \"{schema}\"\n\
             [nats]\nurl = \"{}\"\n\
             [worker]\napi_listen = \"127.0.0.1:0\"\nhostname = \"test\"\nscheduler_every = \"50ms\"\n\
             {extra_toml}",
            test_database_url(),
            nats.url()
        );
        let config = Config::from_toml(&text).expect("test config");
        let store = Store::connect(&config.database).await.expect("connect db");
        store.migrate().await.expect("migrate");
        let broker = Broker::connect(&config.nats).await.expect("connect nats");
        broker.provision_stream().await.expect("stream");
        for q in config.queues.keys() {
            broker.provision_consumer(q).await.expect("consumer");
        }
        TestEnv {
            nats,
            config,
            store,
            broker,
        }
    }

    /// Starts a worker with the given Rust handlers registered by name.
    pub async fn worker(&self, handlers: &[(&str, Arc<dyn Handler>)]) -> RunningWorker {
        self.worker_with(self.config.clone(), handlers).await
    }

    pub async fn worker_with(
        &self,
        config: Config,
        handlers: &[(&str, Arc<dyn Handler>)],
    ) -> RunningWorker {
        let mut w = Worker::new(config);
        for (name, h) in handlers {
            w = w.rust_handler(name, h.clone());
        }
        w.start(CancellationToken::new())
            .await
            .expect("worker start")
    }

    /// Publishes a raw body to `jobs.<queue>` like any producer with a plain NATS client.
    pub async fn publish_raw(&self, queue: &str, body: impl Into<Vec<u8>>) {
        self.broker
            .js
            .publish(format!("jobs.{queue}"), body.into().into())
            .await
            .expect("publish")
            .await
            .expect("publish ack");
    }

    /// Count of jobs with `status`.
    pub async fn count(&self, status: &str) -> i64 {
        let c = self.store.raw().await.unwrap();
        c.query_one("SELECT count(*) FROM jobs WHERE status = $1", &[&status])
            .await
            .unwrap()
            .get(0)
    }

    pub async fn status_of(&self, id: &str) -> Option<String> {
        self.store.job_get(id).await.unwrap().map(|j| j.status)
    }

    /// Messages the queue's consumer still holds (not yet delivered + delivered, unacked).
    pub async fn consumer_backlog(&self, queue: &str) -> (u64, usize) {
        let mut c = self.broker.consumer(queue).await.unwrap();
        let info = c.info().await.unwrap();
        (info.num_pending, info.num_ack_pending)
    }

    /// Waits until the consumer has nothing pending or unacked.
    pub async fn wait_consumer_drained(&self, queue: &str) {
        let drained = wait_for(Duration::from_secs(20), || async {
            self.consumer_backlog(queue).await == (0, 0)
        })
        .await;
        let last = self.consumer_backlog(queue).await;
        assert!(
            drained,
            "consumer {queue} still holds (pending, ack_pending) = {last:?}"
        );
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        // Drop the schema on a runtime (and connection) of its own: Drop cannot await, and the
        // pool's connections are driven by the test's runtime, which is blocked here.
        let db = self.config.database.clone();
        let _ = std::thread::spawn(move || {
            tokio::runtime::Runtime::new().unwrap().block_on(async {
                if let Ok(store) = Store::connect(&db).await {
                    let _ = store.drop_schema().await;
                }
            })
        })
        .join();
    }
}

/// Polls `cond` every 20 ms until it holds or `limit` passes; returns whether it held.
pub async fn wait_for<F, Fut>(limit: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if cond().await {
            return true;
        }
        if start.elapsed() > limit {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn stat(c: &std::sync::atomic::AtomicU64) -> u64 {
    Stats::get(c)
}
