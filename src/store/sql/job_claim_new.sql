-- The claim's common case: the messages are new jobs. Inserts their rows already claimed
-- (or `scheduled` when their run_at is ahead), if this worker is registered and not stopped
-- and the queue is not paused (the batch is one queue's), and returns the rows it inserted; the caller claims the rest (every id when this worker may
-- not claim) with job_claim.sql. One insert and no joins: a fraction of the full statement's
-- work for the same rows. No ON CONFLICT either (a speculative insertion costs a fifth of the
-- statement): an id or idempotency key that exists already fails the whole statement with
-- unique_violation, nothing is inserted, and the caller claims the group with job_claim.sql.
-- The caller sends here only messages that are probably new (first deliveries that
-- jobwarden did not republish from a row).
-- A message whose expiry (expires_at_ms) has passed is inserted ended: `cancelled`, with
-- last_error `expired: not started by <instant>`, never started (the caller acks it).
-- It returns, per row inserted, only what the caller does not know already: the lease and
-- attempt it was given, whether it runs now, whether it expired, and whether its throttle
-- ended it (`cancelled`, gated_by the job that holds its key's window).
-- $1 worker id; $2 the queue's stale_after (ms); $3.. one array per column of the batch;
-- $14 the expiries (Unix ms, NULL for none); $15 the keys (version 20, NULL for none); $16 what
-- gates each job (`jobs.gate`, version 23, NULL for none: see job_claim.sql); $17 the batch
-- each job joins (version 34, NULL for none). (No
-- queue default expiry here, unlike job_claim.sql's $15: a message has it from its decode.)
INSERT INTO jobs AS j (id, queue, payload, priority, max_attempts, timeout_ms, idempotency_key,
                       backoff, traceparent, then_jobs, key, status, attempts, worker_id, lease,
                       started_at, last_activity_at, stale_at, scheduled_at, expires_at,
                       last_error, completed_at, gate, batch)
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
FROM unnest($3::text[], $4::text[], $5::jsonb[], $6::int2[], $7::int4[], $8::int4[],
            $9::text[], $10::int8[], $11::jsonb[], $12::text[], $13::jsonb[], $14::int8[],
            $15::text[], $16::jsonb[], $17::text[])
     AS i(id, queue, payload, priority, max_attempts, timeout_ms, idempotency_key, run_at_ms,
          backoff, traceparent, then_jobs, expires_at_ms, key, gate, batch)
     CROSS JOIN LATERAL (SELECT to_timestamp(i.expires_at_ms / 1000.0) AS expires_at,
                                to_timestamp(i.expires_at_ms / 1000.0) <= now() IS TRUE AS expired) x
WHERE EXISTS (SELECT 1 FROM workers WHERE id = $1 AND stopped_at IS NULL)
  AND NOT EXISTS (SELECT 1 FROM queue_pauses WHERE queue = ($4::text[])[1])
RETURNING j.id, j.lease, j.attempts, j.status = 'processing',
          j.status = 'cancelled' AND j.gated_by IS NULL,
          j.status = 'cancelled' AND j.gated_by IS NOT NULL
