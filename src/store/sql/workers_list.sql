-- Workers for `jobwarden workers` and the dashboard: the running ones (or, with $1, every one
-- that ever ran), newest first, with heartbeat age and the jobs each holds now (counted in
-- one pass over the running jobs, index jobs_processing_stale). $1 include stopped; $2 limit;
-- $3 one worker's id (NULL: any).
SELECT w.id, w.hostname, w.pid, w.version,
       extract(epoch FROM now() - w.started_at)::float8 AS up_s,
       extract(epoch FROM now() - w.heartbeat_at)::float8 AS beat_age_s,
       w.dead_after_ms,
       extract(epoch FROM now() - w.stopped_at)::float8 AS stopped_ago_s,
       w.stop_reason,
       COALESCE(held.n, 0)::int8
FROM workers w
LEFT JOIN (SELECT worker_id, count(*) AS n FROM jobs WHERE status = 'processing'
           GROUP BY worker_id) held ON held.worker_id = w.id
WHERE ($1 OR w.stopped_at IS NULL) AND ($3::text IS NULL OR w.id = $3)
ORDER BY w.started_at DESC
LIMIT $2
