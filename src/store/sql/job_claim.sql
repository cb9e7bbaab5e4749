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
-- Expiry (version 18): a job past its expiry is never claimed. A message's new row is inserted
-- ended (`cancelled`, last_error `expired: not started by <instant>`); an existing queued or
-- due row is ended so in the same statement (`expired`); the last column, `expired`, tells
-- the caller, which acks the message. A message's new row that its throttle ended at once
-- (version 23: `cancelled`, gated_by the job holding the window) says so in the last
-- column, `throttled`, and is not `expired`. A row without an expiry of its own takes the queue's
-- default as this worker declares it ($15), counted from its created_at, at its first claim.
-- A claimed existing row also returns its parents' results (version 28, the last column).
-- $1 worker id; $2 the queue's stale_after (ms) as this worker declares it; $3.. one array
-- per column of the batch; $14 the expiries (Unix ms, NULL for none); $15 the queue's
-- expire_after (ms, NULL for none); $16 the keys (version 20, NULL for none); $17 what gates
-- each job (`jobs.gate`, version 23, NULL for none, the common case: the gate trigger then
-- does not fire; else it decides whether the row runs, waits as debounced or ends throttled).
-- $18 the batch each job joins (version 34, NULL for none; batch_join.sql judged them).
-- A key is stored with the row a message creates; an existing row keeps its own. The lookups of existing rows take only the ids the insert did not
-- (`others`, an array: empty for a batch of new jobs, the common case), so the generic plan
-- reads the primary key for just those instead of joining the table against the batch.
WITH input AS (
    SELECT *
    FROM unnest($3::text[], $4::text[], $5::jsonb[], $6::int2[], $7::int4[], $8::int4[],
                $9::text[], $10::int8[], $11::jsonb[], $12::text[], $13::jsonb[], $14::int8[],
                $16::text[], $17::jsonb[], $18::text[])
         WITH ORDINALITY
         AS t(id, queue, payload, priority, max_attempts, timeout_ms, idempotency_key, run_at_ms,
              backoff, traceparent, then_jobs, expires_at_ms, key, gate, batch, idx)
),
me AS (
    SELECT EXISTS (SELECT 1 FROM workers WHERE id = $1 AND stopped_at IS NULL) AS alive,
           EXISTS (SELECT 1 FROM queue_pauses WHERE queue = ($4::text[])[1]) AS paused
),
inserted AS (
    INSERT INTO jobs AS j (id, queue, payload, priority, max_attempts, timeout_ms, idempotency_key,
                      backoff, traceparent, then_jobs, key, status, attempts, worker_id, lease,
                      started_at, last_activity_at, stale_at, scheduled_at, expires_at, last_error,
                      completed_at, gate, batch)
    SELECT i.id, i.queue, i.payload, i.priority, i.max_attempts, i.timeout_ms, i.idempotency_key,
           i.backoff, i.traceparent, i.then_jobs, i.key,
           CASE WHEN x.expired THEN 'cancelled'
                WHEN i.run_at_ms IS NOT NULL AND to_timestamp(i.run_at_ms / 1000.0) > now()
                THEN 'scheduled' ELSE 'processing' END,
           CASE WHEN x.expired OR (i.run_at_ms IS NOT NULL AND to_timestamp(i.run_at_ms / 1000.0) > now())
                THEN 0 ELSE 1 END,
           CASE WHEN x.expired THEN NULL ELSE $1 END, 1,
           CASE WHEN x.expired THEN NULL ELSE now() END, now(),
           now() + $2::int8 * interval '1 millisecond',
           GREATEST(now(), COALESCE(to_timestamp(i.run_at_ms / 1000.0), now())), x.expires_at,
           CASE WHEN x.expired THEN job_expired_reason(x.expires_at) END,
           CASE WHEN x.expired THEN now() END, i.gate, i.batch
    FROM input i
         CROSS JOIN LATERAL (SELECT to_timestamp(i.expires_at_ms / 1000.0) AS expires_at,
                                    to_timestamp(i.expires_at_ms / 1000.0) <= now() IS TRUE AS expired) x
    WHERE (SELECT alive AND NOT paused FROM me)
    ON CONFLICT DO NOTHING
    RETURNING j.id, j.status, j.attempts, j.max_attempts, j.lease, j.timeout_ms, j.queue, j.backoff,
              j.traceparent, j.status = 'cancelled' AND j.gated_by IS NOT NULL AS throttled
),
others AS (
    SELECT ARRAY(SELECT id FROM input WHERE id NOT IN (SELECT id FROM inserted)) AS ids
),
expired AS (
    UPDATE jobs j
    SET status = 'cancelled', completed_at = now(), updated_at = now(),
        expires_at = COALESCE(j.expires_at, j.created_at + $15::int8 * interval '1 millisecond'),
        last_error = job_expired_reason(
            COALESCE(j.expires_at, j.created_at + $15::int8 * interval '1 millisecond')),
        -- Its dependents are cancelled by the scheduler's chain round (as an operator's cancel).
        chain_pending = j.has_dependents
    FROM input i
    WHERE (SELECT alive AND NOT paused FROM me) AND j.id = ANY((SELECT ids FROM others)::text[]) AND j.id = i.id
      AND j.queue = i.queue
      AND (j.status = 'queued' OR (j.status = 'scheduled' AND j.scheduled_at <= now()))
      AND COALESCE(j.expires_at, j.created_at + $15::int8 * interval '1 millisecond') <= now()
    RETURNING j.id, j.status, j.attempts, j.max_attempts, j.lease, j.timeout_ms, j.queue,
              j.payload = i.payload AS same_payload
),
claimed AS (
    UPDATE jobs j
    SET status = 'processing', attempts = j.attempts + 1, worker_id = $1, lease = j.lease + 1,
        started_at = now(), last_activity_at = now(),
        stale_at = now() + $2::int8 * interval '1 millisecond', stage = NULL, progress = NULL,
        message = NULL, updated_at = now(), traceparent = COALESCE(j.traceparent, i.traceparent),
        expires_at = COALESCE(j.expires_at, j.created_at + $15::int8 * interval '1 millisecond')
    FROM input i
    WHERE (SELECT alive AND NOT paused FROM me) AND j.id = ANY((SELECT ids FROM others)::text[]) AND j.id = i.id
      AND j.queue = i.queue
      AND (j.status = 'queued' OR (j.status = 'scheduled' AND j.scheduled_at <= now()))
      AND (COALESCE(j.expires_at, j.created_at + $15::int8 * interval '1 millisecond') > now()) IS NOT FALSE
    RETURNING j.id, j.status, j.attempts, j.max_attempts, j.lease, j.timeout_ms, j.payload, j.queue,
              j.backoff, j.traceparent, j.payload = i.payload AS same_payload, j.parent_results
),
answer AS (
    SELECT id, status, attempts, max_attempts, lease, timeout_ms, NULL::jsonb AS payload,
           true AS fresh, queue, backoff, traceparent, true AS same_payload,
           status = 'cancelled' AND NOT throttled AS expired, throttled,
           NULL::jsonb AS parent_results
    FROM inserted
    UNION ALL
    SELECT id, status, attempts, max_attempts, lease, timeout_ms, payload, false, queue, backoff,
           traceparent, same_payload, false, false, parent_results
    FROM claimed
    UNION ALL
    SELECT id, status, attempts, max_attempts, lease, timeout_ms, NULL::jsonb, false, queue,
           NULL::jsonb, NULL::text, same_payload, true, false, NULL::jsonb
    FROM expired
    UNION ALL
    SELECT j.id, j.status, j.attempts, j.max_attempts, j.lease, j.timeout_ms, NULL::jsonb, false,
           j.queue, NULL::jsonb, NULL::text, j.payload = i.payload, false, false, NULL::jsonb
    FROM jobs j JOIN input i ON i.id = j.id
    WHERE j.id = ANY((SELECT ids FROM others)::text[]) AND j.id NOT IN (SELECT id FROM claimed)
      AND j.id NOT IN (SELECT id FROM expired)
)
SELECT i.idx, (SELECT alive FROM me), a.id IS NOT NULL AS found, a.status, a.attempts, a.max_attempts, a.lease,
       a.timeout_ms, a.payload, a.fresh, a.queue, a.backoff, a.traceparent, a.same_payload,
       (SELECT paused FROM me), a.expired, a.throttled, a.parent_results
FROM input i LEFT JOIN answer a ON a.id = i.id
