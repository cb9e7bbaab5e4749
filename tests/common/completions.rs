//! Completions counted at the source. Since migration V11 the `job_attempts` view reads a
//! completion from the job's own row, so it shows at most one per job whatever happened: a
//! check written against it cannot see a job completed twice. A test that wants to know
//! installs [`record_completions`] on its schema: a trigger on `jobs` that writes a row into a
//! test-owned table for every committed write that completes a job — a row becoming
//! `completed`, or a completed row whose `completed_at` is stamped again (a second settle of a
//! job that was completed already). Each row keeps what the job's row held then: owner,
//! lease, attempt and result, so a test can tell which run a completion came from.

use super::TestEnv;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// One write that completed a job, as the trigger saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    pub worker_id: Option<String>,
    pub lease: i64,
    pub attempt: i32,
    /// The status the row had before the write (`completed` for a second settle; `none` for a
    /// row inserted completed).
    pub from: String,
    pub result: Option<Value>,
}

impl Completion {
    /// Whether the result settled is the receipt of the owner's own run. For jobs run by
    /// [`super::RecordingApp`], which answers every run with `{"worker": …, "attempt": …}`:
    /// a completion whose result names another run (a stale owner's late answer written over
    /// the current owner's row) settled someone else's work.
    pub fn settled_its_own_run(&self) -> bool {
        self.result.as_ref() == Some(&json!({ "worker": self.worker_id, "attempt": self.attempt }))
    }
}

/// Installs the trigger and its table (`test_completions`) in the test's schema. Call it
/// before the first job completes.
pub async fn record_completions(env: &TestEnv) {
    let s = &env.config.database.schema;
    let sql = format!(
        r#"
        CREATE TABLE "{s}".test_completions (
            n bigserial PRIMARY KEY,
            job_id text NOT NULL,
            worker_id text,
            lease int8 NOT NULL,
            attempt int4 NOT NULL,
            from_status text NOT NULL,
            result jsonb
        );
        CREATE FUNCTION "{s}".test_record_completion() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.status = 'completed' AND (TG_OP = 'INSERT'
                   OR OLD.status IS DISTINCT FROM 'completed'
                   OR OLD.completed_at IS DISTINCT FROM NEW.completed_at) THEN
                INSERT INTO "{s}".test_completions
                    (job_id, worker_id, lease, attempt, from_status, result)
                VALUES (NEW.id, NEW.worker_id, NEW.lease, NEW.attempts,
                        CASE WHEN TG_OP = 'INSERT' THEN 'none' ELSE OLD.status END,
                        NEW.result);
            END IF;
            RETURN NULL;
        END $$;
        CREATE TRIGGER test_record_completion AFTER INSERT OR UPDATE ON "{s}".jobs
            FOR EACH ROW EXECUTE FUNCTION "{s}".test_record_completion();
        "#
    );
    env.store
        .raw()
        .await
        .expect("connect to install the completion trigger")
        .batch_execute(&sql)
        .await
        .unwrap_or_else(|e| panic!("installing the completion trigger in schema {s}: {e}"));
}

/// Every completion recorded so far, per job id, in commit order per job.
pub async fn completions(env: &TestEnv) -> BTreeMap<String, Vec<Completion>> {
    let rows = env
        .store
        .raw()
        .await
        .expect("connect to read test_completions")
        .query(
            "SELECT job_id, worker_id, lease, attempt, from_status, result \
             FROM test_completions ORDER BY n",
            &[],
        )
        .await
        .expect("read test_completions (was record_completions called?)");
    let mut by_job: BTreeMap<String, Vec<Completion>> = BTreeMap::new();
    for r in rows {
        by_job.entry(r.get(0)).or_default().push(Completion {
            worker_id: r.get(1),
            lease: r.get(2),
            attempt: r.get(3),
            from: r.get(4),
            result: r.get(5),
        });
    }
    by_job
}

/// The jobs among `ids` not completed exactly once at the source, with what was recorded for
/// each (empty when every one completed once).
pub fn not_completed_once<'a>(
    recorded: &'a BTreeMap<String, Vec<Completion>>,
    ids: impl IntoIterator<Item = &'a String>,
) -> Vec<(&'a String, &'a [Completion])> {
    ids.into_iter()
        .map(|id| (id, recorded.get(id).map_or(&[][..], Vec::as_slice)))
        .filter(|(_, c)| c.len() != 1)
        .collect()
}
