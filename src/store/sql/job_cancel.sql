-- An operator cancels a job that has not finished. A queued or scheduled job never runs; a
-- running one is stopped by its owner, whose lease check sees it is no longer `processing`,
-- and whose late result the fence rejects. $1 id. Returns the status it had.
WITH old AS (
    SELECT id, status FROM jobs WHERE id = $1 FOR UPDATE
)
UPDATE jobs j
SET status = 'cancelled', completed_at = now(), updated_at = now(),
    last_error = 'cancelled by an operator',
    -- Its dependents are cancelled by the scheduler's chain round.
    chain_pending = j.has_dependents
FROM old
WHERE j.id = old.id AND old.status IN ('waiting', 'queued', 'scheduled', 'processing')
RETURNING old.status
