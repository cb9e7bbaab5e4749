-- Scheduled jobs (delayed, retries waiting their backoff, due ones not yet published), soonest
-- first (index jobs_scheduled_due), a page after the key ($1 microseconds since the epoch of
-- the previous page's last due time, $2 its id; NULL, '' for the first page); $3 page size.
-- The last column is the next page's key.
SELECT id, queue, attempts, max_attempts, last_error,
       to_char(scheduled_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
       extract(epoch FROM scheduled_at - now())::float8,
       (extract(epoch FROM scheduled_at) * 1000000)::int8
FROM jobs
WHERE status = 'scheduled'
  AND ($1::int8 IS NULL
       OR (scheduled_at, id) > ('epoch'::timestamptz + $1::int8 * interval '1 microsecond', $2::text))
ORDER BY scheduled_at, id
LIMIT $3
