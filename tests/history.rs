//! Answers that do not grow with history: the rollup of finished work (`job_rollup`,
//! migrations/V16) counts every finished job once, whatever door it finished by and however
//! late its transaction commits, and `job_stats`, `jobwarden stats`, the dashboard's overview,
//! `/metrics` and `dlq list` read indexes and the rollup, never the finished rows.

mod common;

use common::{wait_for, TestEnv};
use std::time::Duration;
use tokio_postgres::types::ToSql;

const WORK: &str =
    "[queues.work]\nmax_attempts = 2\nbackoff = { kind = \"fixed\", base = \"50ms\" }\n\
                    handler = { kind = \"rust\", name = \"h\" }\n";

/// Waits until the rollup's mark has passed every finished row (the worker's rollup service
/// steps every few seconds).
async fn wait_rolled_up(env: &TestEnv) -> bool {
    wait_for(Duration::from_secs(60), || async {
        env.scalar(
            "SELECT count(*) FROM rollup_mark
             WHERE upto > (SELECT COALESCE(max(completed_at), '-infinity') FROM jobs)
               AND upto > (SELECT COALESCE(max(finished_at), '-infinity') FROM job_attempt_log)",
        )
        .await
            == 1
    })
    .await
}

/// Sums of the rollup's rows: (completed, retried, dead, cancelled).
async fn rolled(env: &TestEnv, queue: &str) -> (i64, i64, i64, i64) {
    let c = env.store.raw().await.unwrap();
    let r = c
        .query_one(
            "SELECT COALESCE(sum(completed), 0)::int8, COALESCE(sum(retried), 0)::int8,
                    COALESCE(sum(dead), 0)::int8, COALESCE(sum(cancelled), 0)::int8
             FROM job_rollup WHERE queue = $1",
            &[&queue],
        )
        .await
        .unwrap();
    (r.get(0), r.get(1), r.get(2), r.get(3))
}

