-- Claims a batch of delivered messages in one statement.
-- A message whose job has no row yet creates it already claimed (or `scheduled` when its
-- run_at is in the future); a row that is queued, or scheduled and due, is claimed by bumping
-- its lease. Every other row is reported with its status (and queue: an id that belongs to
-- another queue's job is not this message's job) so the caller can ack and drop.
-- $1 worker id; $2.. one array per column of the batch. Every lookup also says
-- `j.id = ANY($2)`, so the generic plan reads the primary key instead of joining the whole
-- table against the batch.
WITH input AS (
    SELECT *
    FROM unnest($2::text[], $3::text[], $4::jsonb[], $5::int2[], $6::int4[], $7::int4[],
                $8::text[], $9::int8[], $10::jsonb[], $11::text[])
         AS t(id, queue, payload, priority, max_attempts, timeout_ms, idempotency_key, run_at_ms,
              backoff, traceparent)
),
inserted AS (
    INSERT INTO jobs AS j (id, queue, payload, priority, max_attempts, timeout_ms, idempotency_key,
                      backoff, traceparent, status, attempts, worker_id, lease, started_at, last_activity_at, scheduled_at)
    SELECT i.id, i.queue, i.payload, i.priority, i.max_attempts, i.timeout_ms, i.idempotency_key,
           i.backoff, i.traceparent,
           CASE WHEN i.run_at_ms IS NOT NULL AND to_timestamp(i.run_at_ms / 1000.0) > now()
                THEN 'scheduled' ELSE 'processing' END,
           CASE WHEN i.run_at_ms IS NOT NULL AND to_timestamp(i.run_at_ms / 1000.0) > now()
                THEN 0 ELSE 1 END,
           $1, 1, now(), now(),
           GREATEST(now(), COALESCE(to_timestamp(i.run_at_ms / 1000.0), now()))
    FROM input i
    ON CONFLICT DO NOTHING
    RETURNING j.id, j.status, j.attempts, j.max_attempts, j.lease, j.timeout_ms, j.queue, j.backoff,
              j.traceparent
),
claimed AS (
    UPDATE jobs j
    SET status = 'processing', attempts = j.attempts + 1, worker_id = $1, lease = j.lease + 1,
        started_at = now(), last_activity_at = now(), stage = NULL, progress = NULL,
        message = NULL, updated_at = now(), traceparent = COALESCE(j.traceparent, i.traceparent)
    FROM input i
    WHERE j.id = ANY($2::text[]) AND j.id = i.id AND j.queue = i.queue
      AND (j.status = 'queued' OR (j.status = 'scheduled' AND j.scheduled_at <= now()))
    RETURNING j.id, j.status, j.attempts, j.max_attempts, j.lease, j.timeout_ms, j.payload, j.queue,
              j.backoff, j.traceparent
)
SELECT id, status, attempts, max_attempts, lease, timeout_ms, NULL::jsonb AS payload, true AS fresh,
       queue, backoff, traceparent
FROM inserted
UNION ALL
SELECT id, status, attempts, max_attempts, lease, timeout_ms, payload, false, queue, backoff,
       traceparent
FROM claimed
UNION ALL
SELECT j.id, j.status, j.attempts, j.max_attempts, j.lease, j.timeout_ms, NULL::jsonb, false,
       j.queue, NULL::jsonb, NULL::text
FROM jobs j JOIN input i ON i.id = j.id
WHERE j.id = ANY($2::text[]) AND j.id NOT IN (SELECT id FROM claimed)
