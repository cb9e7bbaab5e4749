-- Enqueues a job (CLI, Rust client). A job whose id or idempotency key exists already is not
-- inserted; the caller then reads the existing one.
-- $1 id; $2 queue; $3 payload; $4 priority; $5 max_attempts; $6 timeout_ms;
-- $7 idempotency_key; $8 delay (ms, 0 for none); $9 backoff (NULL: the queue's);
-- $10 expires at (Unix ms, NULL for none); $11 expires in (ms from now, NULL for none);
-- $12 the key (NULL for none); $13 the job's own debounce, throttle, unique_for (jobs.gate's
-- form, NULL for none): with its queue's declared ones, job_gate() says what the gate
-- trigger applies (a debounced job is inserted `scheduled`, a throttled one `cancelled`; the
-- caller publishes only a `queued` one).
INSERT INTO jobs (id, queue, payload, priority, max_attempts, timeout_ms, idempotency_key,
                  backoff, status, scheduled_at, expires_at, key, gate)
VALUES ($1, $2, $3, $4, $5, $6, $7, $9,
        CASE WHEN $8::int8 > 0 THEN 'scheduled' ELSE 'queued' END,
        now() + $8::int8 * interval '1 millisecond',
        COALESCE(to_timestamp($10::int8 / 1000.0), now() + $11::int8 * interval '1 millisecond'),
        $12::text,
        CASE WHEN $13::jsonb IS NOT NULL OR $12::text IS NOT NULL OR $7::text IS NOT NULL
             THEN job_gate($2, $13::jsonb, $12::text, $7::text) END)
ON CONFLICT DO NOTHING
RETURNING id, status, generation
