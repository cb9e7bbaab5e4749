-- The dashboard's overview, one row per queue: jobs waiting, running and dead (each count over
-- its partial index), the oldest queued job's age, and from the last minute of attempts (BRIN
-- on finished_at) completions, failures and run-time percentiles. A page of queues in name
-- order after $1 ('' for the first page), $2 of them.
-- (Each status is written as a constant, not read from the rows: the counts then read only
-- their index's own columns, and a large dead-letter queue is counted without its rows.)
WITH counts AS (
    SELECT queue, 'queued'::text AS status, count(*)::int8 AS n, max(now() - updated_at) AS oldest
    FROM jobs WHERE status = 'queued' GROUP BY queue
    UNION ALL
    SELECT queue, 'scheduled', count(*), NULL FROM jobs WHERE status = 'scheduled' GROUP BY queue
    UNION ALL
    SELECT queue, 'processing', count(*), NULL FROM jobs WHERE status = 'processing' GROUP BY queue
    UNION ALL
    SELECT queue, 'dead', count(*), NULL FROM jobs WHERE status = 'dead' GROUP BY queue
),
recent AS (
    SELECT queue,
           count(*) FILTER (WHERE outcome = 'completed')::int8 AS completed,
           count(*) FILTER (WHERE outcome IN ('retry', 'dead'))::int8 AS failed,
           percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - started_at)) AS p50,
           percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - started_at)) AS p95
    FROM job_attempts
    WHERE finished_at > now() - interval '60 seconds' AND queue IS NOT NULL
      AND outcome IN ('completed', 'retry', 'dead')
    GROUP BY queue
),
queues AS (
    SELECT queue FROM counts UNION SELECT queue FROM recent UNION SELECT queue FROM flow_queues
),
page AS (
    SELECT queue FROM queues WHERE queue > $1 ORDER BY queue LIMIT $2
)
SELECT q.queue,
       COALESCE(sum(c.n) FILTER (WHERE c.status = 'queued'), 0)::int8,
       COALESCE(sum(c.n) FILTER (WHERE c.status = 'scheduled'), 0)::int8,
       COALESCE(sum(c.n) FILTER (WHERE c.status = 'processing'), 0)::int8,
       COALESCE(sum(c.n) FILTER (WHERE c.status = 'dead'), 0)::int8,
       extract(epoch FROM max(c.oldest))::float8,
       COALESCE(max(r.completed), 0)::int8,
       COALESCE(max(r.failed), 0)::int8,
       max(r.p50)::float8,
       max(r.p95)::float8
FROM page q
LEFT JOIN counts c ON c.queue = q.queue
LEFT JOIN recent r ON r.queue = q.queue
GROUP BY q.queue
ORDER BY q.queue
