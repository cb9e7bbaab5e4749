//! Bulk actions by filter (`jobwarden jobs bulk`, `POST /jobs/bulk`): the count comes first
//! and nothing changes without a confirmation; the action takes only what the filter matches
//! and at most the count shown, in batches; who did it is recorded; bad input changes
//! nothing.

mod common;

use common::{text, TestEnv};

const QUEUES: &str = "[queues.email]\nhandler = { kind = \"rust\", name = \"h\" }\n\
                      [queues.pdf]\nhandler = { kind = \"rust\", name = \"h\" }\n";

/// Inserts jobs straight into the table: `n` of `queue` in `status`, ids `<prefix><i>`,
/// enqueued `age` ago, with a last error naming their number.
async fn seed(env: &TestEnv, queue: &str, status: &str, prefix: &str, n: i64, age: &str) {
    env.store
        .raw()
        .await
        .unwrap()
        .execute(
            "INSERT INTO jobs (id, queue, payload, status, max_attempts, last_error,
                               scheduled_at, created_at, completed_at)
             SELECT $3 || g, $1, '{}', $2, 3,
                    CASE WHEN $2 IN ('dead', 'cancelled') THEN 'failed ' || g END,
                    now() + interval '1 hour', now() - $5::text::interval,
                    CASE WHEN $2 IN ('dead', 'cancelled') THEN now() END
             FROM generate_series(0, $4::int8 - 1) g",
            &[&queue, &status, &prefix, &n, &age],
        )
        .await
        .unwrap();
}

