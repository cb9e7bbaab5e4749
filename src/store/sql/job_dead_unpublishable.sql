-- Due jobs that can never be published (their message is over the server's max_payload, or
-- is one no worker accepts: a row stored before the job contract, or by hand) become dead
-- with the reason, so they stop holding a place at the head of the schedule.
-- $1 ids; $2 reasons.
WITH d AS (
    UPDATE jobs j
    SET status = 'dead', completed_at = now(), updated_at = now(), last_error = i.reason,
        chain_pending = j.has_dependents
    FROM unnest($1::text[], $2::text[]) AS i(id, reason)
    WHERE j.id = ANY($1::text[]) AND j.id = i.id AND j.status = 'scheduled'
    RETURNING j.id, j.lease, j.attempts, j.queue, i.reason
),
history AS (
    INSERT INTO job_attempt_log (job_id, lease, attempt, outcome, error)
    SELECT id, lease, attempts, 'dead', reason FROM d
)
SELECT id, queue, reason FROM d
