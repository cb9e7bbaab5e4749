//! Secrets never leave the process (issue 27, part 3). Passwords and tokens are given every
//! way the documentation allows — in URLs (plain, percent-encoded, in a query, in a libpq
//! `key=value` string), by environment, in the configuration file, in an nkey seed file, and
//! as all-digit values — and things are made to fail: HTTP handlers that refuse the
//! connection, answer 500 echoing the request's credentials, or hang; databases and NATS
//! servers that are unreachable or refuse the login; settings of the wrong type. Then the
//! logs, `jobs.last_error`, `job_attempts.error`, the dead-letter events, `config check`'s
//! output and the dashboard's pages are searched for every secret.
//!
//! Each secret is a distinctive string, so finding it anywhere is a leak and not a
//! coincidence.

mod common;

use base64::Engine;
use common::testkit::{free_port, unique_name, NatsServer, PgCluster};
use common::{run_cli, test_database_url, text, TestEnv};
use futures::StreamExt;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// `Basic` credentials as the http handler sends them for `user:password`.
fn basic(user_password: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(user_password)
}

/// Fails, showing the text, when any of `secrets` is in it.
fn assert_hidden(what: &str, text: &str, secrets: &[String]) {
    for secret in secrets {
        assert!(
            !text.contains(secret.as_str()),
            "{what} shows the secret {secret:?}:\n{text}"
        );
    }
}

/// The test database URL with another user information (the test server trusts every
/// connection, so a password there is ignored by the server but seen by every line of
/// jobwarden that handles the URL).
fn db_url_as(user_info: &str) -> String {
    let base = test_database_url();
    let (scheme, rest) = base.split_once("://").unwrap();
    let host = rest.rsplit_once('@').map(|(_, h)| h).unwrap_or(rest);
    format!("{scheme}://{user_info}@{host}")
}

/// A scratch directory for one test's files.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(unique_name(name));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// An application that answers every request with a 500 whose body repeats what it was
/// sent: the request's head (with its `authorization` header) and the credentials decoded
/// from it — as a careless application's error page might.
async fn echoing_app() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut req = Vec::new();
                let mut chunk = [0u8; 4096];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    match sock.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => req.extend_from_slice(&chunk[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&req).to_string();
                let head = head.split("\r\n\r\n").next().unwrap_or("").to_string();
                let decoded = head
                    .lines()
                    .find_map(|l| l.strip_prefix("authorization: Basic "))
                    .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
                    .map(|b| String::from_utf8_lossy(&b).to_string())
                    .unwrap_or_default();
                let body = format!("denied {decoded} | {}", head.replace("\r\n", " | "));
                let answer = format!(
                    "HTTP/1.1 500 Internal Server Error\r\ncontent-length: {}\r\n\
                     connection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = sock.write_all(answer.as_bytes()).await;
            });
        }
    });
    port
}

/// An application that takes connections and never answers.
async fn hanging_app() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((sock, _)) = listener.accept().await {
            held.push(sock);
        }
    });
    port
}

/// Runs `jobwarden run` with `envs`; stdout and stderr go to files in `dir`.
fn spawn_worker(dir: &Path, config: &Path, envs: &[(&str, &str)]) -> std::process::Child {
    std::process::Command::new(env!("CARGO_BIN_EXE_jobwarden"))
        .args(["--config", config.to_str().unwrap(), "run"])
        .envs(envs.iter().copied())
        .stdin(std::process::Stdio::null())
        .stdout(std::fs::File::create(dir.join("run.out")).unwrap())
        .stderr(std::fs::File::create(dir.join("run.err")).unwrap())
        .spawn()
        .expect("spawn jobwarden run")
}

/// Stops a `jobwarden run` (SIGTERM, then SIGKILL after 30 s) and returns its output.
async fn stop_worker(dir: &Path, mut child: std::process::Child) -> String {
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    for _ in 0..300 {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = child.kill();
    let _ = child.wait();
    worker_output(dir)
}

fn worker_output(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("run.out")).unwrap_or_default()
        + &std::fs::read_to_string(dir.join("run.err")).unwrap_or_default()
}

