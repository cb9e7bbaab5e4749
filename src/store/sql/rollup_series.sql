-- The dashboard's charts: per queue and minute (or hour), jobs completed, attempts failed
-- (retried or dead), and the median and 95th percentile of the wait before a job's last
-- attempt (seconds), from the rollup plus the live tail after its mark. Only the queues of
-- one page (name order after $3, $4 of them) that did anything since $2.
-- $1 'minute' or 'hour'; $2 since (seconds since the epoch); $3 after; $4 limit.
WITH mark AS (
    SELECT upto FROM rollup_mark
),
parts AS (
    SELECT r.queue, date_trunc($1, r.bucket) AS at, r.completed, r.retried + r.dead AS failed,
           r.wait_hist
    FROM job_rollup r
    WHERE r.bucket >= date_trunc($1, to_timestamp($2::float8)) AND r.queue > $3
    UNION ALL
    SELECT e.queue, date_trunc($1, e.at),
           count(*) FILTER (WHERE e.what = 'completed'),
           count(*) FILTER (WHERE e.what IN ('retried', 'dead')),
           rollup_hist(e.wait_ms)
    FROM mark, job_ends(greatest(mark.upto, to_timestamp($2::float8)), 'infinity') e
    WHERE e.queue > $3
    GROUP BY 1, 2
),
page AS (
    SELECT DISTINCT queue FROM parts ORDER BY queue LIMIT $4
)
SELECT p.queue, extract(epoch FROM p.at)::float8, sum(p.completed)::int8, sum(p.failed)::int8,
       rollup_quantile(rollup_sum(p.wait_hist), 0.5),
       rollup_quantile(rollup_sum(p.wait_hist), 0.95)
FROM parts p JOIN page USING (queue)
GROUP BY p.queue, p.at
ORDER BY p.queue, p.at
