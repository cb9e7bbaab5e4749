-- A keyed queue's intake (schema version 21): parks the jobs of a batch of delivered
-- messages in PostgreSQL, where the queue's slots take them (`job_take()`) within their
-- keys' limits and in turn order; the caller acks the messages once this commits.
-- A message whose job has no row yet creates it `queued` and parked (or `scheduled` when
-- its run_at is in the future, or ended `cancelled` when it expired before it came); a row
-- that is queued and not parked (published again by the scheduler: a retry, a release), or
-- scheduled and due, is parked. Every other row is reported with its status, as the claim
-- (`job_claim.sql`) reports it, and the answer has the claim's columns, so the caller reads
-- both alike: nothing here is ever `processing`.
-- Nothing is parked or inserted unless the worker is registered and not stopped, nor of a
-- paused queue (the messages go back to the stream, as with a claim).
-- A parked job's turn: the message's stream sequence ($18), publish order; with fair turns
-- ($17) none: job_take() counts each key's turns from its row in job_keys (its next turn,
-- `head_turn`, from the later of its last turn and the queue's clock when it had nothing
-- parked). A job parked again keeps its place in its key's order (`seq`, the sequence of the
-- message that first parked it): a retry keeps its place. Each key's row in job_keys is locked
-- (in key order) and its hint lowered to this batch's first job, so a take that visits the
-- key waits for this commit.
-- $1 worker id; $2 (unused: the claim's stale_after); $3..$14 one array per column, as the
-- claim's; $15 the queue's expire_after (ms, NULL for none); $16 the keys; $17 fair turns;
-- $18 the messages' stream sequences; $19 what gates each job (`jobs.gate`, version 23, NULL
-- for none: see job_claim.sql; a debounced job is inserted `scheduled`, not parked, and
-- parked when it is due and published; a throttled one ends at once); $20 the batch each
-- job joins (version 34, NULL for none).
WITH input AS (
    SELECT t.*, x.k, COALESCE(t.seq, 0)::float8 AS s
    FROM unnest($3::text[], $4::text[], $5::jsonb[], $6::int2[], $7::int4[], $8::int4[],
                $9::text[], $10::int8[], $11::jsonb[], $12::text[], $13::jsonb[], $14::int8[],
                $16::text[], $18::int8[], $19::jsonb[], $20::text[])
         WITH ORDINALITY
         AS t(id, queue, payload, priority, max_attempts, timeout_ms, idempotency_key, run_at_ms,
              backoff, traceparent, then_jobs, expires_at_ms, key, seq, gate, batch, idx)
         -- The key a job is parked under: its row's, when it has one (a message republished
         -- from the row may carry none), else the message's.
         CROSS JOIN LATERAL (
             SELECT COALESCE((SELECT j.key FROM jobs j WHERE j.id = t.id), t.key, '') AS k) x
),
me AS (
    SELECT EXISTS (SELECT 1 FROM workers WHERE id = $1 AND stopped_at IS NULL) AS alive,
           EXISTS (SELECT 1 FROM queue_pauses WHERE queue = ($4::text[])[1]) AS paused,
           COALESCE((SELECT vturn FROM flow_queues WHERE queue = ($4::text[])[1]), 0) AS clock,
           $2::int8 AS unused
),
per_key AS (
    SELECT i.k, min(i.priority) AS priority, min(i.s) AS first_seq, max(i.s) AS last_seq
    FROM input i
    WHERE (SELECT alive AND NOT paused FROM me)
    GROUP BY i.k
),
keyed AS (
    INSERT INTO job_keys AS jk (queue, key, head_priority, head_turn, last_turn)
    SELECT ($4::text[])[1], p.k, p.priority,
           CASE WHEN $17::bool THEN (SELECT clock FROM me) ELSE p.first_seq END,
           CASE WHEN $17::bool THEN (SELECT clock FROM me) ELSE p.last_seq END
    FROM per_key p
    ORDER BY p.k
    ON CONFLICT (queue, key) DO UPDATE
    SET last_turn = CASE WHEN $17::bool THEN jk.last_turn
                         ELSE greatest(jk.last_turn, EXCLUDED.last_turn) END,
        -- Fair turns: a key with jobs parked keeps its next turn; one without starts at the
        -- later of its last turn and the clock.
        head_priority = CASE WHEN $17::bool THEN least(jk.head_priority, EXCLUDED.head_priority)
                             ELSE (SELECT h.p FROM (VALUES (jk.head_priority, jk.head_turn),
                                                           (EXCLUDED.head_priority,
                                                            EXCLUDED.head_turn)) AS h(p, t)
                                   WHERE h.t IS NOT NULL ORDER BY h.p, h.t LIMIT 1) END,
        -- Else the hint never later than the truth: the lesser of the two places.
        head_turn = CASE WHEN $17::bool
                         THEN COALESCE(jk.head_turn,
                                       greatest(jk.last_turn, (SELECT clock FROM me)))
                         ELSE (SELECT h.t FROM (VALUES (jk.head_priority, jk.head_turn),
                                                       (EXCLUDED.head_priority,
                                                        EXCLUDED.head_turn)) AS h(p, t)
                               WHERE h.t IS NOT NULL ORDER BY h.p, h.t LIMIT 1) END
    RETURNING jk.key, jk.last_turn
),
-- A parked job's turn: its message's stream sequence (publish order); with fair turns none
-- (job_take() counts a key's turns from its row).
turns AS (
    SELECT i.id, CASE WHEN $17::bool THEN NULL ELSE i.s END AS turn
    FROM input i JOIN keyed kd ON kd.key = i.k
),
inserted AS (
    INSERT INTO jobs AS j (id, queue, payload, priority, max_attempts, timeout_ms, idempotency_key,
                      backoff, traceparent, then_jobs, key, status, attempts, lease,
                      last_activity_at, scheduled_at, expires_at, last_error, completed_at,
                      parked, turn, seq, gate, batch)
    SELECT i.id, i.queue, i.payload, i.priority, i.max_attempts, i.timeout_ms, i.idempotency_key,
           i.backoff, i.traceparent, i.then_jobs, i.key,
           CASE WHEN x.expired THEN 'cancelled' WHEN x.later THEN 'scheduled' ELSE 'queued' END,
           0, 0, now(),
           GREATEST(now(), COALESCE(to_timestamp(i.run_at_ms / 1000.0), now())), x.expires_at,
           CASE WHEN x.expired THEN job_expired_reason(x.expires_at) END,
           CASE WHEN x.expired THEN now() END,
           NOT x.expired AND NOT x.later, t.turn,
           CASE WHEN NOT x.expired AND NOT x.later THEN i.s::int8 END, i.gate, i.batch
    FROM input i
         JOIN turns t ON t.id = i.id
         CROSS JOIN LATERAL (SELECT to_timestamp(i.expires_at_ms / 1000.0) AS expires_at,
                                    to_timestamp(i.expires_at_ms / 1000.0) <= now() IS TRUE AS expired,
                                    i.run_at_ms IS NOT NULL
                                    AND to_timestamp(i.run_at_ms / 1000.0) > now() AS later) x
    WHERE (SELECT alive AND NOT paused FROM me)
    ORDER BY i.idx
    ON CONFLICT DO NOTHING
    RETURNING j.id, j.status, j.attempts, j.max_attempts, j.lease, j.timeout_ms, j.queue,
              j.status = 'cancelled' AND j.gated_by IS NOT NULL AS throttled
),
others AS (
    SELECT ARRAY(SELECT id FROM input WHERE id NOT IN (SELECT id FROM inserted)) AS ids
),
expired AS (
    UPDATE jobs j
    SET status = 'cancelled', completed_at = now(), updated_at = now(), parked = false,
        expires_at = COALESCE(j.expires_at, j.created_at + $15::int8 * interval '1 millisecond'),
        last_error = job_expired_reason(
            COALESCE(j.expires_at, j.created_at + $15::int8 * interval '1 millisecond')),
        chain_pending = j.has_dependents
    FROM input i
    WHERE (SELECT alive AND NOT paused FROM me) AND j.id = ANY((SELECT ids FROM others)::text[])
      AND j.id = i.id AND j.queue = i.queue
      AND ((j.status = 'queued' AND NOT j.parked)
           OR (j.status = 'scheduled' AND j.scheduled_at <= now()))
      AND COALESCE(j.expires_at, j.created_at + $15::int8 * interval '1 millisecond') <= now()
    RETURNING j.id, j.status, j.attempts, j.max_attempts, j.lease, j.timeout_ms, j.queue,
              j.payload = i.payload AS same_payload
),
parked AS (
    UPDATE jobs j
    SET status = 'queued', parked = true, turn = COALESCE(j.turn, t.turn),
        seq = COALESCE(j.seq, i.s::int8), updated_at = now()
    FROM input i JOIN turns t ON t.id = i.id
    WHERE (SELECT alive AND NOT paused FROM me) AND j.id = ANY((SELECT ids FROM others)::text[])
      AND j.id = i.id AND j.queue = i.queue
      AND ((j.status = 'queued' AND NOT j.parked)
           OR (j.status = 'scheduled' AND j.scheduled_at <= now()))
      AND (COALESCE(j.expires_at, j.created_at + $15::int8 * interval '1 millisecond') > now())
          IS NOT FALSE
    RETURNING j.id, j.status, j.attempts, j.max_attempts, j.lease, j.timeout_ms, j.queue,
              j.payload = i.payload AS same_payload
),
answer AS (
    SELECT id, status, attempts, max_attempts, lease, timeout_ms, queue, true AS same_payload,
           status = 'cancelled' AND NOT throttled AS expired, throttled
    FROM inserted
    UNION ALL
    SELECT id, status, attempts, max_attempts, lease, timeout_ms, queue, same_payload, false,
           false
    FROM parked
    UNION ALL
    SELECT id, status, attempts, max_attempts, lease, timeout_ms, queue, same_payload, true, false
    FROM expired
    UNION ALL
    SELECT j.id, j.status, j.attempts, j.max_attempts, j.lease, j.timeout_ms, j.queue,
           j.payload = i.payload, false, false
    FROM jobs j JOIN input i ON i.id = j.id
    WHERE j.id = ANY((SELECT ids FROM others)::text[]) AND j.id NOT IN (SELECT id FROM parked)
      AND j.id NOT IN (SELECT id FROM expired)
)
SELECT i.idx, (SELECT alive FROM me), a.id IS NOT NULL AS found, a.status, a.attempts,
       a.max_attempts, a.lease, a.timeout_ms, NULL::jsonb, false,
       a.queue, NULL::jsonb, NULL::text, a.same_payload, (SELECT paused FROM me), a.expired,
       a.throttled, NULL::jsonb
FROM input i LEFT JOIN answer a ON a.id = i.id
