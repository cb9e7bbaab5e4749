-- Start-up reconciliation: marks the given earlier incarnations of this host stopped and
-- takes back their `processing` jobs (reason `restarted`), like the reaper does.
-- $1 owner ids; $2 reason.
WITH gone AS (
    UPDATE workers SET stopped_at = now(), stop_reason = $2
    WHERE id = ANY($1::text[]) AND stopped_at IS NULL
),
victims AS (
    SELECT id, worker_id AS owner FROM jobs
    WHERE status = 'processing' AND worker_id = ANY($1::text[])
    FOR UPDATE SKIP LOCKED
)
-- (Its traceparent is for the recovery span, when traces are on.)
SELECT r.id, r.status, r.owner, r.queue,
       (SELECT traceparent FROM jobs WHERE id = r.id)
FROM reclaim_jobs(ARRAY(SELECT id FROM victims), $2::text) AS r
