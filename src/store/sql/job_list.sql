-- Jobs newest first, filtered by queue, status and/or key; the columns of job_get.sql.
-- $1 queue or NULL; $2 status or NULL; $3 limit; $4 key or NULL.
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
WHERE ($1::text IS NULL OR queue = $1) AND ($2::text IS NULL OR status = $2)
  AND ($4::text IS NULL OR key = $4)
ORDER BY created_at DESC, id LIMIT $3
