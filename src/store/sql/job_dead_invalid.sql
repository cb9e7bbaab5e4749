-- Records messages that cannot run as dead jobs with the reason, so nothing vanishes.
-- $1 worker id; $2 ids; $3 queues; $4 payloads; $5 reasons.
INSERT INTO jobs (id, queue, payload, status, attempts, max_attempts, last_error, worker_id,
                  completed_at)
SELECT id, queue, payload, 'dead', 0, 1, reason, $1, now()
FROM unnest($2::text[], $3::text[], $4::jsonb[], $5::text[]) AS t(id, queue, payload, reason)
ON CONFLICT DO NOTHING
RETURNING id
