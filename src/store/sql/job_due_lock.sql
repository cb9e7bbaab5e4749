-- The scheduler's share of due jobs: locked so other pods' schedulers skip them.
-- $1 limit.
SELECT id, queue, payload, priority, max_attempts, timeout_ms, generation + 1 AS generation
FROM jobs
WHERE status = 'scheduled' AND scheduled_at <= now()
ORDER BY scheduled_at
LIMIT $1
FOR UPDATE SKIP LOCKED
