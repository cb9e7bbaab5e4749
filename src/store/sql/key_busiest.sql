-- The busiest keys of each keyed queue (of queue $1, or all when NULL): at most $2 per queue,
-- the longest backlog (parked jobs) first, then the most running. The parked jobs are
-- counted over the parked index (`jobs_parked`, grouped in its order), the running ones over
-- `jobs_key_running`: neither reads a finished job. Jobs without a key count under ''.
WITH parked AS (
    SELECT j.queue, COALESCE(j.key, '') AS key, count(*) AS parked
    FROM jobs j
    WHERE j.status = 'queued' AND j.parked AND ($1::text IS NULL OR j.queue = $1)
    GROUP BY j.queue, COALESCE(j.key, '')
),
running AS (
    SELECT j.queue, j.key, count(*) AS running
    FROM jobs j
    WHERE j.status = 'processing' AND j.key IS NOT NULL AND ($1::text IS NULL OR j.queue = $1)
      AND j.queue IN (SELECT f.queue FROM flow_queues f WHERE f.key_declared_at IS NOT NULL
                      UNION SELECT p.queue FROM parked p)
    GROUP BY j.queue, j.key
),
ranked AS (
    SELECT COALESCE(p.queue, r.queue) AS queue, COALESCE(p.key, r.key) AS key,
           COALESCE(p.parked, 0) AS parked, COALESCE(r.running, 0) AS running,
           row_number() OVER (PARTITION BY COALESCE(p.queue, r.queue)
                              ORDER BY COALESCE(p.parked, 0) DESC, COALESCE(r.running, 0) DESC,
                                       COALESCE(p.key, r.key)) AS rank
    FROM parked p FULL JOIN running r ON r.queue = p.queue AND r.key = p.key
)
SELECT queue, key, parked::int8, running::int8
FROM ranked
WHERE rank <= $2::int8
ORDER BY queue, rank
