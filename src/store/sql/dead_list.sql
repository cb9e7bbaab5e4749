-- The dead-letter queue, the most recently dead first (a job enqueued days ago that used
-- up its retries just now is on top); the columns of job_get.sql.
-- $1 queue or NULL; $2 limit.
SELECT id, queue, status, priority, attempts, max_attempts, worker_id, lease,
       stage, progress, message, last_error, payload, result, idempotency_key,
       to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
       to_char(scheduled_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
       to_char(started_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
       to_char(last_activity_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
       to_char(completed_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'), pipeline,
       to_char(expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'), key,
       to_char(await_until AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'), batch
FROM jobs
WHERE status = 'dead' AND ($1::text IS NULL OR queue = $1)
ORDER BY completed_at DESC NULLS LAST, id LIMIT $2
