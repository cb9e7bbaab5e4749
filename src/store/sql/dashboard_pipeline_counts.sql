-- How many jobs of the pipeline of job $1 (or it) are in each status (index jobs_pipeline).
WITH root AS (
    SELECT COALESCE(pipeline, id) AS pipeline FROM jobs WHERE id = $1
)
SELECT j.status, count(*)::int8
FROM jobs j, root r
WHERE j.pipeline = r.pipeline OR j.id = r.pipeline OR j.id = $1
GROUP BY j.status
ORDER BY j.status
