-- $3 jobs of queue $1 that worker $2 started have ended: their grants no longer count for
-- the cap. With a rate limit ($4) they stay until a window after they ended.
WITH ended AS (
    SELECT id FROM flow_grants
    WHERE queue = $1 AND worker_id = $2 AND started_at IS NOT NULL AND NOT done
    ORDER BY started_at
    LIMIT $3
),
kept AS (
    UPDATE flow_grants g SET done = true, done_at = now() FROM ended WHERE g.id = ended.id AND $4::bool
    RETURNING g.id
)
DELETE FROM flow_grants g USING ended WHERE g.id = ended.id AND NOT $4::bool
