//! A worker process ("pod"): `jobwarden --config <file> run` under a fixed host name, as a
//! StatefulSet pod runs it, which a scenario can kill with SIGKILL and start again; and the
//! scenario's own connections ([`connect`]).

// Shared by several examples (and tests/scenarios.rs); each uses part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

pub struct Pod {
    pub name: String,
    jobwarden: PathBuf,
    config: PathBuf,
    log: PathBuf,
    env: Vec<(String, String)>,
    child: Option<std::process::Child>,
}

impl Pod {
    /// Starts the process; its output goes to `<log_dir>/<name>.log`.
    pub fn start(
        jobwarden: &Path,
        config: &Path,
        log_dir: &Path,
        name: &str,
    ) -> std::io::Result<Pod> {
        Pod::start_with(jobwarden, config, log_dir, name, &[])
    }

    /// Like [`Pod::start`], with more environment (kept for restarts).
    pub fn start_with(
        jobwarden: &Path,
        config: &Path,
        log_dir: &Path,
        name: &str,
        env: &[(&str, &str)],
    ) -> std::io::Result<Pod> {
        let mut pod = Pod {
            name: name.to_string(),
            jobwarden: jobwarden.to_path_buf(),
            config: config.to_path_buf(),
            log: log_dir.join(format!("{name}.log")),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            child: None,
        };
        pod.restart()?;
        Ok(pod)
    }

    /// Starts the process again under the same name (after [`Pod::kill9`]).
    pub fn restart(&mut self) -> std::io::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let child = std::process::Command::new(&self.jobwarden)
            .arg("--config")
            .arg(&self.config)
            .arg("run")
            .env("JOBWARDEN_WORKER__HOSTNAME", &self.name)
            .env("RUST_LOG", "warn")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        self.child = Some(child);
        Ok(())
    }

    /// SIGKILL, as a crashed node or an OOM kill: nothing is cleaned up.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait: a clean stop (drain).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(c.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let _ = c.wait();
        }
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// The scenario's own connections: the store (schema migrated) and the broker, with the
/// stream provisioned so a publish works before the workers (starting meanwhile, and
/// provisioning the same stream and their consumers) are up.
pub async fn connect(
    database_url: &str,
    schema: &str,
    nats_url: &str,
) -> anyhow::Result<(jobwarden::store::Store, jobwarden::broker::Broker)> {
    let store = jobwarden::store::Store::connect(&jobwarden::config::DatabaseConfig {
        url: database_url.to_string(),
        schema: schema.to_string(),
        pool_size: 8,
        connect_timeout: std::time::Duration::from_secs(5),
    })
    .await?;
    store.migrate().await?;
    let broker = jobwarden::broker::Broker::connect(&jobwarden::config::NatsConfig {
        url: nats_url.to_string(),
        ..Default::default()
    })
    .await?;
    broker.provision_stream().await?;
    Ok((store, broker))
}
