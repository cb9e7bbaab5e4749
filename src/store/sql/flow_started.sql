-- Grants of worker $2 for queue $1 that its claim just used: $3 of them started now (the
-- rate limit counts them from now), $4 more were not used (deleted).
WITH mine AS (
    SELECT id, row_number() OVER (ORDER BY id) AS k
    FROM flow_grants
    WHERE queue = $1 AND worker_id = $2 AND started_at IS NULL AND NOT done
    ORDER BY id
    LIMIT $3::int8 + $4::int8
),
started AS (
    UPDATE flow_grants g SET started_at = now()
    FROM mine WHERE g.id = mine.id AND mine.k <= $3::int8
    RETURNING g.id
)
DELETE FROM flow_grants g USING mine WHERE g.id = mine.id AND mine.k > $3::int8
