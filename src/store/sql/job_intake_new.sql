-- A keyed queue's intake, its common case (schema version 24): the messages are new jobs,
-- and those whose key has room start at once, as a plain claim's do (`job_claim_new.sql`):
-- their rows are inserted already claimed, up to $18 of them (the caller's free slots). A
-- job's key has room when it has nothing parked (with fair turns, $20: when the queue has
-- nothing parked) and its running jobs, and with a key_rate_limit its counted starts, are
-- under its limit (`job_key_room()`, which locks the group's keys first and counts after).
-- Within a key, jobs start in priority, then message order. Returns the rows it inserted
-- (as job_claim_new.sql does, in no particular order: the caller reads them by id); the
-- caller parks the rest with the full intake (`job_intake.sql`), as it does every message
-- when this fails: an id or idempotency key that exists already fails the whole statement
-- with unique_violation (no ON CONFLICT, as in job_claim_new.sql), and nothing is inserted.
-- (One statement without CTEs for the batch: about 0.1 ms less per 100-job group.)
-- Only jobs due now and not expired are started here; the full intake takes the others.
-- Nothing is inserted unless the worker is registered and not stopped, nor for a paused queue.
-- A gated job (version 23: debounce, throttle, unique_for; `jobs.gate`) goes through the
-- insert's trigger as at every door: it may come back `scheduled` (debounced) or `cancelled`
-- (throttled) instead of running, as from job_claim_new.sql.
-- $1 worker id; $2 the queue's stale_after (ms); $3..$13 one array per column of the batch,
-- as the claim's; $14 the expiries (Unix ms, NULL for none); $15 the keys; $16 what gates
-- each job (NULL for none); $17 the messages' stream sequences; $18 how many may start; $19
-- each key's limit (NULL: none); $20 fair turns; $21 starts per $22 ms per key
-- (key_rate_limit; NULL: none; a key's own rate in key_limits replaces it); $23 the batch
-- each job joins (version 34, NULL for none).
WITH room AS (
    SELECT r.key, r.room
    FROM job_key_room(($4::text[])[1],
                      -- No key (nothing starts) unless the worker is registered and not
                      -- stopped and the queue is not paused.
                      ARRAY(SELECT DISTINCT COALESCE(u.k, '') FROM unnest($15::text[]) AS u(k)
                            WHERE EXISTS (SELECT 1 FROM workers
                                          WHERE id = $1 AND stopped_at IS NULL)
                              AND NOT EXISTS (SELECT 1 FROM queue_pauses
                                              WHERE queue = ($4::text[])[1])),
                      $19::int4, $20::bool, $21::int4, $22::int8) r
),
inserted AS (
    INSERT INTO jobs AS j (id, queue, payload, priority, max_attempts, timeout_ms,
                           idempotency_key, backoff, traceparent, then_jobs, key, status,
                           attempts, worker_id, lease, started_at, last_activity_at, stale_at,
                           scheduled_at, expires_at, seq, gate, batch)
    SELECT s.id, s.queue, s.payload, s.priority, s.max_attempts, s.timeout_ms,
           s.idempotency_key, s.backoff, s.traceparent, s.then_jobs, s.key, 'processing',
           1, $1, 1, now(), now(), now() + $2::int8 * interval '1 millisecond',
           now(), to_timestamp(s.expires_at_ms / 1000.0), s.seq, s.gate, s.batch
    -- Within a key, jobs start in priority, then message order (the answer is read by id).
    FROM (SELECT t.*, row_number() OVER (PARTITION BY COALESCE(t.key, '')
                                         ORDER BY t.priority, t.idx) AS rank
          FROM unnest($3::text[], $4::text[], $5::jsonb[], $6::int2[], $7::int4[], $8::int4[],
                      $9::text[], $10::int8[], $11::jsonb[], $12::text[], $13::jsonb[],
                      $14::int8[], $15::text[], $16::jsonb[], $17::int8[], $23::text[])
               WITH ORDINALITY
               AS t(id, queue, payload, priority, max_attempts, timeout_ms, idempotency_key,
                    run_at_ms, backoff, traceparent, then_jobs, expires_at_ms, key, gate, seq,
                    batch, idx)
          WHERE (t.run_at_ms IS NULL OR to_timestamp(t.run_at_ms / 1000.0) <= now())
            AND (t.expires_at_ms IS NULL OR to_timestamp(t.expires_at_ms / 1000.0) > now())) s
         JOIN room r ON r.key = COALESCE(s.key, '')
    WHERE s.rank <= r.room
    ORDER BY s.priority, s.idx
    LIMIT $18::int4
    RETURNING j.id, j.lease, j.attempts, j.key, j.status, j.gated_by
),
started AS (
    INSERT INTO key_starts (queue, key, job_id, lease)
    SELECT ($4::text[])[1], i.key, i.id, i.lease
    FROM inserted i
    WHERE i.key IS NOT NULL AND i.status = 'processing'
      AND ($21::int4 IS NOT NULL
           OR EXISTS (SELECT 1 FROM key_limits o
                      WHERE o.queue = ($4::text[])[1] AND o.key = i.key AND o.rate_n IS NOT NULL))
)
SELECT i.id, i.lease, i.attempts, i.status = 'processing',
       i.status = 'cancelled' AND i.gated_by IS NULL,
       i.status = 'cancelled' AND i.gated_by IS NOT NULL
FROM inserted i
