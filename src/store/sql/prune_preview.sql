-- What a prune round would delete now and what it keeps, per queue and finished status:
-- (queue, status, going, kept, age in seconds of the oldest kept). Reads every finished job (an
-- operator's question, `jobwarden prune --dry-run`). $1 the statuses, $2 how long each is
-- kept by default (ms), $3 queues with an override, $4 the status of each override, $5 how
-- long (ms), $6 the keep_count cut of its queue (a timestamptz as text; NULL: no cap).
WITH defaults AS (
    SELECT * FROM unnest($1::text[], $2::int8[]) AS d(status, keep_ms)
),
policy AS (
    SELECT * FROM unnest($3::text[], $4::text[], $5::int8[], $6::text[])
        AS p(queue, status, keep_ms, floor)
),
finished AS (
    SELECT j.queue, j.status, j.completed_at,
           j.completed_at < greatest(now() - COALESCE(p.keep_ms, d.keep_ms) * interval '1 millisecond',
                                    p.floor::timestamptz)
           AND NOT j.chain_pending
           AND NOT (j.has_dependents AND EXISTS (
               SELECT 1 FROM job_deps x JOIN jobs c ON c.id = x.child
               WHERE x.parent = j.id AND c.status NOT IN ('completed', 'dead', 'cancelled')))
           AS goes
    FROM jobs j
    JOIN defaults d ON d.status = j.status
    LEFT JOIN policy p ON p.queue = j.queue AND p.status = j.status
)
SELECT queue, status,
       count(*) FILTER (WHERE goes) AS going,
       count(*) FILTER (WHERE NOT goes) AS kept,
       extract(epoch FROM now() - min(completed_at) FILTER (WHERE NOT goes))::float8 AS oldest_kept_age
FROM finished
GROUP BY queue, status
ORDER BY queue, status
