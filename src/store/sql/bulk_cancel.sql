-- A bulk action cancels jobs that have not finished (as job_cancel.sql does one): a queued
-- or scheduled job never runs; a running one is stopped by its owner, whose lease check
-- sees it is no longer `processing`. $1 ids; $2 the reason (who, which bulk action).
-- Returns the ids cancelled.
WITH old AS (
    SELECT id FROM jobs
    WHERE id = ANY($1::text[]) AND status IN ('waiting', 'queued', 'scheduled', 'processing')
    ORDER BY id
    FOR UPDATE
)
UPDATE jobs j
SET status = 'cancelled', completed_at = now(), updated_at = now(), last_error = $2,
    -- Its dependents are cancelled by the scheduler's chain round.
    chain_pending = j.has_dependents
FROM old
WHERE j.id = old.id AND j.status IN ('waiting', 'queued', 'scheduled', 'processing')
RETURNING j.id
