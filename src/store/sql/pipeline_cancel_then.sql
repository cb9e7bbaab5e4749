-- Before a pipeline is cancelled: the `then` jobs its completed jobs have not created yet
-- never will be. The row locks wait out a chain round in flight (it holds them); a round that
-- created them meanwhile leaves them to the cancel that follows. $1 any job of the pipeline.
WITH root AS (
    SELECT COALESCE(pipeline, id) AS pipeline FROM jobs WHERE id = $1
)
UPDATE jobs j
SET then_jobs = NULL
FROM root r
WHERE (j.pipeline = r.pipeline OR j.id = r.pipeline)
  AND j.status = 'completed' AND j.chain_pending AND j.then_jobs IS NOT NULL
