//! TLS and credentials against real servers: a throwaway PostgreSQL with `ssl=on` and
//! certificates this test makes (openssl), throwaway nats-servers with TLS, client
//! certificates, passwords, nkeys, tokens and the documented least-privilege permissions.

mod common;

use common::testkit::{NatsServer, PgCluster};
use common::{test_database_url, TestEnv};
use jobwarden::config::DatabaseConfig;
use jobwarden::handler::from_fn;
use jobwarden::store::Store;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// A throwaway certificate authority (openssl CLI) in a temp dir.
struct Pki {
    dir: PathBuf,
}

struct Issued {
    cert: PathBuf,
    key: PathBuf,
}

impl Pki {
    fn new(name: &str) -> Pki {
        let dir = std::env::temp_dir().join(format!(
            "jobwarden-pki-{name}-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        openssl(
            &dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
                "-days",
                "2",
                "-subj",
            ],
            &format!("/CN={name} test CA"),
        );
        Pki { dir }
    }

    fn ca(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// A certificate for `cn` with subject alternative names `sans` (e.g.
    /// "DNS:pg.test,IP:127.0.0.1"), good for servers and clients.
    fn issue(&self, file: &str, cn: &str, sans: &str) -> Issued {
        let key = format!("{file}.key");
        let csr = format!("{file}.csr");
        let crt = format!("{file}.crt");
        openssl(
            &self.dir,
            &[
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                &key,
                "-out",
                &csr,
                "-subj",
            ],
            &format!("/CN={cn}"),
        );
        let ext = self.dir.join(format!("{file}.ext"));
        std::fs::write(
            &ext,
            format!(
                "subjectAltName={sans}\nbasicConstraints=CA:FALSE\n\
                 extendedKeyUsage=serverAuth,clientAuth\nkeyUsage=critical,digitalSignature\n"
            ),
        )
        .unwrap();
        let serial = format!("0x{:016x}", rand::random::<u64>() >> 1);
        let out = Command::new("openssl")
            .current_dir(&self.dir)
            .args([
                "x509", "-req", "-in", &csr, "-CA", "ca.crt", "-CAkey", "ca.key",
            ])
            .args([
                "-set_serial",
                &serial,
                "-days",
                "2",
                "-out",
                &crt,
                "-extfile",
            ])
            .arg(&ext)
            .output()
            .expect("run openssl (apt-get install openssl)");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Issued {
            cert: self.dir.join(crt),
            key: self.dir.join(key),
        }
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn openssl(dir: &Path, args: &[&str], last: &str) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .arg(last)
        .output()
        .expect("run openssl (apt-get install openssl)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn read(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap()
}

/// A PostgreSQL that speaks TLS only: plain connections are refused by pg_hba.conf, the role
/// `app` must present a client certificate, `pw` a password.
struct TlsPostgres {
    cluster: PgCluster,
    pki: Pki,
}

/// What pg_hba.conf does with a plain (unencrypted) connection over TCP.
#[derive(PartialEq)]
enum Plain {
    Refused,
    /// Taken (trust): a client that connects without TLS is not stopped by the server, so a
    /// test sees for itself which connections are encrypted.
    Taken,
}

impl TlsPostgres {
    fn start() -> TlsPostgres {
        TlsPostgres::start_with(Plain::Refused)
    }

    fn start_with(plain: Plain) -> TlsPostgres {
        let pki = Pki::new("pg");
        // Issued for a name only, so connecting to 127.0.0.1 with verify-full must fail.
        let server = pki.issue("server", "pg.test", "DNS:pg.test");
        let cluster = PgCluster::start_fast().expect("start a throwaway PostgreSQL");
        let at = |f: &str| cluster.dir().join(f).display().to_string();
        cluster
            .reconfigure(
                &[
                    ("server.crt", &read(&server.cert)),
                    ("server.key", &read(&server.key)),
                    ("ca.crt", &read(&pki.ca())),
                ],
                &format!(
                    "ssl = on\nssl_cert_file = '{}'\nssl_key_file = '{}'\nssl_ca_file = '{}'\n\
                     password_encryption = 'scram-sha-256'",
                    at("server.crt"),
                    at("server.key"),
                    at("ca.crt")
                ),
                None,
            )
            .expect("turn TLS on");
        cluster
            .reconfigure(
                &[],
                "",
                Some(&format!(
                    "local all all trust\n\
                     hostssl all app 127.0.0.1/32 cert\n\
                     hostssl all pw 127.0.0.1/32 scram-sha-256\n\
                     hostssl all all 127.0.0.1/32 trust\n\
                     hostnossl all all 127.0.0.1/32 {}\n",
                    if plain == Plain::Taken {
                        "trust"
                    } else {
                        "reject"
                    }
                )),
            )
            .expect("require TLS in pg_hba.conf");
        TlsPostgres { cluster, pki }
    }

    /// `host=pg.test hostaddr=127.0.0.1 …`: the name the certificate was issued for, reached
    /// at the address it listens on.
    fn url(&self, user: &str, tls: &str) -> String {
        format!(
            "postgres://{user}@pg.test:{}/postgres?hostaddr=127.0.0.1&{tls}",
            self.cluster.port()
        )
    }
}

async fn connect(url: &str) -> Result<Store, String> {
    Store::connect(&DatabaseConfig {
        url: url.to_string(),
        schema: "public".into(),
        pool_size: 2,
        connect_timeout: Duration::from_secs(5),
    })
    .await
    .map_err(|e| e.to_string())
}

/// Why a connection that must fail failed.
async fn refused(url: &str) -> String {
    connect(url).await.err().expect("the connection must fail")
}

async fn broker_refused(cfg: &jobwarden::config::NatsConfig) -> String {
    match jobwarden::broker::Broker::connect(cfg).await {
        Ok(_) => panic!("the NATS connection must fail"),
        Err(e) => e.to_string(),
    }
}

/// Whether the store's connection is encrypted, as the server sees it.
async fn encrypted(store: &Store) -> bool {
    let c = store.raw().await.unwrap();
    c.query_one(
        "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

#[tokio::test]
async fn postgres_sslmodes_check_the_server_as_libpq_does() {
    let pg = TlsPostgres::start();
    let ca = pg.pki.ca();
    let ca = ca.display();
    let other = Pki::new("other");
    let other_ca = other.ca();

    // disable: plain, which this server refuses.
    let err = refused(&pg.url("postgres", "sslmode=disable")).await;
    assert!(err.contains("no encryption"), "{err}");

    // prefer (the default) and require: encrypted, certificate unchecked.
    for tls in ["sslmode=prefer", "sslmode=require", "application_name=x"] {
        let store = connect(&pg.url("postgres", tls)).await.unwrap();
        assert!(encrypted(&store).await, "{tls}");
    }

    // verify-ca: the chain must lead to the CA given; the name is not checked (127.0.0.1 is
    // not pg.test).
    let by_ip = format!(
        "postgres://postgres@127.0.0.1:{}/postgres?sslmode=verify-ca&sslrootcert={ca}",
        pg.cluster.port()
    );
    let store = connect(&by_ip).await.unwrap();
    assert!(encrypted(&store).await);
    let err = refused(&pg.url(
        "postgres",
        &format!("sslmode=verify-ca&sslrootcert={}", other_ca.display()),
    ))
    .await;
    assert!(
        err.contains("UnknownIssuer"),
        "another CA is not trusted: {err}"
    );
    // require with a CA file checks like verify-ca (libpq's rule).
    let err = refused(&pg.url(
        "postgres",
        &format!("sslmode=require&sslrootcert={}", other_ca.display()),
    ))
    .await;
    assert!(err.contains("UnknownIssuer"), "{err}");

    // verify-full: the chain and the name.
    let store = connect(&pg.url("postgres", &format!("sslmode=verify-full&sslrootcert={ca}")))
        .await
        .unwrap();
    assert!(encrypted(&store).await);
    let err = refused(&by_ip.replace("verify-ca", "verify-full")).await;
    assert!(
        err.contains("not valid for name \"127.0.0.1\""),
        "the name must match: {err}"
    );
    // Without sslrootcert, the system's store is trusted, and it does not know the test CA.
    let err = refused(&pg.url("postgres", "sslmode=verify-full")).await;
    assert!(err.contains("UnknownIssuer"), "{err}");
    // The libpq key=value form takes the same settings.
    let kv = format!(
        "host=pg.test hostaddr=127.0.0.1 port={} user=postgres dbname=postgres \
         sslmode=verify-full sslrootcert='{ca}'",
        pg.cluster.port()
    );
    assert!(encrypted(&connect(&kv).await.unwrap()).await);
}

#[tokio::test]
async fn postgres_client_certificates_and_passwords_authenticate_over_tls() {
    let pg = TlsPostgres::start();
    let ca = pg.pki.ca();
    let admin = connect(&pg.url("postgres", "sslmode=require"))
        .await
        .unwrap();
    admin
        .raw()
        .await
        .unwrap()
        .batch_execute("CREATE ROLE app LOGIN; CREATE ROLE pw LOGIN PASSWORD 'pg-s3cret-pw'")
        .await
        .unwrap();
    let app = pg.pki.issue("app", "app", "DNS:app");
    let with_cert = pg.url(
        "app",
        &format!(
            "sslmode=verify-full&sslrootcert={}&sslcert={}&sslkey={}",
            ca.display(),
            app.cert.display(),
            app.key.display()
        ),
    );
    let store = connect(&with_cert).await.unwrap();
    let who: String = store
        .raw()
        .await
        .unwrap()
        .query_one("SELECT current_user::text", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(who, "app");
    let err = refused(&pg.url(
        "app",
        &format!("sslmode=verify-full&sslrootcert={}", ca.display()),
    ))
    .await;
    assert!(
        err.contains("certificate"),
        "no client certificate, no login: {err}"
    );
    // A certificate for another name does not log in as app.
    let other = pg.pki.issue("other", "someone-else", "DNS:x");
    let err = refused(&pg.url(
        "app",
        &format!(
            "sslmode=require&sslcert={}&sslkey={}",
            other.cert.display(),
            other.key.display()
        ),
    ))
    .await;
    assert!(err.contains("certificate authentication failed"), "{err}");
    // A missing key file is named.
    let err = refused(&with_cert.replace("app.key", "missing.key")).await;
    assert!(
        err.contains("sslkey") && err.contains("missing.key"),
        "{err}"
    );

    // SCRAM password over TLS; a wrong one is refused and never shown.
    let pw = pg
        .url("pw", "sslmode=require")
        .replace("pw@", "pw:pg-s3cret-pw@");
    connect(&pw).await.unwrap();
    let err = refused(&pw.replace("pg-s3cret-pw", "wrong-pw-123")).await;
    assert!(err.contains("password authentication failed"), "{err}");
    assert!(!err.contains("wrong-pw-123"), "{err}");
}

const WORK: &str = r#"
[queues.work]
concurrency = 8
handler = { kind = "rust", name = "h" }
"#;

/// Runs `n` jobs through a worker of `env` and waits for them to complete.
async fn run_jobs(env: &TestEnv, n: usize) {
    run_jobs_on(env, n).await.shutdown().await;
}

/// Starts a worker of `env`, runs `n` jobs through it, waits for them to complete and
/// returns the worker, still running.
async fn run_jobs_on(env: &TestEnv, n: usize) -> jobwarden::RunningWorker {
    let h = from_fn(|_job| async { Ok(Some(json!({"ok": true}))) });
    let worker = env.worker(&[("h", h)]).await;
    let client = jobwarden::client::Client::new(env.store.clone(), env.broker.clone());
    for i in 0..n {
        client
            .enqueue("work", json!({ "i": i }), Default::default())
            .await
            .expect("enqueue");
    }
    assert!(
        env.wait_count("completed", n as i64, 30).await,
        "{n} jobs should complete; {} did",
        env.count("completed").await
    );
    worker
}

/// jobwarden's connections to the server other than the asking one: (pid, encrypted, the
/// start of its last statement).
async fn jobwarden_connections(env: &TestEnv) -> Vec<(i32, bool, String)> {
    let c = env.store.raw().await.unwrap();
    c.query(
        "SELECT a.pid, s.ssl, left(a.query, 60) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
         WHERE a.application_name = 'jobwarden' AND a.pid <> pg_backend_pid() ORDER BY a.pid",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2)))
    .collect()
}

#[tokio::test]
async fn a_worker_runs_jobs_with_postgres_over_verified_tls_only() {
    // The server takes plain connections too: that every connection is encrypted must be the
    // worker's doing, and is seen here, not enforced by pg_hba.conf (which would only turn a
    // plain connection into a failed one, and a failed LISTEN into quiet polling).
    let pg = TlsPostgres::start_with(Plain::Taken);
    let url = pg.url(
        "postgres",
        &format!("sslmode=verify-full&sslrootcert={}", pg.pki.ca().display()),
    );
    let env = TestEnv::with_database(&url, WORK).await;
    let worker = run_jobs_on(&env, 20).await;
    // While the worker runs: its connections are open, among them the scheduler's LISTEN
    // connection (opened on its own, outside the pool).
    let until = std::time::Instant::now() + Duration::from_secs(10);
    let (conns, listening) = loop {
        let conns = jobwarden_connections(&env).await;
        let listening = conns.iter().any(|(_, _, q)| q.starts_with("LISTEN"));
        if listening || std::time::Instant::now() > until {
            break (conns, listening);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    println!("jobwarden's connections while the worker runs: {conns:?}");
    assert!(
        listening,
        "no LISTEN connection of the worker's scheduler within 10 s: {conns:?}"
    );
    let plain: Vec<_> = conns.iter().filter(|(_, ssl, _)| !ssl).collect();
    assert!(
        plain.is_empty(),
        "every jobwarden connection must be encrypted (the worker is configured with \
         sslmode=verify-full); these are not (pid, ssl, last statement): {plain:?}"
    );
    worker.shutdown().await;
}

/// A nats-server with TLS (client certificates verified), users with passwords and the
/// permissions documented in docs/nats-permissions.conf.
fn nats_tls_conf(pki: &Pki, server: &Issued, verify_clients: bool) -> String {
    let permissions = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/nats-permissions.conf"),
    )
    .expect("docs/nats-permissions.conf");
    format!(
        "{permissions}\n\
         tls {{\n  cert_file: \"{}\"\n  key_file: \"{}\"\n  ca_file: \"{}\"\n  verify: {verify_clients}\n}}\n\
         authorization {{\n  users = [\n\
           {{ user: \"worker\", password: \"nats-s3cret-pw\", permissions: $JOBWARDEN_WORKER }}\n\
           {{ user: \"producer\", password: \"producer-pw\", permissions: $JOBWARDEN_PRODUCER }}\n\
         ]\n}}\n",
        server.cert.display(),
        server.key.display(),
        pki.ca().display()
    )
}

#[tokio::test]
async fn nats_over_tls_with_a_client_certificate_a_password_and_least_privilege() {
    let pki = Pki::new("nats");
    let server = pki.issue("nats", "nats.test", "DNS:localhost,IP:127.0.0.1");
    let client = pki.issue("client", "worker", "DNS:worker");
    let conf = nats_tls_conf(&pki, &server, true);
    let nats_toml = format!(
        "user = \"worker\"\npassword = \"nats-s3cret-pw\"\ntls_required = true\n\
         tls_ca_file = \"{}\"\ntls_cert_file = \"{}\"\ntls_key_file = \"{}\"\n",
        pki.ca().display(),
        client.cert.display(),
        client.key.display()
    );
    let env = TestEnv::with_servers(&test_database_url(), &conf, &nats_toml, WORK).await;
    assert!(env.broker.client.server_info().tls_required);
    assert!(env
        .broker
        .security_line()
        .contains("user worker with password"));
    run_jobs(&env, 20).await;
    // The worker never needed more than the documented permissions.
    let log = std::fs::read_to_string(env.nats.dir().join("nats.log")).unwrap();
    assert!(
        !log.contains("Permissions Violation"),
        "the worker was refused something:\n{}",
        log.lines()
            .filter(|l| l.contains("Permissions Violation"))
            .collect::<Vec<_>>()
            .join("\n")
    );

    // A producer with its permissions publishes jobs and nothing else.
    let producer = async_nats::ConnectOptions::new()
        .user_and_password("producer".into(), "producer-pw".into())
        .add_root_certificates(pki.ca())
        .add_client_certificate(client.cert.clone(), client.key.clone())
        .connect(env.nats.url())
        .await
        .expect("producer connects");
    let js = async_nats::jetstream::new(producer);
    js.publish("jobs.work", r#"{"id":"from-producer"}"#.into())
        .await
        .unwrap()
        .await
        .expect("a producer may publish jobs");
    let denied = js.delete_stream("JOBS").await;
    assert!(denied.is_err(), "a producer must not delete the stream");

    let mut cfg = env.config.nats.clone();
    // A wrong password is refused, named, and not shown.
    cfg.password = Some("wrong-nats-pw".into());
    let err = broker_refused(&cfg).await;
    assert!(err.contains("authorization violation"), "{err}");
    assert!(!err.contains("wrong-nats-pw"), "{err}");
    // Without a client certificate the server refuses the handshake.
    let mut cfg = env.config.nats.clone();
    cfg.tls_cert_file = None;
    cfg.tls_key_file = None;
    assert!(jobwarden::broker::Broker::connect(&cfg).await.is_err());
    // A CA that did not sign the server's certificate fails verification.
    let other = Pki::new("other");
    let mut cfg = env.config.nats.clone();
    cfg.tls_ca_file = Some(other.ca().display().to_string());
    let err = broker_refused(&cfg).await;
    assert!(err.to_lowercase().contains("certificate"), "{err}");
    // A missing file is named.
    let mut cfg = env.config.nats.clone();
    cfg.tls_ca_file = Some("/nonexistent/ca.pem".into());
    let err = broker_refused(&cfg).await;
    assert!(
        err.contains("nats.tls_ca_file /nonexistent/ca.pem"),
        "{err}"
    );
}

#[tokio::test]
async fn nats_nkeys_and_tokens_authenticate() {
    let user = nkeys::KeyPair::new_user();
    let seed_file =
        std::env::temp_dir().join(format!("jobwarden-seed-{:08x}", rand::random::<u32>()));
    std::fs::write(&seed_file, format!("{}\n", user.seed().unwrap())).unwrap();
    let conf = format!(
        "authorization {{ users = [ {{ nkey: \"{}\" }} ] }}",
        user.public_key()
    );
    let nats_toml = format!("nkey_seed_file = \"{}\"\n", seed_file.display());
    let env = TestEnv::with_servers(&test_database_url(), &conf, &nats_toml, WORK).await;
    run_jobs(&env, 5).await;
    // Another key is refused.
    let stranger = nkeys::KeyPair::new_user();
    std::fs::write(&seed_file, stranger.seed().unwrap()).unwrap();
    let err = broker_refused(&env.config.nats).await;
    assert!(err.contains("authorization violation"), "{err}");
    // A file that holds something else is named.
    std::fs::write(&seed_file, "not a seed").unwrap();
    let err = broker_refused(&env.config.nats).await;
    assert!(err.contains("does not hold a user nkey seed"), "{err}");
    let _ = std::fs::remove_file(&seed_file);

    let nats = NatsServer::start_with_conf("authorization { token: \"t0ken-s3cret\" }").unwrap();
    let mut cfg = env.config.nats.clone();
    cfg.nkey_seed_file = None;
    cfg.url = nats.url();
    cfg.token = Some("t0ken-s3cret".into());
    let broker = jobwarden::broker::Broker::connect(&cfg).await.unwrap();
    assert!(broker.security_line().contains("authentication: token"));
    cfg.token = Some("wrong".into());
    let err = broker_refused(&cfg).await;
    assert!(err.contains("authorization violation"), "{err}");
}
