-- Start-up reconciliation: marks the given earlier incarnations of this host stopped and
-- takes back their `processing` jobs (reason `restarted`), like the reaper does.
-- $1 owner ids; $2 reason.
WITH gone AS (
    UPDATE workers SET stopped_at = now(), stop_reason = $2
    WHERE id = ANY($1::text[]) AND stopped_at IS NULL
),
victims AS (
    SELECT id, worker_id AS owner FROM jobs
    WHERE status = 'processing' AND worker_id = ANY($1::text[])
    FOR UPDATE SKIP LOCKED
),
r AS (
    UPDATE jobs j
    SET status = CASE WHEN j.attempts >= j.max_attempts THEN 'dead' ELSE 'scheduled' END,
        scheduled_at = now(),
        completed_at = CASE WHEN j.attempts >= j.max_attempts THEN now() END,
        last_error = format('worker %s was gone when its host restarted, during attempt %s of %s (%s)',
                            v.owner, j.attempts, j.max_attempts, $2::text),
        worker_id = NULL,
        updated_at = now()
    FROM victims v
    WHERE j.id = v.id
    RETURNING j.id, j.lease, j.attempts, j.started_at, j.status, j.last_error, v.owner, j.queue
),
history AS (
    INSERT INTO job_attempts (job_id, lease, attempt, worker_id, started_at, outcome, error)
    SELECT id, lease, attempts, owner, started_at, $2, last_error FROM r
)
SELECT id, status, owner, queue FROM r
