-- An operator retries dead jobs: fresh attempts, same id, history kept. They become
-- `scheduled` now, so the scheduler publishes them at once.
-- $1 ids (NULL: every dead job of queue $2); $2 queue (NULL: any).
UPDATE jobs
SET status = 'scheduled', scheduled_at = now(), attempts = 0, completed_at = NULL,
    worker_id = NULL, updated_at = now()
WHERE status = 'dead'
  AND ($1::text[] IS NULL OR id = ANY($1::text[]))
  AND ($2::text IS NULL OR queue = $2)
RETURNING id
