-- Messages of an unserved queue whose job already has a row (enqueued through PostgreSQL
-- before the queue's workers existed, or retried from the dead-letter queue): when the row
-- holds the same payload it is this very job, so no copy is made. A row still waiting
-- (`queued` or `scheduled`) becomes dead with the reason, so `dlq retry` runs it once a pod
-- serves the queue; a row already terminal stays as it is (the message was a duplicate).
-- Returns the ids that are the same job (dead now or before); the caller keeps the others,
-- whose row is another job, under their message ids.
-- $1 ids; $2 payloads; $3 reasons.
WITH input AS (
    SELECT * FROM unnest($1::text[], $2::jsonb[], $3::text[]) AS t(id, payload, reason)
),
same AS (
    SELECT j.id, j.status, i.reason
    FROM jobs j JOIN input i ON i.id = j.id
    WHERE j.id = ANY($1::text[]) AND j.payload = i.payload
    FOR UPDATE OF j
),
d AS (
    UPDATE jobs j
    SET status = 'dead', completed_at = now(), updated_at = now(), last_error = same.reason,
        stale_at = NULL, chain_pending = j.has_dependents
    FROM same
    WHERE j.id = same.id AND same.status IN ('queued', 'scheduled')
    RETURNING j.id, j.lease, j.attempts, same.reason
),
history AS (
    INSERT INTO job_attempt_log (job_id, lease, attempt, outcome, error)
    SELECT id, lease, attempts, 'dead', reason FROM d
)
SELECT id, id IN (SELECT id FROM d) FROM same
