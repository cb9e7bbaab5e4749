//! Retention against real servers: what the pruner deletes and what it must keep (young
//! jobs, unfinished ones, chain parents a job still waits for, unresolved chains), per-queue
//! overrides and caps, the other tables it prunes, one round at a time across workers (the
//! advisory lock), idempotency keys of pruned jobs, `jobwarden prune` and bad settings.
//! Jobs are made old by backdating completed_at in SQL.

mod common;

use common::{run_cli, test_database_url, text, wait_for, TestEnv};
use jobwarden::worker::pruner::{PruneReport, Pruner};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Inserts job `id` of `queue` with `status`, finished `hours_ago` hours ago.
async fn seed(env: &TestEnv, id: &str, queue: &str, status: &str, hours_ago: f64) {
    env.store
        .raw()
        .await
        .unwrap()
        .execute(
            "INSERT INTO jobs (id, queue, payload, status, max_attempts, completed_at)
             VALUES ($1, $2, '{}', $3, 5, now() - $4::float8 * interval '1 hour')",
            &[&id, &queue, &status, &hours_ago],
        )
        .await
        .unwrap_or_else(|e| panic!("seed {id}: {e}"));
}

async fn exec(env: &TestEnv, sql: &str) {
    env.store
        .raw()
        .await
        .unwrap()
        .batch_execute(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

async fn exists(env: &TestEnv, id: &str) -> bool {
    env.status_of(id).await.is_some()
}

fn pruner(env: &TestEnv) -> Pruner {
    Pruner::new(
        env.store.clone(),
        env.config.retention_policy().expect("retention on"),
    )
}

async fn round(env: &TestEnv) -> PruneReport {
    pruner(env)
        .run_once(&CancellationToken::new(), &mut |_, _, _| {})
        .await
        .expect("round")
}

const DAY: f64 = 24.0;

/// A test environment whose queues run the Rust handler `noop` unless they name another.
async fn env_with(toml: &str) -> TestEnv {
    TestEnv::new(&format!(
        "[handler]\nkind = \"rust\"\nname = \"noop\"\n{toml}"
    ))
    .await
}

#[tokio::test]
async fn old_finished_jobs_go_young_and_unfinished_ones_stay_and_a_queue_override_wins() {
    let env = env_with(
        "[retention]\nbatch = 2\npause = \"1ms\"\n\
         [queues.email]\nkeep_completed = \"2h\"\n[queues.pdf]\n",
    )
    .await;
    let going = [
        ("email-old", "email", "completed", 3.0),
        ("pdf-old", "pdf", "completed", 8.0 * DAY),
        ("pdf-old-2", "pdf", "completed", 9.0 * DAY),
        ("pdf-old-3", "pdf", "completed", 10.0 * DAY),
        ("pdf-cancelled-old", "pdf", "cancelled", 8.0 * DAY),
        ("pdf-dead-old", "pdf", "dead", 31.0 * DAY),
        // A queue no configuration names: the defaults.
        ("other-old", "other", "completed", 8.0 * DAY),
    ];
    let staying = [
        ("email-young", "email", "completed", 1.0),
        ("email-dead", "email", "dead", 8.0 * DAY),
        ("pdf-young", "pdf", "completed", 3.0),
        ("pdf-cancelled", "pdf", "cancelled", 6.0 * DAY),
        ("pdf-dead", "pdf", "dead", 29.0 * DAY),
        // Not finished, whatever completed_at says.
        ("queued", "pdf", "queued", 100.0 * DAY),
        ("scheduled", "pdf", "scheduled", 100.0 * DAY),
        ("processing", "pdf", "processing", 100.0 * DAY),
        ("waiting", "pdf", "waiting", 100.0 * DAY),
    ];
    for (id, q, s, h) in going.iter().chain(&staying) {
        seed(&env, id, q, s, *h).await;
    }
    // Attempt rows of a pruned job go with it; a kept job's stay.
    exec(
        &env,
        "INSERT INTO job_attempt_log (job_id, lease, attempt, outcome, queue)
         VALUES ('pdf-old', 1, 1, 'retry', 'pdf'), ('pdf-dead', 1, 1, 'retry', 'pdf')",
    )
    .await;
    let r = round(&env).await;
    assert!(!r.skipped);
    assert_eq!(r.jobs_total(), going.len() as u64, "{r:?}");
    assert_eq!(r.jobs[&("pdf".to_string(), "completed".to_string())], 3);
    for (id, ..) in going {
        assert!(!exists(&env, id).await, "{id} should be pruned");
    }
    for (id, ..) in staying {
        assert!(exists(&env, id).await, "{id} should be kept");
    }
    let attempts = |id: &'static str| {
        let env = &env;
        async move {
            env.scalar(&format!(
                "SELECT count(*) FROM job_attempt_log WHERE job_id = '{id}'"
            ))
            .await
        }
    };
    assert_eq!(attempts("pdf-old").await, 0);
    assert_eq!(attempts("pdf-dead").await, 1);
    // A second round finds nothing more.
    assert_eq!(round(&env).await.jobs_total(), 0);
}

#[tokio::test]
async fn keep_count_keeps_the_newest_finished_jobs_of_a_queue() {
    let env =
        env_with("[retention]\nkeep_count = 100\n[queues.email]\nkeep_count = 3\n[queues.pdf]\n")
            .await;
    for (i, s) in ["completed", "dead", "cancelled", "completed", "completed"]
        .iter()
        .enumerate()
    {
        seed(&env, &format!("email-{i}"), "email", s, (5 - i) as f64).await;
        seed(&env, &format!("pdf-{i}"), "pdf", s, (5 - i) as f64).await;
    }
    let r = round(&env).await;
    assert_eq!(r.jobs_total(), 2, "{r:?}");
    for i in 0..5 {
        assert_eq!(
            exists(&env, &format!("email-{i}")).await,
            i >= 2,
            "email-{i}"
        );
        assert!(exists(&env, &format!("pdf-{i}")).await, "pdf-{i}");
    }
}

#[tokio::test]
async fn a_chain_parent_stays_while_a_job_waits_for_it_and_goes_after() {
    let env = env_with("[queues.email]\n").await;
    seed(&env, "parent", "email", "completed", 8.0 * DAY).await;
    seed(&env, "child", "email", "waiting", 8.0 * DAY).await;
    seed(&env, "unresolved", "email", "dead", 40.0 * DAY).await;
    exec(
        &env,
        "INSERT INTO job_deps (parent, child) VALUES ('parent', 'child');
         UPDATE jobs SET has_dependents = true WHERE id = 'parent';
         UPDATE jobs SET chain_pending = true WHERE id = 'unresolved'",
    )
    .await;
    assert_eq!(round(&env).await.jobs_total(), 0);
    assert!(exists(&env, "parent").await && exists(&env, "unresolved").await);
    // The child finished (long ago, too); the chain resolved.
    exec(
        &env,
        "UPDATE jobs SET status = 'completed', completed_at = now() - interval '8 days'
         WHERE id = 'child';
         UPDATE jobs SET chain_pending = false WHERE id = 'unresolved'",
    )
    .await;
    assert_eq!(round(&env).await.jobs_total(), 3);
    assert_eq!(env.scalar("SELECT count(*) FROM job_deps").await, 0);
}

#[tokio::test]
async fn poison_messages_stopped_workers_and_spent_flow_grants_go_too() {
    let env = env_with("[queues.email]\n").await;
    exec(
        &env,
        "INSERT INTO poison_messages (received_at, worker_id, subject, reason, body_bytes)
         VALUES (now() - interval '31 days', 'w', 'jobs.email', 'old', 0),
                (now() - interval '1 day', 'w', 'jobs.email', 'young', 0);
         INSERT INTO workers (id, hostname, pid, version, stopped_at) VALUES
             ('gone', 'h', 1, 'v', now() - interval '8 days'),
             ('recent', 'h', 2, 'v', now() - interval '1 day'),
             ('alive', 'h', 3, 'v', NULL),
             ('owner', 'h', 4, 'v', now() - interval '8 days');
         INSERT INTO jobs (id, queue, payload, status, max_attempts, worker_id)
             VALUES ('running', 'email', '{}', 'processing', 5, 'owner');
         INSERT INTO flow_grants (queue, worker_id, granted_at, started_at, done) VALUES
             ('email', 'alive', now() - interval '2 hours', now() - interval '2 hours', true),
             ('email', 'alive', now() - interval '2 hours', now() - interval '2 hours', false),
             ('email', 'alive', now(), now(), true),
             ('email', 'gone', now() - interval '2 hours', NULL, false)",
    )
    .await;
    let r = round(&env).await;
    assert_eq!((r.poison, r.workers, r.flow_grants), (1, 1, 2), "{r:?}");
    assert_eq!(
        env.scalar("SELECT count(*) FROM poison_messages WHERE reason = 'young'")
            .await,
        1
    );
    let left: i64 = env
        .scalar("SELECT count(*) FROM workers WHERE id IN ('recent', 'alive', 'owner')")
        .await;
    assert_eq!(left, 3, "a worker a running job names stays");
    assert_eq!(env.scalar("SELECT count(*) FROM flow_grants").await, 2);
}

#[tokio::test]
async fn one_round_at_a_time_across_workers_each_row_deleted_once() {
    let env = env_with("[retention]\nbatch = 10\npause = \"1ms\"\n[queues.email]\n").await;
    exec(
        &env,
        "INSERT INTO jobs (id, queue, payload, status, max_attempts, completed_at)
         SELECT 'old-' || n, 'email', '{}', 'completed', 5, now() - interval '8 days'
         FROM generate_series(1, 500) n",
    )
    .await;
    // While one round holds the lock, another worker's round skips: it deletes nothing.
    let held = env.store.prune_session().await.unwrap().expect("the lock");
    let r = round(&env).await;
    assert!(r.skipped && r.jobs_total() == 0, "{r:?}");
    assert_eq!(env.count("completed").await, 500);
    // What would go can be seen meanwhile: a dry run takes no lock.
    let preview = pruner(&env).preview().await.unwrap();
    assert_eq!((preview.len(), preview[0].going), (1, 500), "{preview:?}");
    drop(held);
    // Two at once: one runs, the other skips; every row is deleted exactly once.
    let (a, b) = tokio::join!(round(&env), round(&env));
    assert!(a.skipped != b.skipped, "{a:?} {b:?}");
    assert_eq!(a.jobs_total() + b.jobs_total(), 500);
    assert_eq!(env.count("completed").await, 0);
}

#[tokio::test]
async fn the_key_of_a_pruned_job_makes_a_new_job() {
    let env = env_with("[queues.email]\n").await;
    let client = jobwarden::client::Client::new(env.store.clone(), env.broker.clone());
    let opts = || jobwarden::client::EnqueueOptions {
        idempotency_key: Some("order-42".into()),
        ..Default::default()
    };
    let payload = serde_json::json!({"to": "a@example.com"});
    let first = client
        .enqueue("email", payload.clone(), opts())
        .await
        .unwrap();
    let again = client
        .enqueue("email", payload.clone(), opts())
        .await
        .unwrap();
    assert!(first.created && !again.created && again.id == first.id);
    exec(
        &env,
        &format!(
            "UPDATE jobs SET status = 'completed', completed_at = now() - interval '8 days'
             WHERE id = '{}'",
            first.id
        ),
    )
    .await;
    assert_eq!(round(&env).await.jobs_total(), 1);
    let after = client.enqueue("email", payload, opts()).await.unwrap();
    assert!(after.created && after.id != first.id, "{after:?}");
}

#[tokio::test]
async fn a_worker_with_retention_on_prunes_by_itself() {
    let env = env_with(
        "[retention]\nevery = \"1s\"\nbatch = 7\npause = \"1ms\"\n[queues.email]\n\
         handler = { kind = \"rust\", name = \"noop\" }\n",
    )
    .await;
    exec(
        &env,
        "INSERT INTO jobs (id, queue, payload, status, max_attempts, completed_at)
         SELECT 'old-' || n, 'email', '{}', 'completed', 5, now() - interval '8 days'
         FROM generate_series(1, 100) n",
    )
    .await;
    seed(&env, "young", "email", "completed", 1.0).await;
    let noop = jobwarden::handler::from_fn(|_job| async { Ok(None) });
    let worker = env.worker(&[("noop", noop)]).await;
    assert!(
        env.wait_count("completed", 1, 20).await,
        "{}",
        env.count("completed").await
    );
    assert!(exists(&env, "young").await);
    let ops = worker.ops_addr.expect("ops listener");
    let ok = wait_for(Duration::from_secs(10), || async {
        let m = reqwest::get(format!("http://{ops}/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        m.contains("jobwarden_pruned_total{queue=\"email\",status=\"completed\"} 100")
    })
    .await;
    assert!(ok, "jobwarden_pruned_total counts what went");
    worker.shutdown().await;
}

#[tokio::test]
async fn retention_off_keeps_everything() {
    let env = env_with(
        "[retention]\nenabled = false\nevery = \"1s\"\n[queues.email]\n\
                            handler = { kind = \"rust\", name = \"noop\" }\n",
    )
    .await;
    assert!(env.config.retention_policy().is_none());
    seed(&env, "old", "email", "completed", 100.0 * DAY).await;
    let noop = jobwarden::handler::from_fn(|_job| async { Ok(None) });
    let worker = env.worker(&[("noop", noop)]).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(exists(&env, "old").await);
    worker.shutdown().await;
    let env_vars = cli_env(&env, &[("JOBWARDEN_RETENTION__ENABLED", "false")]);
    let out = run_cli(&["prune"], &as_refs(&env_vars));
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("retention is off"), "{}", text(&out));
    assert!(exists(&env, "old").await);
    let out = run_cli(&["prune", "--even-if-disabled"], &as_refs(&env_vars));
    assert!(text(&out).contains("pruned 1 jobs"), "{}", text(&out));
    assert!(!exists(&env, "old").await);
}

fn cli_env(env: &TestEnv, extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut v = vec![
        ("JOBWARDEN_DATABASE__URL".to_string(), test_database_url()),
        (
            "JOBWARDEN_DATABASE__SCHEMA".to_string(),
            env.config.database.schema.clone(),
        ),
        ("JOBWARDEN_NATS__URL".to_string(), env.nats.url()),
    ];
    v.extend(
        extra
            .iter()
            .map(|(k, val)| (k.to_string(), val.to_string())),
    );
    v
}

fn as_refs(v: &[(String, String)]) -> Vec<(&str, &str)> {
    v.iter()
        .map(|(k, val)| (k.as_str(), val.as_str()))
        .collect()
}

#[tokio::test]
async fn prune_dry_run_shows_what_would_go_and_deletes_nothing() {
    let env = env_with("[queues.email]\n").await;
    seed(&env, "old", "email", "completed", 8.0 * DAY).await;
    seed(&env, "young", "email", "completed", 2.0 * DAY).await;
    seed(&env, "dead", "email", "dead", 2.0 * DAY).await;
    let out = env.cli(&["prune", "--dry-run"]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(
        t.lines().any(|l| l.split_whitespace().collect::<Vec<_>>()
            == ["email", "completed", "1", "1", "2d", "old"]),
        "{t}"
    );
    assert!(
        t.contains("dry run: 1 jobs would be deleted now; nothing was deleted"),
        "{t}"
    );
    assert_eq!(env.scalar("SELECT count(*) FROM jobs").await, 3);
    let out = env.cli(&["prune"]);
    assert!(text(&out).contains("pruned 1 jobs"), "{}", text(&out));
    assert_eq!(env.scalar("SELECT count(*) FROM jobs").await, 2);
}

#[tokio::test]
async fn a_bad_retention_setting_is_refused_naming_it_and_nothing_is_pruned() {
    let env = env_with("[queues.email]\n").await;
    seed(&env, "old", "email", "completed", 8.0 * DAY).await;
    for (var, value, words) in [
        (
            "JOBWARDEN_RETENTION__KEEP_COUNT",
            "0",
            "retention.keep_count (0) must be at least 1",
        ),
        (
            "JOBWARDEN_RETENTION__KEEP_COUNT",
            "-3",
            "retention.keep_count (-3) must be at least 1",
        ),
        (
            "JOBWARDEN_RETENTION__KEEP_COMPLETED",
            "a week",
            "retention.keep_completed: \"a week\" is not an age",
        ),
    ] {
        let vars = cli_env(&env, &[(var, value)]);
        let out = run_cli(&["prune"], &as_refs(&vars));
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert!(text(&out).contains(words), "{}", text(&out));
    }
    assert!(exists(&env, "old").await);
}
