-- The completed_at of queue $1's $2-th newest finished job (completed, cancelled or dead),
-- as text: older finished jobs of the queue are over its keep_count. No row: it has $2 or fewer.
SELECT completed_at::text FROM jobs
WHERE queue = $1 AND status IN ('completed', 'cancelled', 'dead') AND completed_at IS NOT NULL
ORDER BY completed_at DESC
OFFSET $2::int8 - 1 LIMIT 1
