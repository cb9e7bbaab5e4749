-- Scheduled jobs (delayed, retries waiting their backoff, due ones not yet published), soonest
-- first (index jobs_scheduled_due).
SELECT id, queue, attempts, max_attempts, last_error,
       to_char(scheduled_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
       extract(epoch FROM scheduled_at - now())::float8
FROM jobs
WHERE status = 'scheduled'
ORDER BY scheduled_at
LIMIT $1
