-- The running workers for the dashboard, a page in id order after $1 ('' for the first page;
-- the primary key orders and bounds it), $2 page size, each with its heartbeat age and the
-- jobs it holds now (counted for the page's workers only, index jobs_processing_owner).
WITH page AS (
    SELECT w.id, w.hostname, w.pid, w.version,
           extract(epoch FROM now() - w.started_at)::float8 AS up_s,
           extract(epoch FROM now() - w.heartbeat_at)::float8 AS beat_age_s,
           w.dead_after_ms,
           extract(epoch FROM now() - w.stopped_at)::float8 AS stopped_ago_s,
           w.stop_reason
    FROM workers w
    WHERE w.stopped_at IS NULL AND w.id > $1
    ORDER BY w.id
    LIMIT $2
)
SELECT p.*,
       (SELECT count(*) FROM jobs j WHERE j.status = 'processing' AND j.worker_id = p.id)::int8
FROM page p
ORDER BY p.id
