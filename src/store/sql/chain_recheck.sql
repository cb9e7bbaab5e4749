-- The safety net of chain resolution, run every sweep: ended parents of waiting jobs that are
-- not marked pending (a child enqueued while its parent was ending, or a parent that ended by
-- a path that does not mark it, such as the reaper dead-lettering it) are marked. Returns
-- the ids it marked.
WITH stuck AS (
    SELECT DISTINCT d.parent AS id
    FROM jobs c
    JOIN job_deps d ON d.child = c.id
    JOIN jobs p ON p.id = d.parent
    WHERE c.status = 'waiting' AND p.status IN ('completed', 'dead', 'cancelled')
      AND NOT p.chain_pending
)
UPDATE jobs j SET chain_pending = true
FROM stuck s
WHERE j.id = s.id
RETURNING j.id
