-- Messages that are real jobs but cannot run now become dead jobs that keep their own id,
-- payload and settings, so `dlq retry` runs the real job: messages of a queue no pod served
-- within unserved_grace, and messages that reused an id another job with another payload
-- holds (kept under their own message id). Ids that exist already are not inserted.
-- $1 worker id; $2.. one array per column, as in job_claim ($12 the `then` specs); $13 reasons;
-- $14 the keys; $15 the batch each joins (version 34, NULL for none: a dead member of it, so
-- that the batch does not wait for it).
WITH input AS (
    SELECT *
    FROM unnest($2::text[], $3::text[], $4::jsonb[], $5::int2[], $6::int4[], $7::int4[],
                $8::text[], $9::int8[], $10::jsonb[], $11::text[], $12::jsonb[], $13::text[],
                $14::text[], $15::text[])
         AS t(id, queue, payload, priority, max_attempts, timeout_ms, idempotency_key, run_at_ms,
              backoff, traceparent, then_jobs, reason, key, batch)
),
d AS (
    INSERT INTO jobs AS j (id, queue, payload, priority, max_attempts, timeout_ms, idempotency_key,
                           backoff, traceparent, then_jobs, key, status, attempts, last_error,
                           worker_id, completed_at, batch)
    SELECT id, queue, payload, priority, max_attempts, timeout_ms, idempotency_key, backoff,
           traceparent, then_jobs, key, 'dead', 0, reason, $1, now(), batch
    FROM input
    ON CONFLICT DO NOTHING
    RETURNING j.id, j.last_error
),
history AS (
    INSERT INTO job_attempt_log (job_id, lease, attempt, worker_id, outcome, error)
    SELECT id, 0, 0, $1, 'dead', last_error FROM d
)
SELECT id FROM d
