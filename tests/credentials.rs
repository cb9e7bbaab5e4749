//! Credentials in deployment: the least-privilege runtime role (scripts/sql/runtime-role.sql)
//! runs everything a worker and a producer do and can change nothing in the schema; secrets
//! never reach logs, `config check`, error messages or handler processes.

mod common;

use common::testkit::unique_name;
use common::{run_cli, test_database_url, text, TestEnv};
use jobwarden::handler::{from_fn, JobError};
use jobwarden::store::Store;
use serde_json::json;
use std::time::Duration;

/// The test database URL with another user (and password).
fn url_as(user_info: &str) -> String {
    let base = test_database_url();
    let (scheme, rest) = base.split_once("://").unwrap();
    let host = rest.rsplit_once('@').map(|(_, h)| h).unwrap_or(rest);
    format!("{scheme}://{user_info}@{host}")
}

/// Runs the role script with psql, as the owner of the schema.
fn create_runtime_role(schema: &str, role: &str) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/sql/runtime-role.sql");
    for _ in 0..2 {
        // Twice: the script must be idempotent.
        let out = std::process::Command::new("psql")
            .arg(test_database_url())
            .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-v"])
            .arg(format!("schema={schema}"))
            .arg("-v")
            .arg(format!("role={role}"))
            .arg("-f")
            .arg(script)
            .output()
            .expect("run psql (apt-get install postgresql-client)");
        assert!(out.status.success(), "{}", text(&out));
    }
}

async fn drop_role(env: &TestEnv, role: &str) {
    let c = env.store.raw().await.unwrap();
    let _ = c
        .batch_execute(&format!("DROP OWNED BY \"{role}\"; DROP ROLE \"{role}\""))
        .await;
}

const QUEUES: &str = r#"
[queues.work]
concurrency = 8
max_attempts = 2
backoff = { kind = "fixed", base = "50ms" }
handler = { kind = "rust", name = "h" }
"#;

#[tokio::test]
async fn workers_run_under_the_least_privilege_role_and_cannot_change_the_schema() {
    let env = TestEnv::new(QUEUES).await;
    let schema = env.config.database.schema.clone();
    let role = unique_name("jw_runtime");
    create_runtime_role(&schema, &role);

    let mut config = env.config.clone();
    config.database.url = url_as(&role);
    config.worker.migrate = false;
    let h = from_fn(|job| async move {
        if job.payload["fail"] == json!(true) {
            Err(JobError::retry("always fails"))
        } else {
            Ok(Some(json!({"ok": true})))
        }
    });
    let worker = env.worker_with(config.clone(), &[("h", h)]).await;
    // A producer under the same role.
    let store = Store::connect(&config.database).await.unwrap();
    let client = jobwarden::client::Client::new(store.clone(), env.broker.clone());
    for i in 0..10 {
        client
            .enqueue("work", json!({ "i": i }), Default::default())
            .await
            .unwrap();
    }
    client
        .enqueue("work", json!({ "fail": true }), Default::default())
        .await
        .unwrap();
    // And through the SQL function, as an application's transaction would.
    store
        .raw()
        .await
        .unwrap()
        .batch_execute("SELECT enqueue('work', '{\"sql\": true}'::jsonb)")
        .await
        .unwrap();
    assert!(
        env.wait_count("completed", 11, 30).await,
        "11 jobs complete"
    );
    assert!(
        env.wait_count("dead", 1, 30).await,
        "the failing one is dead"
    );

    // The operator commands work under the role too.
    let as_role = [
        ("JOBWARDEN_DATABASE__URL", config.database.url.as_str()),
        ("JOBWARDEN_DATABASE__SCHEMA", schema.as_str()),
        ("JOBWARDEN_NATS__URL", &env.nats.url()),
    ];
    for args in [
        &["stats"][..],
        &["workers"],
        &["dlq", "list"],
        &["dlq", "retry", "--queue", "work", "--all"],
    ] {
        let out = run_cli(args, &as_role);
        assert!(out.status.success(), "{args:?}: {}", text(&out));
    }
    assert!(
        env.wait_count("dead", 1, 30).await,
        "retried, and dead again"
    );

    // Nothing in the schema can be changed under the role.
    let c = store.raw().await.unwrap();
    for ddl in [
        "CREATE TABLE intruder (x int)",
        "DROP TABLE jobs",
        "ALTER TABLE jobs ADD COLUMN x int",
        "CREATE OR REPLACE FUNCTION enqueue() RETURNS int LANGUAGE sql AS 'SELECT 1'",
        "TRUNCATE jobs",
    ] {
        let err = c.batch_execute(ddl).await.err();
        let err = err.map(|e| e.as_db_error().map(|d| d.message().to_string()));
        assert!(
            matches!(&err, Some(Some(m)) if m.contains("permission denied") || m.contains("must be owner")),
            "{ddl} must be refused: {err:?}"
        );
    }
    worker.shutdown().await;
    drop(c);
    drop(store);
    drop_role(&env, &role).await;
}

