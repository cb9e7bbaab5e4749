-- Records late results: finished attempts a settle did not take because the job was taken
-- from this worker meanwhile (another owner, or a newer lease of ours). One job_attempt_log row
-- each, so "why did this job run twice?" is answered by the table.
-- $1 worker id; $2 ids; $3 leases; $4 attempt outcomes.
INSERT INTO job_attempt_log (job_id, lease, attempt, worker_id, outcome, error)
SELECT i.id, i.lease, 0, $1, 'lost_ownership',
       'late result (' || i.outcome || ') rejected: the job was taken from this worker'
FROM unnest($2::text[], $3::int8[], $4::text[]) AS i(id, lease, outcome)
JOIN jobs j ON j.id = i.id
WHERE j.id = ANY($2::text[]) AND (j.worker_id IS DISTINCT FROM $1 OR j.lease <> i.lease)
