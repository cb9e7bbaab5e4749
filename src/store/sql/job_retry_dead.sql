-- An operator retries dead jobs: fresh attempts, same id, history kept. They become
-- `scheduled` now, so the scheduler publishes them at once — except a job that still has a
-- parent that has not completed (it died because of that parent): it waits again as
-- `waiting`, and runs once its parents completed (its ended parents are resolved again).
-- Jobs of their chains that died or were cancelled because of them (blocked_by) wait again
-- for their parents.
-- $1 ids (NULL: every dead job of queue $2); $2 queue (NULL: any).
WITH RECURSIVE targets AS (
    SELECT j.id,
           EXISTS (SELECT 1 FROM job_deps d JOIN jobs p ON p.id = d.parent
                   WHERE d.child = j.id AND p.status <> 'completed') AS blocked
    FROM jobs j
    WHERE j.status = 'dead'
      AND ($1::text[] IS NULL OR j.id = ANY($1::text[]))
      AND ($2::text IS NULL OR j.queue = $2)
),
retried AS (
    UPDATE jobs j
    SET status = CASE WHEN t.blocked THEN 'waiting' ELSE 'scheduled' END,
        scheduled_at = now(), attempts = 0, completed_at = NULL,
        worker_id = NULL, updated_at = now(), blocked_by = NULL, chain_pending = false
    FROM targets t
    WHERE j.id = t.id AND j.status = 'dead'
    RETURNING j.id, t.blocked
),
-- A job sent back to waiting is decided again when its ended parents are resolved.
repoke AS (
    UPDATE jobs p SET chain_pending = true
    FROM job_deps d JOIN retried r ON r.id = d.child AND r.blocked
    WHERE p.id = d.parent AND p.status IN ('completed', 'dead', 'cancelled')
      AND NOT p.chain_pending AND p.id NOT IN (SELECT id FROM retried)
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
