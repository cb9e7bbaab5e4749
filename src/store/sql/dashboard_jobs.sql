-- A page of jobs for the dashboard, in id order after $4 (keyset: the primary key orders and
-- bounds every page). $1 queue, $2 status, $3 text in the id or the last error (each NULL:
-- any); $4 the last id of the previous page ('' for the first); $5 page size.
SELECT id, queue, status, priority, attempts, max_attempts, worker_id, last_error,
       to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
FROM jobs
WHERE id > $4
  AND ($1::text IS NULL OR queue = $1)
  AND ($2::text IS NULL OR status = $2)
  AND ($3::text IS NULL OR strpos(id, $3) > 0 OR strpos(last_error, $3) > 0)
ORDER BY id
LIMIT $5
