-- A page of one job's attempts for the dashboard, in the order they were recorded (index
-- job_attempts_job), after the attempt row $2 (0 for the first page); $1 the job's id, $3 page
-- size. The first column is the next page's key.
SELECT id, attempt, lease, worker_id,
       to_char(started_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
       (extract(epoch FROM finished_at - started_at) * 1000)::int8, outcome, error
FROM job_attempts
WHERE job_id = $1 AND id > $2
ORDER BY id
LIMIT $3
