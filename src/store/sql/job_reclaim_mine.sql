-- A worker gives back jobs the database says it owns but that no longer run in it (it
-- stopped them when it fenced itself off). Like any reclaim the attempt counts: a job at
-- its last attempt becomes dead. Fenced by lease.
-- $1 worker id; $2 ids; $3 leases.
WITH victims AS (
    SELECT j.id
    FROM jobs j JOIN unnest($2::text[], $3::int8[]) AS i(id, lease) ON i.id = j.id
    WHERE j.id = ANY($2::text[]) AND j.worker_id = $1 AND j.lease = i.lease
      AND j.status = 'processing'
    FOR UPDATE OF j SKIP LOCKED
)
-- (Its traceparent is for the recovery span, when traces are on.)
SELECT r.id, r.status, r.owner, r.queue,
       (SELECT traceparent FROM jobs WHERE id = r.id)
FROM reclaim_jobs(ARRAY(SELECT id FROM victims), 'self_fenced'::text) AS r
