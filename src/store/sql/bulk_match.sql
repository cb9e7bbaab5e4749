-- The next batch of a bulk action: ids of jobs its filter matches (bulk_count.sql's), at
-- most $6. The action moves each out of the filter's status (cancelled, retried, deleted),
-- so the next batch reads the next ones.
-- $1 status; $2 queue or NULL; $3, $4 enqueued from, before (seconds since the epoch) or
-- NULL; $5 text in the id or the last error, or NULL; $6 limit.
SELECT id
FROM jobs
WHERE status = $1 AND ($2::text IS NULL OR queue = $2)
  AND ($3::float8 IS NULL OR created_at >= to_timestamp($3::float8))
  AND ($4::float8 IS NULL OR created_at < to_timestamp($4::float8))
  AND ($5::text IS NULL OR strpos(id, $5) > 0 OR strpos(last_error, $5) > 0)
LIMIT $6