#[tokio::test]
async fn a_worker_with_migrate_off_waits_for_the_migration_and_then_starts() {
    let env = TestEnv::new(QUEUES).await;
    let mut config = env.config.clone();
    config.database.schema = unique_name("unmigrated");
    config.worker.migrate = false;
    let h = from_fn(|_job| async { Ok(None) });
    let start = tokio::spawn({
        let mut w = jobwarden::worker::Worker::new(config.clone());
        w = w.rust_handler("h", h);
        async move { w.start(tokio_util::sync::CancellationToken::new()).await }
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!start.is_finished(), "the worker waits for the schema");
    // The migration Job runs.
    let migrator = Store::connect(&config.database).await.unwrap();
    migrator.migrate().await.unwrap();
    let worker = tokio::time::timeout(Duration::from_secs(30), start)
        .await
        .expect("starts once migrated")
        .unwrap()
        .expect("worker start");
    worker.shutdown().await;
    migrator.drop_schema().await.unwrap();
}

#[tokio::test]
async fn secrets_never_reach_logs_config_check_errors_or_handlers() {
    const PG_SECRET: &str = "pg-Secret-9f3a1c";
    const NATS_SECRET: &str = "nats-Secret-7b2e4d";
    const DASH_SECRET: &str = "dash-Secret-5c8e2a0b1d";
    let secrets = [PG_SECRET, NATS_SECRET, DASH_SECRET];
    let dir = std::env::temp_dir().join(unique_name("secrets"));
    std::fs::create_dir_all(&dir).unwrap();
    let env_file = dir.join("handler-env.txt");
    let queues = format!(
        "[queues.work]\nconcurrency = 4\nhandler = {{ kind = \"exec\", command = [\"sh\", \"-c\", \"env > {}\"] }}\n",
        env_file.display()
    );
    let nats_conf = format!(
        "authorization {{ users = [ {{ user: \"worker\", password: \"{NATS_SECRET}\" }} ] }}"
    );
    // The local test server trusts the connection and ignores the password, but every line
    // of jobwarden that handles the URL sees it.
    let db_url = url_as(&format!("postgres:{PG_SECRET}"));
    let env = TestEnv::with_servers(
        &db_url,
        &nats_conf,
        &format!("user = \"worker\"\npassword = \"{NATS_SECRET}\"\n"),
        &queues,
    )
    .await;
    // The file holds no secret: they come from the environment, as a Kubernetes Secret
    // gives them.
    let file = dir.join("jobwarden.toml");
    std::fs::write(&file, env.config.to_redacted_toml()).unwrap();
    let secret_env = [
        ("JOBWARDEN_DATABASE__URL", db_url.as_str()),
        ("JOBWARDEN_NATS__PASSWORD", NATS_SECRET),
        ("JOBWARDEN_DASHBOARD__ADMIN_TOKEN", DASH_SECRET),
        ("JOBWARDEN_DASHBOARD__LISTEN", "127.0.0.1:0"),
        ("JOBWARDEN_WORKER__HOSTNAME", "secrets-test"),
        ("RUST_LOG", "debug"),
    ];
    let mut outputs = Vec::new();

    // A run at debug level that completes jobs, then stops.
    let (done, run_log) = run_three_jobs(&env, &file, &secret_env, &dir, "s").await;
    assert!(done, "3 jobs complete; log:\n{run_log}");
    assert!(
        run_log.contains("NATS authentication: user worker with password"),
        "{run_log}"
    );
    outputs.push(("run", run_log));

    // The handler's environment has none of the sidecar's settings.
    outputs.push(("handler env", std::fs::read_to_string(&env_file).unwrap()));

    // `config check` prints the configuration without them.
    let out = run_cli(
        &["--config", file.to_str().unwrap(), "config", "check"],
        &secret_env,
    );
    assert!(out.status.success(), "{}", text(&out));
    let check = text(&out);
    assert!(
        check.contains("nats.password is set (not shown)"),
        "{check}"
    );
    outputs.push(("config check", check));

    // Failing logins name the problem, not the secret tried.
    let wrong_nats = [
        ("JOBWARDEN_DATABASE__URL", db_url.as_str()),
        ("JOBWARDEN_NATS__PASSWORD", "wrong-Secret-1e9d"),
        ("RUST_LOG", "debug"),
    ];
    let out = run_cli(&["--config", file.to_str().unwrap(), "run"], &wrong_nats);
    assert!(!out.status.success());
    let failed = text(&out);
    assert!(failed.contains("authorization violation"), "{failed}");
    assert!(!failed.contains("wrong-Secret-1e9d"), "{failed}");
    outputs.push(("wrong NATS password", failed));
    let unreachable_db = format!(
        "postgres://app:{PG_SECRET}@127.0.0.1:{}/x",
        common::testkit::free_port()
    );
    let out = run_cli(
        &["--config", file.to_str().unwrap(), "stats"],
        &[("JOBWARDEN_DATABASE__URL", unreachable_db.as_str())],
    );
    assert!(!out.status.success());
    outputs.push(("unreachable database", text(&out)));
    let bad_url = format!("postgres://app:{PG_SECRET}@db/x?sslmode=verify");
    let out = run_cli(
        &["--config", file.to_str().unwrap(), "config", "check"],
        &[("JOBWARDEN_DATABASE__URL", bad_url.as_str())],
    );
    assert!(!out.status.success());
    let bad = text(&out);
    assert!(bad.contains("sslmode=\"verify\""), "{bad}");
    outputs.push(("bad database URL", bad));

    for (what, output) in &outputs {
        for secret in secrets {
            assert!(
                !output.contains(secret),
                "{what} shows a secret ({secret}):\n{output}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A NATS cluster named as NATS users name one, by a comma-separated seed list: the worker
/// skips a seed that does not answer, joins one that does, says which, and shows no
/// password of any seed. A seed that is not a server address is refused at the door by its
/// place in the list.
#[tokio::test]
async fn a_seed_list_is_joined_through_any_live_server_and_never_shows_its_passwords() {
    const SECRET: &str = "seed-Secret-4d1f0a";
    let env = TestEnv::new(
        "[queues.work]\nconcurrency = 2\nhandler = { kind = \"exec\", command = [\"true\"] }\n",
    )
    .await;
    let dir = std::env::temp_dir().join(unique_name("seeds"));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("jobwarden.toml");
    std::fs::write(&file, env.config.to_redacted_toml()).unwrap();
    let live = env
        .nats
        .url()
        .replace("nats://", &format!("nats://w:{SECRET}@"));
    let dead = common::testkit::free_port();
    let seeds = format!("nats://w:{SECRET}@127.0.0.1:{dead}, {live}");
    let vars = [
        ("JOBWARDEN_NATS__URL", seeds.as_str()),
        ("JOBWARDEN_WORKER__HOSTNAME", "seeds-test"),
        ("RUST_LOG", "info"),
    ];

    let out = run_cli(
        &["--config", file.to_str().unwrap(), "config", "check"],
        &vars,
    );
    let check = text(&out);
    assert!(out.status.success(), "{check}");
    assert!(
        check.contains(&format!("nats://w:****@127.0.0.1:{dead}")),
        "{check}"
    );

    let (done, run_log) = run_three_jobs(&env, &file, &vars, &dir, "seed").await;
    assert!(
        done,
        "3 jobs complete through the live seed; log:\n{run_log}"
    );
    let joined = format!(":{} (no cluster), from 2 seeds", env.nats.port());
    assert!(
        run_log.contains("NATS: joined server") && run_log.contains(&joined),
        "the log names the server joined ({joined}):\n{run_log}"
    );
    assert!(!run_log.contains(SECRET), "{run_log}");

    // A seed that is not an address: refused at the door, naming it and the fix.
    let bad = format!("{live},nats://127.0.0.1:42x22");
    let out = run_cli(
        &["--config", file.to_str().unwrap(), "config", "check"],
        &[("JOBWARDEN_NATS__URL", bad.as_str())],
    );
    let said = text(&out);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains(
            "nats.url: server 2 of 2 (\"nats://127.0.0.1:42x22\") is not a server address"
        ) && said.contains("write it as nats://host:port"),
        "{said}"
    );
    assert!(!said.contains(SECRET), "{said}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs `jobwarden run` with `file` and `vars` (its log in `dir`) until three jobs published
/// as `<prefix>-<i>` complete (at most 30 s), then stops it with SIGTERM. Returns whether
/// they completed, and its log (standard output and error).
async fn run_three_jobs(
    env: &TestEnv,
    file: &std::path::Path,
    vars: &[(&str, &str)],
    dir: &std::path::Path,
    prefix: &str,
) -> (bool, String) {
    let log = dir.join("run.log");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_jobwarden"))
        .args(["--config", file.to_str().unwrap(), "run"])
        .envs(vars.iter().copied())
        .stdin(std::process::Stdio::null())
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::create(dir.join("run.err")).unwrap())
        .spawn()
        .unwrap();
    for i in 0..3 {
        env.publish_raw(
            "work",
            json!({"id": format!("{prefix}-{i}"), "payload": {}}).to_string(),
        )
        .await;
    }
    let done = env.wait_count("completed", 3, 30).await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let _ = child.wait();
    let run_log = std::fs::read_to_string(&log).unwrap()
        + &std::fs::read_to_string(dir.join("run.err")).unwrap();
    (done, run_log)
}
