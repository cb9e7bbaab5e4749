-- An operator retries dead jobs: fresh attempts, same id, history kept. They become
-- `scheduled` now, so the scheduler publishes them at once. Jobs of their chains that died
-- or were cancelled because of them (blocked_by) wait again for their parents.
-- $1 ids (NULL: every dead job of queue $2); $2 queue (NULL: any).
WITH RECURSIVE retried AS (
    UPDATE jobs
    SET status = 'scheduled', scheduled_at = now(), attempts = 0, completed_at = NULL,
        worker_id = NULL, updated_at = now(), blocked_by = NULL, chain_pending = false
    WHERE status = 'dead'
      AND ($1::text[] IS NULL OR id = ANY($1::text[]))
      AND ($2::text IS NULL OR queue = $2)
    RETURNING id
),
doomed AS (
    SELECT d.child AS id
    FROM job_deps d JOIN retried r ON r.id = d.parent
    JOIN jobs c ON c.id = d.child AND c.blocked_by IS NOT NULL
    UNION
    SELECT d.child
    FROM job_deps d JOIN doomed x ON x.id = d.parent
    JOIN jobs c ON c.id = d.child AND c.blocked_by IS NOT NULL
),
revived AS (
    UPDATE jobs c
    SET status = 'waiting', blocked_by = NULL, last_error = NULL, completed_at = NULL,
        chain_pending = false, updated_at = now()
    FROM (SELECT DISTINCT id FROM doomed) x
    WHERE c.id = x.id AND c.status IN ('dead', 'cancelled') AND c.id NOT IN (SELECT id FROM retried)
)
SELECT id FROM retried
