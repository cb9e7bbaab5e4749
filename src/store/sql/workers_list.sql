-- Workers for `jobwarden workers` and the dashboard: the running ones (or, with $1, every one
-- that ever ran), newest first, with heartbeat age and the jobs each holds now (index
-- jobs_processing_owner). $1 include stopped; $2 limit; $3 one worker's id (NULL: any).
SELECT w.id, w.hostname, w.pid, w.version,
       extract(epoch FROM now() - w.started_at)::float8 AS up_s,
       extract(epoch FROM now() - w.heartbeat_at)::float8 AS beat_age_s,
       w.dead_after_ms,
       extract(epoch FROM now() - w.stopped_at)::float8 AS stopped_ago_s,
       w.stop_reason,
       (SELECT count(*) FROM jobs j WHERE j.status = 'processing' AND j.worker_id = w.id)::int8
FROM workers w
WHERE ($1 OR w.stopped_at IS NULL) AND ($3::text IS NULL OR w.id = $3)
ORDER BY w.started_at DESC
LIMIT $2
