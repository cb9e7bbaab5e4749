-- Cancels jobs that have not finished (an operator's one job, or a bulk action's batch): a
-- queued or scheduled job never runs; a running one is stopped by its owner, whose lease
-- check sees it is no longer `processing`, and whose late result the fence rejects; an
-- awaiting one's completion from outside is refused (the job was cancelled).
-- $1 ids; $2 the reason (last_error). Returns each cancelled job's id and the status it had.
WITH old AS (
    SELECT id, status FROM jobs
    WHERE id = ANY($1::text[]) AND status IN ('waiting', 'queued', 'scheduled', 'processing', 'awaiting')
    ORDER BY id
    FOR UPDATE
)
UPDATE jobs j
SET status = 'cancelled', completed_at = now(), updated_at = now(), last_error = $2,
    -- Its dependents are cancelled by the scheduler's chain round.
    chain_pending = j.has_dependents
FROM old
WHERE j.id = old.id AND j.status IN ('waiting', 'queued', 'scheduled', 'processing', 'awaiting')
RETURNING j.id, old.status
