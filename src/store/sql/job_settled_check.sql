-- After a settle was retried (its first try's commit answer may have been lost): which of
-- these attempts did this worker settle already? $1 worker id; $2 ids; $3 leases;
-- $4 statuses they were settled to.
SELECT j.id
FROM jobs j JOIN unnest($2::text[], $3::int8[], $4::text[]) AS i(id, lease, status) ON i.id = j.id
WHERE j.id = ANY($2::text[]) AND j.worker_id = $1 AND j.lease = i.lease AND j.status = i.status
