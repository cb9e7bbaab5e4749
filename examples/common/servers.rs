//! What every scenario example needs to run on its own: throwaway servers and the
//! `jobwarden` binary the worker processes run.

// Shared by several examples (and tests/scenarios.rs); each uses part of it.
#![allow(dead_code)]

use crate::testkit::{NatsServer, PgCluster};
use std::path::PathBuf;

pub struct Servers {
    pub nats: NatsServer,
    pub pg: PgCluster,
    dir: PathBuf,
}

impl Servers {
    /// A private nats-server and PostgreSQL (killed and removed on drop).
    pub fn start() -> anyhow::Result<Servers> {
        let nats = NatsServer::start()?;
        let pg = PgCluster::start_fast()?;
        let dir = std::env::temp_dir().join(format!("jobwarden-example-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        eprintln!(
            "servers: nats-server {} and PostgreSQL {} (throwaway); logs in {}",
            nats.url(),
            pg.url(),
            dir.display()
        );
        Ok(Servers { nats, pg, dir })
    }

    pub fn dir(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

/// `target/<profile>/jobwarden`, built first (a no-op when it is up to date).
pub fn jobwarden_binary() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    // target/<profile>/examples/<name> → target/<profile>/jobwarden
    let profile_dir = exe.parent().and_then(|p| p.parent()).ok_or_else(|| {
        anyhow::anyhow!("cannot find the target directory from {}", exe.display())
    })?;
    let release = profile_dir.file_name().is_some_and(|n| n == "release");
    let mut build = std::process::Command::new(env!("CARGO"));
    build.args(["build", "-q", "--bin", "jobwarden"]);
    if release {
        build.arg("--release");
    }
    let status = build.status()?;
    anyhow::ensure!(status.success(), "cargo build --bin jobwarden failed");
    Ok(profile_dir.join("jobwarden"))
}
