-- The attempts of one job, in the order they ended. $1 id.
SELECT attempt, lease, worker_id,
       to_char(started_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
       (extract(epoch FROM finished_at - started_at) * 1000)::int8, outcome, error
FROM job_attempts WHERE job_id = $1 ORDER BY finished_at, id
