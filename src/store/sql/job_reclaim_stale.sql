-- The stale sweep: takes back `processing` jobs whose last activity (claim or progress
-- report) is older than their queue's stale_after — a hung handler in a live process.
-- $1 default stale_after (ms); $2 queues; $3 their stale_after (ms); $4 the smallest
-- stale_after (ms, lets the index do the work); $5 limit.
WITH victims AS (
    SELECT j.id, j.worker_id AS owner
    FROM jobs j LEFT JOIN unnest($2::text[], $3::int8[]) AS q(queue, stale_ms) ON q.queue = j.queue
    WHERE j.status = 'processing'
      AND j.last_activity_at < now() - $4::int8 * interval '1 millisecond'
      AND j.last_activity_at < now() - COALESCE(q.stale_ms, $1::int8) * interval '1 millisecond'
    LIMIT $5
    FOR UPDATE OF j SKIP LOCKED
)
SELECT id, status, owner, queue FROM reclaim_jobs(ARRAY(SELECT id FROM victims), 'stale'::text)
