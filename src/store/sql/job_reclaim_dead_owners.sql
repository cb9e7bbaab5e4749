-- The heartbeat reaper: declares dead the workers whose heartbeat is older than the
-- dead_after *they* declared, and takes back every job still `processing` under a stopped
-- or dead owner. A reclaimed job becomes `scheduled` now (the scheduler republishes it at
-- once), or `dead` when that attempt was its last: a crash costs an attempt. The owner is
-- cleared, so its late writes fail the fence.
-- $1 limit.
WITH dead AS (
    UPDATE workers SET stopped_at = now(), stop_reason = 'owner_dead'
    WHERE stopped_at IS NULL AND heartbeat_at < now() - dead_after_ms * interval '1 millisecond'
    RETURNING id
),
-- Owners whose jobs are orphaned: dead now, or stopped lately (a stopped worker's leftover
-- jobs are taken on the first pass; older ones are left to the stale sweep). Their list is
-- computed once, so only their jobs are read, not every running job.
victims AS (
    SELECT j.id, j.worker_id AS owner
    FROM jobs j
    WHERE j.status = 'processing'
      AND j.worker_id = ANY (ARRAY(
          SELECT id FROM dead
          UNION ALL
          SELECT id FROM workers
          WHERE stopped_at > now() - interval '1 day'
             OR (stopped_at IS NULL
                 AND heartbeat_at < now() - dead_after_ms * interval '1 millisecond')))
    LIMIT $1
    FOR UPDATE OF j SKIP LOCKED
)
-- (Its traceparent is for the recovery span, when traces are on.)
SELECT r.id, r.status, r.owner, r.queue,
       (SELECT traceparent FROM jobs WHERE id = r.id)
FROM reclaim_jobs(ARRAY(SELECT id FROM victims), 'owner_dead'::text) AS r
