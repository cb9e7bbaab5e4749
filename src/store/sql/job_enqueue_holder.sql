-- An enqueue found its id or its (queue, idempotency key) taken: the job that holds it, the
-- one with the id first. $1 id; $2 queue; $3 idempotency key; $4 the enqueue's payload.
SELECT id, status, generation, payload = $4 FROM jobs
WHERE id = $1 OR (queue = $2 AND idempotency_key = $3)
ORDER BY (id = $1) DESC LIMIT 1
