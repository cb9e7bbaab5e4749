//! The throwaway servers the other tests stand on: they start, answer, crash and come back
//! on the same port and data, and leave nothing behind.

mod common;

use common::testkit::{unique_name, NatsServer, PgCluster};
use std::net::{Ipv4Addr, TcpStream};
use std::time::Duration;

fn tcp_ready(port: u16) -> bool {
    TcpStream::connect_timeout(
        &(Ipv4Addr::LOCALHOST, port).into(),
        Duration::from_millis(200),
    )
    .is_ok()
}

#[test]
fn unique_name_is_a_safe_identifier() {
    let a = unique_name("Job-Test");
    let b = unique_name("Job-Test");
    assert_ne!(a, b);
    assert!(a.starts_with(&format!("job_test_{}_", std::process::id())));
    assert!(a
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'));
}

#[test]
fn nats_server_start_restart_drop() {
    let mut nats = NatsServer::start().expect("start nats-server");
    assert_eq!(nats.url(), format!("nats://127.0.0.1:{}", nats.port()));
    assert!(tcp_ready(nats.port()));
    assert!(NatsServer::version().unwrap().contains("v2."));

    nats.restart().expect("restart nats-server");
    assert!(tcp_ready(nats.port()));
    assert!(nats.dir().join("store").join("jetstream").exists());

    let dir = nats.dir().to_path_buf();
    drop(nats);
    assert!(!dir.exists(), "temp dir should be removed on drop");
}

#[tokio::test]
async fn pg_cluster_query_crash_restart() {
    async fn select_one(url: &str) -> i32 {
        let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .expect("connect to postgres");
        tokio::spawn(conn);
        client.query_one("SELECT 1", &[]).await.unwrap().get(0)
    }

    let pg = PgCluster::start().expect("start postgres");
    assert_eq!(select_one(&pg.url()).await, 1);

    pg.stop_immediate().expect("stop -m immediate");
    pg.start_again().expect("start again");
    assert_eq!(select_one(&pg.url()).await, 1);

    pg.restart_immediate().expect("restart_immediate");
    assert_eq!(select_one(&pg.url()).await, 1);

    let dir = pg.dir().to_path_buf();
    drop(pg);
    assert!(!dir.exists(), "cluster dir should be removed on drop");
}

#[tokio::test]
async fn pg_cluster_fast() {
    let pg = PgCluster::start_fast().expect("start postgres (fast)");
    let (client, conn) = tokio_postgres::connect(&pg.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let fsync: String = client.query_one("SHOW fsync", &[]).await.unwrap().get(0);
    assert_eq!(fsync, "off");
}

#[test]
fn ci_is_any_value_of_ci_but_empty_false_and_0() {
    use common::tools::ci_value_means_ci;
    for v in ["true", "1", "yes", "TRUE", "woodpecker"] {
        assert!(ci_value_means_ci(v), "CI={v:?} is CI");
    }
    for v in ["", " ", "false", "False", "0"] {
        assert!(!ci_value_means_ci(v), "CI={v:?} is not CI");
    }
}

#[test]
fn a_missing_tool_fails_in_ci_and_skips_elsewhere() {
    use common::tools::require_tool_as;
    let sh = std::path::Path::new("/bin/sh");
    assert_eq!(require_tool_as(true, "sh", sh, "-").as_deref(), Some(sh));
    let missing = std::path::Path::new("/nonexistent/jobwarden-tool");
    assert_eq!(
        require_tool_as(false, "tool", missing, "apt-get install tool"),
        None
    );
    // Not executable: as good as missing.
    let manifest = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"));
    assert_eq!(require_tool_as(false, "manifest", manifest, "-"), None);
    let failed = std::panic::catch_unwind(|| {
        require_tool_as(true, "tool", missing, "apt-get install tool");
    })
    .expect_err("in CI a missing tool fails the test");
    let message = failed.downcast_ref::<String>().cloned().unwrap_or_default();
    for part in [
        "tool is missing",
        "/nonexistent/jobwarden-tool",
        "apt-get install tool",
    ] {
        assert!(message.contains(part), "{part:?} not in {message:?}");
    }
}
