-- The safety net of chain resolution, run every sweep:
-- - ended parents of waiting jobs that are not marked pending (a child enqueued while its
--   parent was ending, or a parent that ended by a path that does not mark it) are marked;
-- - jobs that died or were cancelled because of a parent (blocked_by) that is no longer
--   dead or cancelled (it was retried while a chain round was deciding them) wait again.
-- Returns how many rows it changed.
WITH stuck AS (
    SELECT DISTINCT d.parent AS id
    FROM jobs c
    JOIN job_deps d ON d.child = c.id
    JOIN jobs p ON p.id = d.parent
    WHERE c.status = 'waiting' AND p.status IN ('completed', 'dead', 'cancelled')
      AND NOT p.chain_pending
),
marked AS (
    UPDATE jobs j SET chain_pending = true
    FROM stuck s
    WHERE j.id = s.id AND j.status IN ('completed', 'dead', 'cancelled') AND NOT j.chain_pending
    RETURNING j.id
),
healed AS (
    UPDATE jobs c
    SET status = 'waiting', blocked_by = NULL, last_error = NULL, completed_at = NULL,
        updated_at = now()
    FROM jobs p
    WHERE p.id = c.blocked_by AND c.status IN ('dead', 'cancelled')
      AND p.status NOT IN ('dead', 'cancelled')
      AND c.id NOT IN (SELECT id FROM marked)
    RETURNING c.id
)
SELECT (SELECT count(*) FROM marked) + (SELECT count(*) FROM healed)
