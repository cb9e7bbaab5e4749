-- After a settle was retried (its first try's commit answer may have been lost): which of
-- these attempts did this worker settle already? Returns their positions (1-based) in the
-- batch, as job_settle.sql does. $1 worker id; $2 ids; $3 leases; $4 statuses they were
-- settled to.
SELECT i.n::int4
FROM jobs j JOIN unnest($2::text[], $3::int8[], $4::text[]) WITH ORDINALITY AS i(id, lease, status, n)
     ON i.id = j.id
WHERE j.id = ANY($2::text[]) AND j.worker_id = $1 AND j.lease = i.lease AND j.status = i.status
