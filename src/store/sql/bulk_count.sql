-- How many jobs a bulk action's filter matches (bulk_match.sql's filter).
-- $1 status; $2 queue or NULL; $3, $4 enqueued from, before (seconds since the epoch) or
-- NULL; $5 text in the id or the last error, or NULL.
SELECT count(*)
FROM jobs
WHERE status = $1 AND ($2::text IS NULL OR queue = $2)
  AND ($3::float8 IS NULL OR created_at >= to_timestamp($3::float8))
  AND ($4::float8 IS NULL OR created_at < to_timestamp($4::float8))
  AND ($5::text IS NULL OR strpos(id, $5) > 0 OR strpos(last_error, $5) > 0)
