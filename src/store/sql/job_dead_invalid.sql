-- Records messages that cannot run as dead jobs with the reason, so nothing vanishes.
-- $1 worker id; $2 ids; $3 queues; $4 payloads; $5 reasons; $6 the batch each joins (version
-- 34, NULL for none: a dead member of it, batch_join.sql judged it).
INSERT INTO jobs (id, queue, payload, status, attempts, max_attempts, last_error, worker_id,
                  completed_at, batch)
SELECT id, queue, payload, 'dead', 0, 1, reason, $1, now(), batch
FROM unnest($2::text[], $3::text[], $4::jsonb[], $5::text[], $6::text[])
     AS t(id, queue, payload, reason, batch)
ON CONFLICT DO NOTHING
RETURNING id
