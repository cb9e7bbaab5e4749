-- The stale sweep: takes back `processing` jobs past the stale deadline their owner declared
-- (claim or last progress report + the queue's stale_after, as the owning pod set it) — a
-- hung handler in a live process. Any pod may sweep; none judges by its own settings —
-- except for jobs claimed by a version before schema 3 (no deadline stored: a rolling
-- upgrade), which are judged by their last activity and the sweeping pod's stale_after.
-- $1 limit; $2 stale_after (ms) for jobs without a deadline.
WITH victims AS (
    SELECT j.id
    FROM jobs j
    WHERE j.status = 'processing'
      AND (j.stale_at < now()
           OR (j.stale_at IS NULL
               AND j.last_activity_at < now() - $2::int8 * interval '1 millisecond'))
    LIMIT $1
    FOR UPDATE OF j SKIP LOCKED
)
-- (Its traceparent is for the recovery span, when traces are on.)
SELECT r.id, r.status, r.owner, r.queue,
       (SELECT traceparent FROM jobs WHERE id = r.id)
FROM reclaim_jobs(ARRAY(SELECT id FROM victims), 'stale'::text) AS r
