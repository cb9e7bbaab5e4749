-- The scheduler's share of due jobs: locked so other pods' schedulers skip them.
-- $1 limit. (Its traceparent is for the publish's span, when traces are on.)
SELECT id, queue, payload, priority, max_attempts, timeout_ms, generation + 1 AS generation,
       traceparent, attempts
FROM jobs
WHERE status = 'scheduled' AND scheduled_at <= now()
ORDER BY scheduled_at
LIMIT $1
FOR UPDATE SKIP LOCKED
