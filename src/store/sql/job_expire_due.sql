-- The scheduler's expiry round: ends queued and scheduled jobs whose expiry has passed, at
-- most $1 of them (the earliest expiries first), as `cancelled` with last_error
-- `expired: not started by <instant>` — whether a message is still on its way (its claim
-- then finds the job ended and acks it) or gone. A retry whose backoff passes its expiry
-- ends so when the expiry passes, without running again. Rows other transactions hold are
-- skipped (another pod's round, or a claim: a job claimed meanwhile is `processing` when
-- the lock is granted, and runs). Reads the partial index `jobs_expiring`.
-- $1 limit. Returns the id and queue of each job ended.
WITH due AS (
    SELECT id
    FROM jobs
    WHERE expires_at <= now() AND expires_at IS NOT NULL AND status IN ('queued', 'scheduled')
    ORDER BY expires_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE jobs j
SET status = 'cancelled', completed_at = now(), updated_at = now(),
    last_error = job_expired_reason(j.expires_at),
    -- Its dependents are cancelled by the scheduler's chain round (as an operator's cancel).
    chain_pending = j.has_dependents
FROM due
WHERE j.id = due.id AND j.status IN ('queued', 'scheduled')
RETURNING j.id, j.queue