/// An HTTP handler's URL password (`http://app:pw@…`), in the file and by environment,
/// plain, percent-encoded and all digits: its jobs fail every way an HTTP handler can
/// fail and die; the password and the `Basic` credentials built from it reach neither the
/// errors stored with the jobs and their attempts, nor the dead-letter events, the
/// dashboard, `dlq list` or the worker's debug log.
#[tokio::test]
async fn a_handler_urls_password_stays_out_of_errors_events_logs_and_the_dashboard() {
    const PLAIN: &str = "s3cr3tPW-x7";
    // Percent-encoded in the URL; the application receives `p@ss-E5c4`.
    const ENCODED: &str = "p%40ss-E5c4";
    const DECODED: &str = "p@ss-E5c4";
    const DIGITS: &str = "98765432";
    const PG_SECRET: &str = "pgPW-w5v3";
    const NATS_SECRET: &str = "natsPW-q4z9";
    const DASH_SECRET: &str = "dashTOKEN-m2k8-0123456789";
    let secrets: Vec<String> = [
        PLAIN,
        ENCODED,
        DECODED,
        DIGITS,
        PG_SECRET,
        NATS_SECRET,
        DASH_SECRET,
    ]
    .into_iter()
    .map(String::from)
    .chain([
        basic(&format!("app:{PLAIN}")),
        basic(&format!("app:{DECODED}")),
        basic(&format!("app:{DIGITS}")),
    ])
    .collect();

    let dir = scratch("secrets_handler");
    let refused_port = free_port();
    let echo_port = echoing_app().await;
    let hang_port = hanging_app().await;
    let queue = |name: &str, url: &str, extra: &str| {
        format!(
            "[queues.{name}]\nmax_attempts = 2\nbackoff = {{ kind = \"fixed\", base = \"50ms\" }}\n\
             {extra}handler = {{ kind = \"http\", url = \"{url}\" }}\n"
        )
    };
    // Three in the file; the fourth (all digits) comes from the environment below.
    let file_queues = [
        queue(
            "refused",
            &format!("http://app:{PLAIN}@127.0.0.1:{refused_port}/jobs"),
            "",
        ),
        queue(
            "echo",
            &format!("http://app:{ENCODED}@127.0.0.1:{echo_port}/jobs"),
            "",
        ),
        queue(
            "hang",
            &format!("http://app:{PLAIN}@127.0.0.1:{hang_port}/jobs"),
            "timeout = \"300ms\"\n",
        ),
    ]
    .concat();
    let digits_url = format!("http://app:{DIGITS}@127.0.0.1:{echo_port}/digits");
    let db_url = db_url_as(&format!("postgres:{PG_SECRET}"));
    let env = TestEnv::with_servers(
        &db_url,
        &format!(
            "authorization {{ users = [ {{ user: \"worker\", password: \"{NATS_SECRET}\" }} ] }}"
        ),
        &format!("user = \"worker\"\npassword = \"{NATS_SECRET}\"\n"),
        &format!("{file_queues}{}", queue("digits", &digits_url, "")),
    )
    .await;
    let dashboard = format!("127.0.0.1:{}", free_port());
    let file = dir.join("jobwarden.toml");
    std::fs::write(
        &file,
        format!(
            "[database]\nschema = \"{}\"\n[nats]\nurl = \"{}\"\nuser = \"worker\"\n\
             [worker]\napi_listen = \"127.0.0.1:0\"\nops_listen = \"127.0.0.1:0\"\n\
             scheduler_every = \"50ms\"\n[dashboard]\nlisten = \"{dashboard}\"\n{file_queues}",
            env.config.database.schema,
            env.nats.url()
        ),
    )
    .unwrap();
    let worker_env = [
        ("JOBWARDEN_DATABASE__URL", db_url.as_str()),
        ("JOBWARDEN_NATS__PASSWORD", NATS_SECRET),
        ("JOBWARDEN_DASHBOARD__ADMIN_TOKEN", DASH_SECRET),
        ("JOBWARDEN_WORKER__HOSTNAME", "secrets-test"),
        ("JOBWARDEN_QUEUES__DIGITS__MAX_ATTEMPTS", "2"),
        ("JOBWARDEN_QUEUES__DIGITS__BACKOFF__KIND", "fixed"),
        ("JOBWARDEN_QUEUES__DIGITS__BACKOFF__BASE", "50ms"),
        ("JOBWARDEN_QUEUES__DIGITS__HANDLER__KIND", "http"),
        (
            "JOBWARDEN_QUEUES__DIGITS__HANDLER__URL",
            digits_url.as_str(),
        ),
        ("RUST_LOG", "debug"),
    ];
    let mut events = env
        .broker
        .client
        .subscribe("jobwarden.dead.>")
        .await
        .unwrap();
    env.broker.client.flush().await.unwrap();
    let child = spawn_worker(&dir, &file, &worker_env);
    for q in ["refused", "echo", "hang", "digits"] {
        env.publish_raw(
            q,
            json!({"id": format!("{q}-1"), "payload": {}}).to_string(),
        )
        .await;
    }
    let all_dead = env.wait_count("dead", 4, 60).await;
    if !all_dead {
        let log = stop_worker(&dir, child).await;
        panic!("the four jobs did not die; log:\n{log}");
    }
    let mut outputs: Vec<(String, String)> = Vec::new();

    // What is stored with the jobs and their attempts.
    let db = env.store.raw().await.unwrap();
    let mut last_errors = std::collections::BTreeMap::new();
    for row in db
        .query("SELECT id, coalesce(last_error, '') FROM jobs", &[])
        .await
        .unwrap()
    {
        last_errors.insert(row.get::<_, String>(0), row.get::<_, String>(1));
    }
    let attempts: Vec<String> = db
        .query("SELECT coalesce(error, '') FROM job_attempts", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(attempts.len(), 8, "two attempts per job: {attempts:?}");
    // The errors are there, with the URL shown and its password masked.
    let masked = format!("http://app:****@127.0.0.1:{refused_port}/jobs");
    assert!(
        last_errors["refused-1"].contains(&format!("request to {masked} failed")),
        "{last_errors:?}"
    );
    let masked = format!("HTTP 500 from http://app:****@127.0.0.1:{echo_port}/jobs: denied");
    assert!(last_errors["echo-1"].contains(&masked), "{last_errors:?}");
    assert!(
        last_errors["hang-1"].contains("timed out after 300ms"),
        "{last_errors:?}"
    );
    let masked = format!("HTTP 500 from http://app:****@127.0.0.1:{echo_port}/digits: denied");
    assert!(last_errors["digits-1"].contains(&masked), "{last_errors:?}");
    outputs.push(("jobs.last_error".into(), format!("{last_errors:#?}")));
    outputs.push(("job_attempts.error".into(), attempts.join("\n")));

    // The dead-letter events, one per job.
    let mut received = Vec::new();
    while received.len() < 4 {
        let Ok(Some(m)) = tokio::time::timeout(Duration::from_secs(10), events.next()).await else {
            break;
        };
        received.push(String::from_utf8_lossy(&m.payload).to_string());
    }
    assert_eq!(received.len(), 4, "dead-letter events: {received:?}");
    for e in &received {
        let v: Value = serde_json::from_str(e).unwrap();
        assert!(v["error"].as_str().is_some_and(|s| !s.is_empty()), "{e}");
    }
    outputs.push(("dead-letter events".into(), received.join("\n")));

    // The dashboard's pages.
    let http = reqwest::Client::new();
    let mut pages = vec!["/".to_string(), "/dead".into(), "/jobs".into()];
    pages.extend(last_errors.keys().map(|id| format!("/job?id={id}")));
    for page in pages {
        let resp = http
            .get(format!("http://{dashboard}{page}"))
            .send()
            .await
            .unwrap();
        assert!(resp.status().is_success(), "{page}: {}", resp.status());
        let body = resp.text().await.unwrap();
        if page == "/dead" || page.starts_with("/job?") {
            assert!(
                body.contains("HTTP 500 from")
                    || body.contains("timed out")
                    || body.contains("request to"),
                "{page} shows the errors:\n{body}"
            );
        }
        outputs.push((format!("dashboard {page}"), body));
    }

    // The operator's command line.
    let out = run_cli(
        &["--config", file.to_str().unwrap(), "dlq", "list"],
        &worker_env,
    );
    assert!(out.status.success(), "{}", text(&out));
    outputs.push(("dlq list".into(), text(&out)));

    // The worker's own log, at debug level.
    let log = stop_worker(&dir, child).await;
    assert!(log.contains("PostgreSQL connected"), "{log}");
    // The dead jobs are logged with their errors, the URL's password masked.
    assert!(
        log.contains("job dead-lettered") && log.contains("http://app:****@127.0.0.1:"),
        "{log}"
    );
    outputs.push(("worker log".into(), log));

    for (what, output) in &outputs {
        assert_hidden(what, output, &secrets);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Secrets made of digits, given by environment, are taken as the strings they are (a
/// password of digits is a password; leading zeros included), and `config check` prints
/// none of them. A secret of the wrong type in the file is reported without its value, and
/// so is a file that does not parse on the line of a secret.
#[tokio::test]
async fn secrets_of_digits_are_taken_as_given_and_type_errors_do_not_print_them() {
    // Leading zeros: a number would lose them, and the server would refuse the login.
    const NATS_DIGITS: &str = "00424242";
    const TOKEN_DIGITS: &str = "13572468";
    const DASH_DIGITS: &str = "12345678901234567890";
    let dir = scratch("secrets_digits");
    let env = TestEnv::with_servers(
        &test_database_url(),
        &format!(
            "authorization {{ users = [ {{ user: \"worker\", password: \"{NATS_DIGITS}\" }} ] }}"
        ),
        &format!("user = \"worker\"\npassword = \"{NATS_DIGITS}\"\n"),
        "[queues.work]\nhandler = { kind = \"exec\", command = [\"true\"] }\n",
    )
    .await;
    // The file holds no secret.
    let file = dir.join("jobwarden.toml");
    let mut plain = env.config.clone();
    plain.nats.user = None;
    plain.nats.password = None;
    std::fs::write(&file, plain.to_redacted_toml()).unwrap();
    let config = file.to_str().unwrap();
    let mut outputs = Vec::new();

    let by_env = [
        ("JOBWARDEN_NATS__USER", "worker"),
        ("JOBWARDEN_NATS__PASSWORD", NATS_DIGITS),
        ("JOBWARDEN_DASHBOARD__ADMIN_TOKEN", DASH_DIGITS),
    ];
    let out = run_cli(&["--config", config, "config", "check"], &by_env);
    let check = text(&out);
    assert!(out.status.success(), "{check}");
    assert!(
        check.contains("nats.password is set (not shown)"),
        "{check}"
    );
    assert!(
        check.contains("dashboard.admin_token is set (not shown)"),
        "{check}"
    );
    outputs.push(("config check, digits by env", check));
    let out = run_cli(
        &["--config", config, "config", "check"],
        &[("JOBWARDEN_NATS__TOKEN", TOKEN_DIGITS)],
    );
    let check = text(&out);
    assert!(out.status.success(), "{check}");
    assert!(check.contains("nats.token is set (not shown)"), "{check}");
    outputs.push(("config check, token of digits by env", check));

    // The password reaches the server as given: the login works.
    let out = run_cli(
        &[
            "--config", config, "enqueue", "work", "{}", "--id", "digits-1",
        ],
        &by_env,
    );
    let enqueued = text(&out);
    assert!(out.status.success(), "{enqueued}");
    outputs.push(("enqueue with digits", enqueued));
    // A wrong one of digits is refused, and not shown.
    let out = run_cli(
        &["--config", config, "enqueue", "work", "{}"],
        &[
            ("JOBWARDEN_NATS__USER", "worker"),
            ("JOBWARDEN_NATS__PASSWORD", "00424243"),
        ],
    );
    let refused = text(&out);
    assert!(!out.status.success(), "{refused}");
    assert!(refused.contains("authorization violation"), "{refused}");
    assert!(!refused.contains("00424243"), "{refused}");
    outputs.push(("enqueue with a wrong password", refused));

    // In the file, a number where a secret belongs is an error that names the setting and
    // says to quote it, without the value.
    for (section, key, value) in [
        ("nats", "password", "24681357"),
        ("nats", "token", "97531864"),
        ("dashboard", "admin_token", "1122334455667788"),
        ("database", "url", "55667788"),
    ] {
        let typed = dir.join(format!("typed-{key}.toml"));
        let mut text_ = std::fs::read_to_string(&file).unwrap();
        text_ = text_.replace(
            &format!("[{section}]\n"),
            &format!("[{section}]\n{key} = {value}\n"),
        );
        if section == "database" {
            // Replaces the file's own url.
            text_ = text_.replacen(&format!("url = \"{}\"\n", plain.database.url), "", 1);
        }
        if !text_.contains(&format!("[{section}]")) {
            text_.push_str(&format!("\n[{section}]\n{key} = {value}\n"));
        }
        std::fs::write(&typed, &text_).unwrap();
        let out = run_cli(
            &["--config", typed.to_str().unwrap(), "config", "check"],
            &[],
        );
        let said = text(&out);
        assert_eq!(out.status.code(), Some(2), "{said}");
        assert!(said.contains(&format!("{section}.{key}")), "{said}");
        assert!(said.contains("quote"), "{said}");
        assert!(!said.contains(value), "{key}: {said}");
    }
    // A file that does not parse, on the line of a secret.
    let broken = dir.join("broken.toml");
    std::fs::write(&broken, "[nats]\npassword = \"Unterminated-Secret-77\n").unwrap();
    let out = run_cli(
        &["--config", broken.to_str().unwrap(), "config", "check"],
        &[],
    );
    let said = text(&out);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(said.contains("line 2"), "{said}");
    outputs.push(("config check, a broken file", said));
    // A handler URL that is not allowed is named without its password, however short
    // (too short to be searched for in free text: the URL's own redaction hides it).
    let out = run_cli(
        &["--config", config, "config", "check"],
        &[(
            "JOBWARDEN_QUEUES__WEB__HANDLER",
            "{ kind = \"http\", url = \"https://app:pw@127.0.0.1:1/x\" }",
        )],
    );
    let said = text(&out);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(said.contains("https://app:****@127.0.0.1:1/x"), "{said}");
    assert!(!said.contains("app:pw@"), "{said}");
    outputs.push(("config check, an https handler", said));
    // `config check` of a valid configuration shows a handler URL without its password.
    let out = run_cli(
        &["--config", config, "config", "check"],
        &[(
            "JOBWARDEN_QUEUES__WEB__HANDLER",
            "{ kind = \"http\", url = \"http://app:HandlerPW-tls-3@127.0.0.1:1/x?token=QueryTok-9\" }",
        )],
    );
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("http://app:****@127.0.0.1:1/x?token=****"),
        "{said}"
    );
    outputs.push(("config check, an http handler", said));

    let secrets: Vec<String> = [
        NATS_DIGITS,
        TOKEN_DIGITS,
        DASH_DIGITS,
        "Unterminated-Secret-77",
        "HandlerPW-tls-3",
        "QueryTok-9",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    for (what, output) in &outputs {
        assert_hidden(what, output, &secrets);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Start-up against servers that are unreachable or refuse the login, with the secret in
/// the URL (userinfo, query, libpq `key=value`), by environment, in the file and in an nkey
/// seed file: the errors name the server and the setting, never the secret; a worker that
/// waits for an unreachable database logs its retries without it.
#[tokio::test]
async fn failed_logins_and_unreachable_servers_name_the_server_not_the_secret() {
    let dir = scratch("secrets_startup");
    let mut outputs: Vec<(String, String)> = Vec::new();
    let mut secrets: Vec<String> = Vec::new();
    let mut secret = |s: &str| {
        secrets.push(s.to_string());
        s.to_string()
    };

    // A PostgreSQL that checks passwords.
    let pg = PgCluster::start_fast().expect("start a throwaway PostgreSQL");
    pg.reconfigure(
        &[],
        "password_encryption = 'scram-sha-256'",
        Some("local all all trust\nhost all postgres 127.0.0.1/32 trust\nhost all all 127.0.0.1/32 scram-sha-256\n"),
    )
    .expect("require passwords");
    let admin = tokio_postgres::connect(
        &format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres",
            pg.port()
        ),
        tokio_postgres::NoTls,
    )
    .await
    .unwrap();
    tokio::spawn(admin.1);
    admin
        .0
        .batch_execute("CREATE ROLE app LOGIN PASSWORD 'right-PW-0'")
        .await
        .unwrap();
    let port = pg.port();
    let wrong_in_url = secret("WrongPW-url-1");
    let wrong_in_query = secret("WrongPW-query-2");
    let wrong_quoted = secret("Wrong PW-quoted-3");
    let wrong_digits = secret("31415926");
    let unreachable_pw = secret("UnreachablePW-4");
    let unquoted_a = secret("Spaced-Part-A");
    let unquoted_b = secret("Spaced-Part-B");
    let database_urls = [
        format!("postgres://app:{wrong_in_url}@127.0.0.1:{port}/postgres"),
        format!("postgres://app@127.0.0.1:{port}/postgres?password={wrong_in_query}"),
        format!("host=127.0.0.1 port={port} user=app password='{wrong_quoted}' dbname=postgres"),
        format!("host=127.0.0.1 port={port} user=app password={wrong_digits} dbname=postgres"),
        format!(
            "postgres://app:{unreachable_pw}@127.0.0.1:{}/x",
            free_port()
        ),
        // A password with a space, not quoted: the string does not parse.
        format!("host=127.0.0.1 port={port} user=app password={unquoted_a} {unquoted_b}"),
    ];
    let file = dir.join("jobwarden.toml");
    std::fs::write(&file, "").unwrap();
    let config = file.to_str().unwrap();
    for url in &database_urls {
        let out = run_cli(
            &["--config", config, "stats"],
            &[("JOBWARDEN_DATABASE__URL", url.as_str())],
        );
        let said = text(&out);
        assert!(!out.status.success(), "{url}: {said}");
        assert!(
            said.contains("password authentication failed")
                || said.contains("is unreachable")
                || said.contains("database.url"),
            "{url}: {said}"
        );
        outputs.push((format!("stats with {url:?}"), said));
    }

    // A worker waiting for an unreachable database says so (once per cause; its retries at
    // debug level), and keeps trying.
    let wait_dir = dir.join("wait");
    std::fs::create_dir_all(&wait_dir).unwrap();
    let wait_file = wait_dir.join("jobwarden.toml");
    std::fs::write(
        &wait_file,
        "[worker]\napi_listen = \"127.0.0.1:0\"\nops_listen = \"off\"\n\
         [queues.work]\nhandler = { kind = \"exec\", command = [\"true\"] }\n",
    )
    .unwrap();
    let child = spawn_worker(
        &wait_dir,
        &wait_file,
        &[
            ("JOBWARDEN_DATABASE__URL", database_urls[4].as_str()),
            ("RUST_LOG", "debug"),
        ],
    );
    let waited = common::wait_for(Duration::from_secs(30), || {
        let log = worker_output(&wait_dir);
        async move { log.contains("not available; retrying") }
    })
    .await;
    let log = stop_worker(&wait_dir, child).await;
    assert!(waited, "the worker logs its retries:\n{log}");
    outputs.push(("worker waiting for the database".into(), log));

    // A NATS server with a user and an nkey; every wrong login is refused.
    let nkey = nkeys::KeyPair::new_user();
    let nats = NatsServer::start_with_conf(&format!(
        "authorization {{ users = [ {{ user: \"worker\", password: \"right-PW-5\" }}, {{ nkey: \"{}\" }} ] }}",
        nkey.public_key()
    ))
    .unwrap();
    let stranger = nkeys::KeyPair::new_user();
    let stranger_seed = secret(&stranger.seed().unwrap());
    let seed_file = dir.join("stranger.nk");
    std::fs::write(&seed_file, format!("{stranger_seed}\n")).unwrap();
    let host = nats.url().trim_start_matches("nats://").to_string();
    let nats_url_user = secret("WrongPW-nats-url-6");
    let nats_url_token = secret("TokenInURL-7");
    let nats_env_password = secret("WrongPW-nats-env-8");
    let nats_env_token = secret("TokenByEnv-9");
    let nats_file_password = secret("WrongPW-nats-file-10");
    let nats_digits = secret("27182818");
    let unreachable_token = secret("UnreachableToken-11");
    let db = test_database_url();
    let with_file = |name: &str, nats_toml: &str| {
        let path = dir.join(format!("{name}.toml"));
        std::fs::write(&path, format!("[nats]\n{nats_toml}")).unwrap();
        path
    };
    // (what is tried, the configuration file, the environment)
    type Case<'a> = (&'a str, PathBuf, Vec<(&'a str, String)>);
    let cases: Vec<Case> = vec![
        (
            "user and password in the URL",
            file.clone(),
            vec![(
                "JOBWARDEN_NATS__URL",
                format!("nats://worker:{nats_url_user}@{host}"),
            )],
        ),
        (
            "a token in the URL",
            file.clone(),
            vec![(
                "JOBWARDEN_NATS__URL",
                format!("nats://{nats_url_token}@{host}"),
            )],
        ),
        (
            "a password by environment",
            file.clone(),
            vec![
                ("JOBWARDEN_NATS__URL", nats.url()),
                ("JOBWARDEN_NATS__USER", "worker".into()),
                ("JOBWARDEN_NATS__PASSWORD", nats_env_password.clone()),
            ],
        ),
        (
            "a token by environment",
            file.clone(),
            vec![
                ("JOBWARDEN_NATS__URL", nats.url()),
                ("JOBWARDEN_NATS__TOKEN", nats_env_token.clone()),
            ],
        ),
        (
            "a password of digits by environment",
            file.clone(),
            vec![
                ("JOBWARDEN_NATS__URL", nats.url()),
                ("JOBWARDEN_NATS__USER", "worker".into()),
                ("JOBWARDEN_NATS__PASSWORD", nats_digits.clone()),
            ],
        ),
        (
            "a password in the file",
            with_file(
                "password",
                &format!(
                    "url = \"{}\"\nuser = \"worker\"\npassword = \"{nats_file_password}\"\n",
                    nats.url()
                ),
            ),
            vec![],
        ),
        (
            "an unknown nkey seed in a file",
            with_file(
                "seed",
                &format!(
                    "url = \"{}\"\nnkey_seed_file = \"{}\"\n",
                    nats.url(),
                    seed_file.display()
                ),
            ),
            vec![],
        ),
        (
            "an unreachable server with a token in the URL",
            file.clone(),
            vec![(
                "JOBWARDEN_NATS__URL",
                format!("nats://{unreachable_token}@127.0.0.1:{}", free_port()),
            )],
        ),
    ];
    for (what, file, mut envs) in cases {
        envs.push(("JOBWARDEN_DATABASE__URL", db.clone()));
        envs.push(("RUST_LOG", "debug".into()));
        let envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let out = run_cli(
            &["--config", file.to_str().unwrap(), "enqueue", "work", "{}"],
            &envs,
        );
        let said = text(&out);
        assert!(!out.status.success(), "{what}: {said}");
        assert!(
            said.contains("authorization violation") || said.contains("is unreachable"),
            "{what}: {said}"
        );
        outputs.push((what.to_string(), said));
    }

    for (what, output) in &outputs {
        assert_hidden(what, output, &secrets);
    }
    drop(admin.0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The process's log never holds a configured secret, whoever prints it: an exec handler
/// given `API_TOKEN` by the configuration writes it to stderr and fails, and the worker's
/// log line about the dead job shows `****` in its place (the log writer scrubs every line
/// of the configuration's secrets). The job's own error is the application's words, stored
/// as it wrote them (docs/security.md).
#[tokio::test]
async fn the_log_never_holds_a_configured_secret_even_when_an_application_prints_it() {
    const TOKEN: &str = "ExecTok-h3k9-2718";
    let env =
        TestEnv::new("[queues.work]\nhandler = { kind = \"exec\", command = [\"true\"] }\n").await;
    let dir = scratch("secrets_log");
    let file = dir.join("jobwarden.toml");
    std::fs::write(
        &file,
        format!(
            "[database]\nurl = \"{}\"\nschema = \"{}\"\n[nats]\nurl = \"{}\"\n\
             [worker]\napi_listen = \"127.0.0.1:0\"\nops_listen = \"off\"\n\
             [queues.work]\nmax_attempts = 1\n\
             handler = {{ kind = \"exec\", command = [\"sh\", \"-c\", \"echo token $API_TOKEN refused >&2; exit 1\"], env = {{ API_TOKEN = \"{TOKEN}\" }} }}\n",
            env.config.database.url,
            env.config.database.schema,
            env.nats.url()
        ),
    )
    .unwrap();
    let child = spawn_worker(&dir, &file, &[("RUST_LOG", "info")]);
    env.publish_raw("work", json!({"id": "exec-1", "payload": {}}).to_string())
        .await;
    let dead = env.wait_count("dead", 1, 30).await;
    let log = stop_worker(&dir, child).await;
    assert!(dead, "the job dies; log:\n{log}");
    assert!(
        log.contains("job dead-lettered") && log.contains("token **** refused"),
        "{log}"
    );
    assert_hidden("worker log", &log, &[TOKEN.to_string()]);
    let _ = std::fs::remove_dir_all(&dir);
}
