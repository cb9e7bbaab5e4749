-- Settles a batch of finished attempts in one statement, fenced by owner and lease: a row
-- whose lease moved on (reclaimed by someone else) is not touched and not returned.
-- Each settled attempt also leaves a row in job_attempts.
-- $1 worker id; $2 ids; $3 leases; $4 new statuses; $5 retry delays (ms); $6 errors;
-- $7 results; $8 attempt outcomes.
WITH input AS (
    SELECT *
    FROM unnest($2::text[], $3::int8[], $4::text[], $5::int8[], $6::text[], $7::jsonb[], $8::text[])
         AS t(id, lease, status, delay_ms, error, result, outcome)
),
done AS (
    UPDATE jobs j
    SET status = i.status,
        completed_at = CASE WHEN i.status IN ('completed', 'dead') THEN now() END,
        scheduled_at = CASE WHEN i.status = 'scheduled'
                            THEN now() + i.delay_ms * interval '1 millisecond'
                            ELSE j.scheduled_at END,
        last_error = COALESCE(i.error, j.last_error),
        result = i.result,
        updated_at = now()
    FROM input i
    WHERE j.id = i.id AND j.worker_id = $1 AND j.lease = i.lease AND j.status = 'processing'
    RETURNING j.id, j.lease, j.attempts, j.started_at, i.outcome, i.error
),
history AS (
    INSERT INTO job_attempts (job_id, lease, attempt, worker_id, started_at, outcome, error)
    SELECT id, lease, attempts, $1, started_at, outcome, error FROM done
    ON CONFLICT DO NOTHING
)
SELECT id FROM done
