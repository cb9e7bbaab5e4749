-- The busiest keys of each keyed queue (of queue $1, or all when NULL): at most $2 per queue,
-- the longest backlog (parked jobs) first, then the most running. Per queue (every queue a
-- take or a flow grant has seen, `flow_queues`), the parked jobs are grouped in the order of
-- the parked index (`jobs_parked`: a streaming count per key, no sort of all keys) and only
-- the top $2 kept; the running ones are counted over `jobs_key_running`. Neither reads a
-- finished job. Jobs without a key count under ''.
WITH queues AS (
    SELECT f.queue, f.key_declared_at IS NOT NULL AS declared
    FROM flow_queues f
    WHERE $1::text IS NULL OR f.queue = $1
),
parked AS (
    SELECT q.queue, t.key, t.parked
    FROM queues q
         CROSS JOIN LATERAL (
             SELECT COALESCE(j.key, '') AS key, count(*) AS parked
             FROM jobs j
             WHERE j.queue = q.queue AND j.status = 'queued' AND j.parked
             GROUP BY COALESCE(j.key, '')
             ORDER BY count(*) DESC, COALESCE(j.key, '')
             LIMIT $2::int8) t
),
running AS (
    SELECT j.queue, j.key, count(*) AS running
    FROM jobs j
    WHERE j.status = 'processing' AND j.key IS NOT NULL
      AND j.queue IN (SELECT q.queue FROM queues q WHERE q.declared
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
