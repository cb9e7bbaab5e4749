-- A pipeline, a page at a time (the dashboard's pages; `jobwarden jobs pipeline` asks for all
-- of it): the jobs that carry the pipeline of job $1 (or are it), oldest first (index
-- jobs_pipeline), after the key ($2 microseconds since the epoch of the previous page's
-- last creation time, $3 its id; NULL, '' for the first page); $4 page size. Each with its
-- parents and the number of `then` jobs it will create; column 11 is the next page's key,
-- column 12 the job's result (what it passes down the chain).
WITH root AS (
    SELECT COALESCE(pipeline, id) AS pipeline FROM jobs WHERE id = $1
)
SELECT j.id, j.queue, j.status, j.attempts, j.max_attempts, j.last_error,
       COALESCE((SELECT array_agg(d.parent ORDER BY d.parent) FROM job_deps d WHERE d.child = j.id),
                '{}') AS parents,
       CASE WHEN j.then_jobs IS NOT NULL
                 AND j.status IN ('waiting', 'queued', 'scheduled', 'processing', 'awaiting')
            THEN jsonb_array_length(j.then_jobs) ELSE 0 END AS pending_then,
       to_char(j.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
       to_char(j.completed_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
       (extract(epoch FROM j.created_at) * 1000000)::int8, j.result
FROM jobs j, root r
WHERE (j.pipeline = r.pipeline OR j.id = r.pipeline OR j.id = $1)
  AND ($2::int8 IS NULL
       OR (j.created_at, j.id) > ('epoch'::timestamptz + $2::int8 * interval '1 microsecond', $3::text))
ORDER BY j.created_at, j.id
LIMIT $4
