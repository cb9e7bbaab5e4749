-- Claims a batch of delivered messages in one statement.
-- A message whose job has no row yet creates it already claimed (or `scheduled` when its
-- run_at is in the future); a row that is queued, or scheduled and due, is claimed by bumping
-- its lease. Every other row is reported with its status (and queue: an id that belongs to
-- another queue's job is not this message's job) so the caller can ack and drop.
-- Nothing is claimed unless the worker is registered and not stopped: a worker that others
-- declared dead must register again first (its `alive` column says so). Nothing is claimed
-- or inserted of a paused queue (`queue_pauses`; the batch is one queue's) either: the last
-- column, `paused`, says so, and the caller hands the messages back to the stream.
-- Each answer row carries the input's position (`idx`), and `same_payload` says whether an
-- existing row holds the message's payload (a message that lands on another job's id with
-- another payload is a conflict the caller must keep visible).
-- $1 worker id; $2 the queue's stale_after (ms) as this worker declares it; $3.. one array
-- per column of the batch. The lookups of existing rows take only the ids the insert did not
-- (`others`, an array: empty for a batch of new jobs, the common case), so the generic plan
-- reads the primary key for just those instead of joining the table against the batch.
WITH input AS (
    SELECT *
    FROM unnest($3::text[], $4::text[], $5::jsonb[], $6::int2[], $7::int4[], $8::int4[],
                $9::text[], $10::int8[], $11::jsonb[], $12::text[], $13::jsonb[]) WITH ORDINALITY
         AS t(id, queue, payload, priority, max_attempts, timeout_ms, idempotency_key, run_at_ms,
              backoff, traceparent, then_jobs, idx)
),
me AS (
    SELECT EXISTS (SELECT 1 FROM workers WHERE id = $1 AND stopped_at IS NULL) AS alive,
           EXISTS (SELECT 1 FROM queue_pauses WHERE queue = ($4::text[])[1]) AS paused
),
inserted AS (
    INSERT INTO jobs AS j (id, queue, payload, priority, max_attempts, timeout_ms, idempotency_key,
                      backoff, traceparent, then_jobs, status, attempts, worker_id, lease, started_at,
                      last_activity_at, stale_at, scheduled_at)
    SELECT i.id, i.queue, i.payload, i.priority, i.max_attempts, i.timeout_ms, i.idempotency_key,
           i.backoff, i.traceparent, i.then_jobs,
           CASE WHEN i.run_at_ms IS NOT NULL AND to_timestamp(i.run_at_ms / 1000.0) > now()
                THEN 'scheduled' ELSE 'processing' END,
           CASE WHEN i.run_at_ms IS NOT NULL AND to_timestamp(i.run_at_ms / 1000.0) > now()
                THEN 0 ELSE 1 END,
           $1, 1, now(), now(), now() + $2::int8 * interval '1 millisecond',
           GREATEST(now(), COALESCE(to_timestamp(i.run_at_ms / 1000.0), now()))
    FROM input i
    WHERE (SELECT alive AND NOT paused FROM me)
    ON CONFLICT DO NOTHING
    RETURNING j.id, j.status, j.attempts, j.max_attempts, j.lease, j.timeout_ms, j.queue, j.backoff,
              j.traceparent
),
others AS (
    SELECT ARRAY(SELECT id FROM input WHERE id NOT IN (SELECT id FROM inserted)) AS ids
),
claimed AS (
    UPDATE jobs j
    SET status = 'processing', attempts = j.attempts + 1, worker_id = $1, lease = j.lease + 1,
        started_at = now(), last_activity_at = now(),
        stale_at = now() + $2::int8 * interval '1 millisecond', stage = NULL, progress = NULL,
        message = NULL, updated_at = now(), traceparent = COALESCE(j.traceparent, i.traceparent)
    FROM input i
    WHERE (SELECT alive AND NOT paused FROM me) AND j.id = ANY((SELECT ids FROM others)::text[]) AND j.id = i.id
      AND j.queue = i.queue
      AND (j.status = 'queued' OR (j.status = 'scheduled' AND j.scheduled_at <= now()))
    RETURNING j.id, j.status, j.attempts, j.max_attempts, j.lease, j.timeout_ms, j.payload, j.queue,
              j.backoff, j.traceparent, j.payload = i.payload AS same_payload
),
answer AS (
    SELECT id, status, attempts, max_attempts, lease, timeout_ms, NULL::jsonb AS payload,
           true AS fresh, queue, backoff, traceparent, true AS same_payload
    FROM inserted
    UNION ALL
    SELECT id, status, attempts, max_attempts, lease, timeout_ms, payload, false, queue, backoff,
           traceparent, same_payload
    FROM claimed
    UNION ALL
    SELECT j.id, j.status, j.attempts, j.max_attempts, j.lease, j.timeout_ms, NULL::jsonb, false,
           j.queue, NULL::jsonb, NULL::text, j.payload = i.payload
    FROM jobs j JOIN input i ON i.id = j.id
    WHERE j.id = ANY((SELECT ids FROM others)::text[]) AND j.id NOT IN (SELECT id FROM claimed)
)
SELECT i.idx, (SELECT alive FROM me), a.id IS NOT NULL AS found, a.status, a.attempts, a.max_attempts, a.lease,
       a.timeout_ms, a.payload, a.fresh, a.queue, a.backoff, a.traceparent, a.same_payload,
       (SELECT paused FROM me)
FROM input i LEFT JOIN answer a ON a.id = i.id