#[tokio::test]
async fn every_finished_job_is_rolled_up_once_and_stats_read_the_rollup_not_the_rows() {
    let env = TestEnv::new(WORK).await;
    let h = common::by_kind();
    let worker = env.worker(&[("h", h)]).await;
    let kinds = [
        "ok", "ok", "flaky", "bad", "ok", "flaky", "ok", "bad", "ok", "ok",
    ];
    for (i, kind) in kinds.iter().enumerate() {
        env.publish_raw(
            "work",
            format!(r#"{{"id":"r{i}","payload":{{"kind":"{kind}"}}}}"#),
        )
        .await;
    }
    // A job cancelled before it runs (another door to a finished state).
    jobwarden::client::Client::new(env.store.clone(), env.broker.clone())
        .enqueue(
            "work",
            serde_json::json!({}),
            jobwarden::client::EnqueueOptions {
                id: Some("later".into()),
                delay: Some(Duration::from_secs(3600)),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(
        env.store.job_cancel("later").await.unwrap(),
        Some(jobwarden::job::JobStatus::Scheduled)
    );
    assert!(
        wait_for(Duration::from_secs(20), || async {
            env.count("completed").await == 8 && env.count("dead").await == 2
        })
        .await
    );
    assert!(wait_rolled_up(&env).await, "the rollup's mark never passed");
    // Let the service step a few more times: nothing is counted twice.
    tokio::time::sleep(Duration::from_secs(6)).await;
    worker.shutdown().await;
    assert_eq!(rolled(&env, "work").await, (8, 2, 2, 1));

    // The history goes (as retention would delete it); the day's figures stay.
    let c = env.store.raw().await.unwrap();
    c.batch_execute("DELETE FROM jobs; DELETE FROM job_attempt_log;")
        .await
        .unwrap();
    let stats = env.store.job_stats().await.unwrap();
    assert_eq!(stats.len(), 1, "{stats:?}");
    let s = &stats[0];
    assert_eq!(
        (s.queue.as_str(), s.completed_24h, s.dead_24h),
        ("work", 8, 2)
    );
    assert_eq!((s.queued, s.scheduled, s.processing), (0, 0, 0));
    // 12 attempts ended: 8 completed, 2 retried, 2 dead.
    assert!((s.retry_rate - 2.0 / 12.0).abs() < 1e-9, "{}", s.retry_rate);
    let (p50, p95) = (s.p50_run_seconds.unwrap(), s.p95_run_seconds.unwrap());
    assert!(p50 > 0.0 && p50 <= p95 && p95 < 5.0, "{p50} {p95}");
}

/// A settle's rows carry its transaction's start time; a transaction still open when the
/// rollup passes that time would be missed for ever. The mark waits for it.
#[tokio::test]
async fn a_finish_that_commits_late_is_rolled_up_once() {
    let env = TestEnv::new(WORK).await;
    // Bring the mark to the present first (a new schema starts a day back).
    for _ in 0..200 {
        if env.store.rollup_step().await.unwrap().caught_up {
            break;
        }
    }
    let mut late = env.store.raw().await.unwrap();
    let tx = late.transaction().await.unwrap();
    tx.batch_execute(
        "INSERT INTO jobs (id, queue, payload, status, max_attempts, started_at, completed_at)
         VALUES ('late', 'work', '{}', 'completed', 1, now() - interval '1 second', now())",
    )
    .await
    .unwrap();
    // The open transaction outlives the rollup's two seconds behind the clock.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let started: f64 = tx
        .query_one("SELECT extract(epoch FROM now())::float8", &[])
        .await
        .unwrap()
        .get(0);
    for _ in 0..3 {
        let step = env.store.rollup_step().await.unwrap();
        let upto = step.upto.expect("no other step runs");
        assert!(
            upto <= started,
            "the mark passed an open transaction's rows: {upto} > {started}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    tx.commit().await.unwrap();
    assert!(
        wait_for(Duration::from_secs(20), || async {
            env.store.rollup_step().await.unwrap();
            rolled(&env, "work").await.0 == 1
        })
        .await,
        "the late row was never counted"
    );
    for _ in 0..3 {
        env.store.rollup_step().await.unwrap();
    }
    assert_eq!(rolled(&env, "work").await, (1, 0, 0, 0));
}

#[tokio::test]
async fn minutes_fold_into_hours_and_percentiles_read_the_buckets() {
    let env = TestEnv::new(WORK).await;
    let c = env.store.raw().await.unwrap();
    // Percentiles: linear within a bucket, in seconds; the open last bucket answers its bound.
    let q = |sql: &'static str| {
        let c = &c;
        async move {
            c.query_one(sql, &[])
                .await
                .unwrap()
                .get::<_, Option<f64>>(0)
        }
    };
    // Ten runs between 10 and 25 ms: the median is halfway.
    let p50 = q("SELECT rollup_quantile('{0,0,10,0,0,0,0,0,0,0,0,0,0,0,0,0,0}', 0.5)").await;
    assert!((p50.unwrap() - 0.0175).abs() < 1e-9, "{p50:?}");
    let top = q("SELECT rollup_quantile('{0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,4}', 0.99)").await;
    assert_eq!(top, Some(3600.0));
    assert_eq!(
        q("SELECT rollup_quantile('{0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0}', 0.5)").await,
        None
    );
    let hist: Vec<i64> = c
        .query_one(
            "SELECT rollup_hist(ms) FROM unnest('{0,4,5,6,3600000,3600001,-3}'::float8[]) ms",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    // A bucket holds [its lower bound, its upper bound): 0, 4 and -3 (as 0) below 5 ms; 5
    // and 6 in [5, 10); the last bucket from an hour on.
    assert_eq!(hist, [3, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);

    // Three minutes of three hours ago, and one of now: the old ones become one hour row.
    c.batch_execute(
        "UPDATE rollup_mark SET upto = now() - interval '1 minute';
         INSERT INTO job_rollup (queue, span, bucket, completed, retried, run_ms, run_hist,
                                 wait_ms, wait_hist)
         SELECT 'work', 'minute', date_trunc('hour', now()) - interval '3 hours'
                                  + m * interval '1 minute',
                10, 1, 100, '{0,0,11,0,0,0,0,0,0,0,0,0,0,0,0,0,0}'::int8[], 50,
                '{10,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0}'::int8[]
         FROM generate_series(0, 2) m
         UNION ALL
         SELECT 'work', 'minute', date_trunc('minute', now()), 1, 0, 1,
                '{1,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0}'::int8[], 1,
                '{1,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0}'::int8[]",
    )
    .await
    .unwrap();
    env.store.rollup_step().await.unwrap();
    let rows: Vec<(String, i64, i64, f64, Vec<i64>)> = c
        .query(
            "SELECT span, completed, retried, run_ms, run_hist FROM job_rollup ORDER BY bucket",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
        .collect();
    let hour: Vec<i64> = [0, 0, 33].into_iter().chain([0; 14]).collect();
    let minute: Vec<i64> = [1].into_iter().chain([0; 16]).collect();
    assert_eq!(
        rows,
        vec![
            ("hour".into(), 30, 3, 300.0, hour),
            ("minute".into(), 1, 0, 1.0, minute)
        ]
    );
    // The last 24 hours read both.
    let day: (i64, i64) = {
        let r = c
            .query_one(
                "SELECT completed, retried FROM job_window(now() - interval '24 hours')",
                &[],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!(day, (31, 3));
}

/// Every operator answer reads the rollup and partial indexes, never the history: checked on
/// a table of 1,000,000 finished jobs (and their attempt log) spread over 30 days.
#[tokio::test]
async fn operator_answers_read_no_history_on_a_million_finished_jobs() {
    let env = TestEnv::new(WORK).await;
    let c = env.store.raw().await.unwrap();
    c.batch_execute(
        "INSERT INTO jobs (id, queue, payload, status, attempts, max_attempts, last_error,
                           scheduled_at, started_at, completed_at, updated_at)
         SELECT 'h-' || g, 'q' || (g % 8), '{}'::jsonb,
                CASE WHEN g % 100 = 0 THEN 'dead' WHEN g % 100 = 1 THEN 'cancelled'
                     ELSE 'completed' END,
                1, 5, CASE WHEN g % 100 = 0 THEN 'boom' END,
                t - interval '2 seconds', t - interval '1 second', t, t
         FROM generate_series(1, 1000000) g,
              LATERAL (SELECT now() - interval '30 days' * (g / 1000000.0) AS t) x;
         INSERT INTO jobs (id, queue, payload, status, max_attempts, updated_at)
         SELECT 'live-' || g, 'q' || (g % 8), '{}'::jsonb,
                (ARRAY['queued', 'scheduled', 'processing'])[1 + g % 3], 5, now()
         FROM generate_series(1, 300) g;
         INSERT INTO job_attempt_log (job_id, lease, attempt, worker_id, started_at, finished_at,
                                      outcome, queue)
         SELECT 'h-' || g, 1, 1, 'w', now() - g * interval '3 second',
                now() - g * interval '3 second' + interval '5 ms', 'retry', 'q' || (g % 8)
         FROM generate_series(100000, 1, -1) g;
",
    )
    .await
    .unwrap();
    // The rollup catches up on the last day (a new schema's mark starts a day back).
    let mut steps = 0;
    while !env.store.rollup_step().await.unwrap().caught_up {
        steps += 1;
        assert!(steps < 500, "the rollup does not catch up");
    }
    // As autovacuum leaves tables whose finished rows no longer change (each its own
    // statement: VACUUM runs outside a transaction block).
    for table in ["jobs", "job_attempt_log", "job_rollup"] {
        c.batch_execute(&format!("VACUUM ANALYZE {table}"))
            .await
            .unwrap();
    }
    let stats = env.store.job_stats().await.unwrap();
    assert_eq!(stats.len(), 8, "{stats:?}");
    // 1,000,000 over 30 days: a day holds 33,333 of them, 98 % completed, 1 % dead.
    let completed: i64 = stats.iter().map(|s| s.completed_24h).sum();
    assert!((32_000..=34_700).contains(&completed), "{completed}");
    assert_eq!(stats.iter().map(|s| s.queued).sum::<i64>(), 100);

    let sql = |name: &str| {
        jobwarden::store::ALL_SQL
            .iter()
            .find(|(n, _)| *n == name)
            .unwrap_or_else(|| panic!("{name}"))
            .1
    };
    // The bodies of the rollup's functions, as shipped, with their parameters as $n.
    let body = |name: &'static str| {
        let c = &c;
        async move {
            let src: String = c
                .query_one(
                    "SELECT prosrc FROM pg_proc
                     WHERE proname = $1 AND pronamespace = current_schema()::regnamespace",
                    &[&name],
                )
                .await
                .unwrap()
                .get(0);
            src
        }
    };
    let window = body("job_window").await.replace("since", "$1::timestamptz");
    let none: Option<String> = None;
    let q1 = Some("q1".to_string());
    let first = String::new();
    let limit = 50i64;
    let day_ago = std::time::SystemTime::now() - Duration::from_secs(86_400);
    let day_ago_secs = day_ago
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let hour = "hour".to_string();
    let cases: Vec<(&str, String, Vec<&(dyn ToSql + Sync)>)> = vec![
        ("stats", sql("job_stats").to_string(), vec![]),
        ("job_stats view", "SELECT * FROM job_stats".into(), vec![]),
        ("job_window", window, vec![&day_ago]),
        (
            "job_ends",
            "SELECT * FROM job_ends(now() - interval '1 minute', now())".into(),
            vec![],
        ),
        (
            "overview",
            sql("dashboard_overview").into(),
            vec![&first, &limit],
        ),
        (
            "charts, 24 hours",
            sql("rollup_series").into(),
            vec![&hour, &day_ago_secs, &first, &limit],
        ),
        ("depth (metrics)", sql("job_depth").into(), vec![]),
        ("dlq list", sql("dead_list").into(), vec![&none, &limit]),
        (
            "dlq list of a queue",
            sql("dead_list").into(),
            vec![&q1, &limit],
        ),
    ];
    for (what, text, params) in cases {
        let rows = c
            .query(&format!("EXPLAIN {text}"), &params)
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let plan: Vec<String> = rows.iter().map(|r| r.get::<_, String>(0)).collect();
        let plan = plan.join("\n");
        if what == "overview" {
            // The dead-letter queue is counted from its index alone, not its rows.
            assert!(
                plan.contains("Index Only Scan using jobs_dead on jobs"),
                "{what} reads the dead rows:\n{plan}"
            );
        }
        if what.starts_with("dlq") {
            assert!(
                !plan.contains("Sort"),
                "{what} sorts the dead-letter queue:\n{plan}"
            );
        }
        for table in ["jobs", "job_attempt_log", "job_rollup"] {
            assert!(
                !plan.contains(&format!("Seq Scan on {table}")),
                "{what} reads all of {table}:\n{plan}"
            );
        }
    }
}
