-- Adopts messages a worker fetched and never claimed (it died, was paused, or stopped with
-- pull requests still open): each becomes a row due now, so the scheduler republishes it at
-- once instead of the message waiting out ack_wait. The ids are the ones the claim would
-- derive, so a worker claiming the original message at the same moment finds the same row:
-- one job either way. Rows that exist already are left alone.
-- $1.. one array per column, as in job_claim ($11 the `then` specs, $12 the expiries, Unix ms,
-- $13 the keys, $14 the messages' stream sequences: a keyed queue's job keeps its place in
-- its key's publish order, `seq`, when the intake parks it after the republish; $15 what
-- gates each job, `jobs.gate`, version 23: the gate trigger decides as at a claim; $16 the
-- batch each joins, version 34, NULL for none: batch_join.sql judged them).
WITH input AS (
    SELECT *
    FROM unnest($1::text[], $2::text[], $3::jsonb[], $4::int2[], $5::int4[], $6::int4[],
                $7::text[], $8::int8[], $9::jsonb[], $10::text[], $11::jsonb[], $12::int8[],
                $13::text[], $14::int8[], $15::jsonb[], $16::text[])
         AS t(id, queue, payload, priority, max_attempts, timeout_ms, idempotency_key, run_at_ms,
              backoff, traceparent, then_jobs, expires_at_ms, key, seq, gate, batch)
),
adopted AS (
    INSERT INTO jobs AS j (id, queue, payload, priority, max_attempts, timeout_ms, idempotency_key,
                           backoff, traceparent, then_jobs, key, status, scheduled_at,
                           expires_at, seq, gate, batch)
    SELECT id, queue, payload, priority, max_attempts, timeout_ms, idempotency_key, backoff,
           traceparent, then_jobs, key, 'scheduled',
           GREATEST(now(), COALESCE(to_timestamp(run_at_ms / 1000.0), now())),
           to_timestamp(expires_at_ms / 1000.0), seq, gate, batch
    FROM input
    ON CONFLICT DO NOTHING
    RETURNING j.id, j.lease
),
history AS (
    INSERT INTO job_attempt_log (job_id, lease, attempt, outcome, error)
    SELECT id, lease, 0, 'adopted',
           'delivered to a worker that stopped before claiming it; adopted from the stream'
    FROM adopted
)
SELECT id FROM adopted
