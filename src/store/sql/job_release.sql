-- A worker gives back jobs it owns (fenced by lease): at shutdown (`released`, the attempt
-- is refunded) or after it fenced itself off (`self_fenced`, the attempt counts). They
-- become `scheduled` now, so the scheduler republishes them at once.
-- $1 worker id; $2 ids; $3 leases; $4 reason; $5 attempts refunded (0 or 1).
WITH input AS (
    SELECT * FROM unnest($2::text[], $3::int8[]) AS t(id, lease)
),
r AS (
    UPDATE jobs j
    SET status = 'scheduled', scheduled_at = now(), attempts = j.attempts - $5::int4,
        worker_id = NULL, updated_at = now(),
        last_error = CASE WHEN $5 = 0
                          THEN format('worker %s gave the job back during attempt %s (%s)', $1::text, j.attempts, $4::text)
                          ELSE j.last_error END
    FROM input i
    WHERE j.id = ANY($2::text[]) AND j.id = i.id AND j.worker_id = $1 AND j.lease = i.lease AND j.status = 'processing'
    RETURNING j.id, j.lease, j.attempts + $5 AS attempt, j.started_at
),
history AS (
    INSERT INTO job_attempts (job_id, lease, attempt, worker_id, started_at, outcome, error)
    SELECT id, lease, attempt, $1, started_at, $4, NULL FROM r
)
SELECT id FROM r