async fn statuses(env: &TestEnv, like: &str) -> Vec<(String, i64)> {
    env.store
        .raw()
        .await
        .unwrap()
        .query(
            "SELECT status, count(*) FROM jobs WHERE id LIKE $1 GROUP BY 1 ORDER BY 1",
            &[&like],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

#[tokio::test]
async fn the_cli_counts_first_then_acts_on_exactly_the_matching_jobs_and_records_who() {
    let env = TestEnv::new(QUEUES).await;
    seed(&env, "email", "scheduled", "mail-", 30, "1 minute").await;
    seed(&env, "email", "scheduled", "old-", 4, "3 hours").await;
    seed(&env, "pdf", "scheduled", "doc-", 5, "1 minute").await;
    let args = [
        "jobs",
        "bulk",
        "cancel",
        "--status",
        "scheduled",
        "--queue",
        "email",
        "--text",
        "mail-1",
    ];
    // Without --yes: the count, nothing changed.
    let out = env.cli(&args);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("11 jobs match status scheduled, queue \"email\""),
        "{}",
        text(&out)
    );
    assert_eq!(
        statuses(&env, "%").await,
        vec![("scheduled".to_string(), 39)]
    );
    // With it: mail-1 and mail-10 to mail-19, nothing else.
    let out = env.cli(&[&args[..], &["--yes"]].concat());
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("11 of 11 jobs"), "{}", text(&out));
    assert_eq!(
        statuses(&env, "mail-1%").await,
        vec![("cancelled".to_string(), 11)]
    );
    assert_eq!(
        statuses(&env, "mail-2%").await,
        vec![("scheduled".into(), 11)]
    );
    assert_eq!(statuses(&env, "doc-%").await, vec![("scheduled".into(), 5)]);
    let c = env.store.raw().await.unwrap();
    let row = c
        .query_one(
            "SELECT by, action, matched, changed, filter->>'text', finished_at IS NOT NULL
             FROM bulk_actions",
            &[],
        )
        .await
        .unwrap();
    let by: String = row.get(0);
    assert!(by.starts_with("cli:") && by.contains('@'), "{by}");
    assert_eq!(row.get::<_, String>(1), "cancel");
    assert_eq!((row.get::<_, i64>(2), row.get::<_, i64>(3)), (11, 11));
    assert_eq!(row.get::<_, String>(4), "mail-1");
    assert!(row.get::<_, bool>(5));
    let why: String = c
        .query_one("SELECT last_error FROM jobs WHERE id = 'mail-12'", &[])
        .await
        .unwrap()
        .get(0);
    assert!(
        why.starts_with("cancelled by cli:") && why.contains("bulk action"),
        "{why}"
    );

    // By enqueue time: only the jobs enqueued over two hours ago.
    let out = env.cli(&[
        "jobs",
        "bulk",
        "cancel",
        "--status",
        "scheduled",
        "--until",
        "2h",
        "--yes",
        "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (v["matched"].as_i64(), v["changed"].as_i64()),
        (Some(4), Some(4))
    );
    assert_eq!(statuses(&env, "old-%").await, vec![("cancelled".into(), 4)]);

    // Discard what was cancelled in email; retry nothing else.
    let out = env.cli(&[
        "jobs",
        "bulk",
        "discard",
        "--status",
        "cancelled",
        "--queue",
        "email",
        "--yes",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        env.scalar("SELECT count(*) FROM jobs WHERE status = 'cancelled'")
            .await,
        0
    );
    assert_eq!(env.scalar("SELECT count(*) FROM jobs").await, 39 - 15);
}

#[tokio::test]
async fn a_bulk_retry_gives_dead_jobs_fresh_attempts_in_batches() {
    let env = TestEnv::new(QUEUES).await;
    // More than two batches.
    seed(&env, "email", "dead", "d-", 2500, "1 minute").await;
    seed(&env, "pdf", "dead", "p-", 3, "1 minute").await;
    let out = env.cli(&[
        "jobs", "bulk", "retry", "--status", "dead", "--queue", "email", "--yes",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("2500 of 2500 jobs"), "{}", text(&out));
    assert_eq!(
        statuses(&env, "d-%").await,
        vec![("scheduled".into(), 2500)]
    );
    assert_eq!(statuses(&env, "p-%").await, vec![("dead".into(), 3)]);
    assert_eq!(
        env.scalar("SELECT count(*) FROM jobs WHERE id LIKE 'd-%' AND attempts = 0")
            .await,
        2500
    );
}

#[tokio::test]
async fn bad_bulk_input_is_refused_naming_what_is_wrong_and_nothing_changes() {
    let env = TestEnv::new(QUEUES).await;
    seed(&env, "email", "dead", "d-", 3, "1 minute").await;
    seed(&env, "email", "queued", "q-", 3, "1 minute").await;
    let before = statuses(&env, "%").await;
    for (args, says) in [
        (
            vec!["retry", "--status", "queued"],
            "a bulk retry takes dead jobs, not queued",
        ),
        (
            vec!["cancel", "--status", "dead"],
            "a bulk cancel takes waiting or queued or scheduled or processing or awaiting jobs, not dead",
        ),
        (
            vec!["cancel", "--status", "finished"],
            "--status \"finished\" is not a job status",
        ),
        (
            vec!["cancel", "--status", "queued", "--since", "yesterday"],
            "--since \"yesterday\" is neither an instant",
        ),
        (
            vec![
                "cancel", "--status", "queued", "--since", "1h", "--until", "2h",
            ],
            "--since is not before --until",
        ),
        (
            vec!["cancel", "--status", "queued", "--queue", "emial"],
            "no job matches status queued, queue \"emial\": nothing to cancel",
        ),
    ] {
        let out = env.cli(&[&["jobs", "bulk"][..], &args, &["--yes"]].concat());
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        let said = text(&out);
        assert!(said.contains(says), "{args:?}: {said}");
        assert!(said.contains("nothing changed"), "{args:?}: {said}");
    }
    assert_eq!(statuses(&env, "%").await, before);
    assert_eq!(env.scalar("SELECT count(*) FROM bulk_actions").await, 0);
}

/// The dashboard: a named admin token counts, confirms, and acts on at most the count it
/// confirmed; the action is recorded under the token's name; without a token, refused.
#[tokio::test]
async fn a_named_admin_acts_in_bulk_from_the_dashboard_after_a_count() {
    let env = TestEnv::new(&format!(
        "{QUEUES}[dashboard]\nlisten = \"127.0.0.1:0\"\n\
         [dashboard.admin_tokens]\nalice = \"alice-0123456789abcdef\"\n"
    ))
    .await;
    seed(&env, "email", "scheduled", "m-", 12, "1 minute").await;
    // (Scheduled an hour ahead: the worker never starts them here.)
    let h = jobwarden::handler::from_fn(|_job| async { Ok(None) });
    let worker = env.worker(&[("h", h)]).await;
    let base = format!("http://{}", worker.dashboard_addr.expect("dashboard on"));
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let post = |form: Vec<(&'static str, String)>, token: Option<&'static str>| {
        let body: Vec<String> = form
            .iter()
            .map(|(k, v)| format!("{k}={}", v.replace(':', "%3A")))
            .collect();
        let mut r = http
            .post(format!("{base}/jobs/bulk"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body.join("&"));
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        async move {
            let r = r.send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    let form = |expect: Option<i64>| {
        let mut f = vec![
            ("action", "cancel".to_string()),
            ("status", "scheduled".to_string()),
            ("queue", "email".to_string()),
            ("q", String::new()),
            ("since", "1h".to_string()),
            ("until", String::new()),
        ];
        if let Some(n) = expect {
            f.push(("expect", n.to_string()));
        }
        f
    };
    let alice = Some("alice-0123456789abcdef");
    // Nobody's token: refused.
    let (status, body) = post(form(None), None).await;
    assert_eq!(status, 403, "{body}");
    // The count, and a form to confirm it; nothing changed.
    let (status, body) = post(form(None), alice).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#"data-matched="12""#), "{body}");
    assert!(body.contains(r#"name="expect" value="12""#), "{body}");
    assert_eq!(statuses(&env, "m-%").await, vec![("scheduled".into(), 12)]);
    // Confirmed for 5: five go, however many match.
    let (status, body) = post(form(Some(5)), alice).await;
    assert_eq!(status, 303, "{body}");
    assert_eq!(
        statuses(&env, "m-%").await,
        vec![("cancelled".into(), 5), ("scheduled".into(), 7)]
    );
    let by: String = env
        .store
        .raw()
        .await
        .unwrap()
        .query_one("SELECT by FROM bulk_actions", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(by, "dashboard:alice");
    // A filter that matches nothing, or an action the status does not take: 400, saying so.
    let mut none = form(None);
    none[2].1 = "emial".into();
    let (status, body) = post(none, alice).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("no job matches"), "{body}");
    let mut wrong = form(None);
    wrong[0].1 = "retry".into();
    let (status, body) = post(wrong, alice).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("a bulk retry takes dead jobs, not scheduled"),
        "{body}"
    );
    assert_eq!(env.scalar("SELECT count(*) FROM bulk_actions").await, 1);
    worker.shutdown().await;
}
