-- An operator cancels a whole pipeline: every unfinished job that carries the pipeline of
-- job $1 (or is its first job). Running ones are stopped by their owners, as with one
-- cancel. Returns the ids it cancelled.
WITH root AS (
    SELECT COALESCE(pipeline, id) AS pipeline FROM jobs WHERE id = $1
)
UPDATE jobs j
SET status = 'cancelled', completed_at = now(), updated_at = now(),
    last_error = 'pipeline cancelled by an operator',
    chain_pending = j.has_dependents
FROM root r
WHERE (j.pipeline = r.pipeline OR j.id = r.pipeline)
  AND j.status IN ('waiting', 'queued', 'scheduled', 'processing', 'awaiting')
RETURNING j.id
