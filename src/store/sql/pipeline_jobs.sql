-- A pipeline: every job that carries the pipeline of job $1 (or $1 itself), oldest first,
-- each with its parents and the number of `then` jobs it will create when it completes.
WITH root AS (
    SELECT COALESCE(pipeline, id) AS pipeline FROM jobs WHERE id = $1
)
SELECT j.id, j.queue, j.status, j.attempts, j.max_attempts, j.last_error,
       COALESCE((SELECT array_agg(d.parent ORDER BY d.parent) FROM job_deps d WHERE d.child = j.id),
                '{}') AS parents,
       CASE WHEN j.then_jobs IS NOT NULL
                 AND j.status IN ('waiting', 'queued', 'scheduled', 'processing')
            THEN jsonb_array_length(j.then_jobs) ELSE 0 END AS pending_then,
       to_char(j.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
       to_char(j.completed_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
FROM jobs j, root r
WHERE j.pipeline = r.pipeline OR j.id = r.pipeline OR j.id = $1
ORDER BY j.created_at, j.id
