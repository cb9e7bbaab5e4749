-- jobwarden schema, version 4: transactional enqueue (the outbox) for any language.
--
--   BEGIN;
--   INSERT INTO orders ...;
--   SELECT jobwarden.enqueue('payments', '{"order": 42}', idempotency_key => 'order-42');
--   COMMIT;
--
-- The job is a row written in the caller's transaction: if it rolls back, the job never
-- existed; once it commits, the job is `scheduled`, due now, and a worker's scheduler (the
-- relay) publishes it — woken at once by the NOTIFY, which PostgreSQL delivers only on
-- commit, or within `scheduler_every` by polling. A relay killed between the commit and
-- the publish loses nothing: the row stays `scheduled` until a scheduler publishes it.
--
-- `backoff` overrides the queue's, e.g. '{"kind": "exponential", "base": "1s", "max": "1m"}'
-- (the same form as the message envelope's). Returns the job's id. The same idempotency key (or id) with the same payload returns the
-- existing job; with another payload it raises an error naming the key and the job.
CREATE FUNCTION enqueue(
    queue text,
    payload jsonb,
    priority integer DEFAULT 5,
    run_at timestamptz DEFAULT NULL,
    max_attempts integer DEFAULT 5,
    idempotency_key text DEFAULT NULL,
    id text DEFAULT NULL,
    timeout_ms integer DEFAULT NULL,
    backoff jsonb DEFAULT NULL
) RETURNS text
LANGUAGE plpgsql VOLATILE
-- The tables are found in the schema the function lives in, whatever the caller's
-- search_path.
SET search_path FROM CURRENT
AS $$
DECLARE
    new_id text := COALESCE(enqueue.id, gen_random_uuid()::text);
    got text;
    same boolean;
BEGIN
    IF enqueue.queue IS NULL OR enqueue.queue !~ '^[A-Za-z0-9_-]{1,64}$' THEN
        RAISE EXCEPTION 'jobwarden.enqueue: queue % must be 1 to 64 ASCII letters, digits, _ or -, e.g. ''email''',
            quote_nullable(enqueue.queue) USING ERRCODE = '22023';
    END IF;
    IF enqueue.payload IS NULL OR jsonb_typeof(enqueue.payload) <> 'object' THEN
        RAISE EXCEPTION 'jobwarden.enqueue: payload must be a JSON object, e.g. ''{"to": "a@example.com"}''::jsonb (got %)',
            COALESCE(jsonb_typeof(enqueue.payload), 'NULL') USING ERRCODE = '22023';
    END IF;
    IF enqueue.priority IS NULL OR enqueue.priority NOT BETWEEN 0 AND 9 THEN
        RAISE EXCEPTION 'jobwarden.enqueue: priority % must be from 0 (first) to 9 (last)',
            COALESCE(enqueue.priority::text, 'NULL') USING ERRCODE = '22023';
    END IF;
    IF enqueue.max_attempts IS NULL OR enqueue.max_attempts NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'jobwarden.enqueue: max_attempts % must be from 1 to 1000',
            COALESCE(enqueue.max_attempts::text, 'NULL') USING ERRCODE = '22023';
    END IF;
    IF length(new_id) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'jobwarden.enqueue: id must be 1 to 200 characters' USING ERRCODE = '22023';
    END IF;
    IF enqueue.timeout_ms IS NOT NULL AND enqueue.timeout_ms < 1 THEN
        RAISE EXCEPTION 'jobwarden.enqueue: timeout_ms % must be at least 1', enqueue.timeout_ms
            USING ERRCODE = '22023';
    END IF;

    INSERT INTO jobs (id, queue, payload, priority, max_attempts, timeout_ms, idempotency_key,
                      backoff, status, scheduled_at)
    VALUES (new_id, enqueue.queue, enqueue.payload, enqueue.priority, enqueue.max_attempts,
            enqueue.timeout_ms, enqueue.idempotency_key, enqueue.backoff, 'scheduled',
            GREATEST(now(), COALESCE(enqueue.run_at, now())))
    ON CONFLICT DO NOTHING
    RETURNING jobs.id INTO got;
    IF got IS NOT NULL THEN
        -- Delivered on commit only; the payload names the schema, so workers of other
        -- installations in this database ignore it.
        PERFORM pg_notify('jobwarden_enqueue', current_schema());
        RETURN got;
    END IF;

    -- The id or the (queue, idempotency key) is taken: the job that holds it.
    SELECT j.id, j.payload = enqueue.payload INTO got, same
    FROM jobs j
    WHERE j.id = new_id
       OR (j.queue = enqueue.queue AND j.idempotency_key = enqueue.idempotency_key)
    ORDER BY (j.id = new_id) DESC
    LIMIT 1;
    IF NOT same THEN
        IF got = new_id THEN
            RAISE EXCEPTION 'jobwarden.enqueue: job id % already belongs to a job with another payload; use a new id, or the same payload to get job % back',
                quote_literal(new_id), got USING ERRCODE = '23505';
        END IF;
        RAISE EXCEPTION 'jobwarden.enqueue: idempotency key % of queue % already belongs to job % with another payload; use a new key for a different job, or the same payload to get job % back',
            quote_literal(enqueue.idempotency_key), enqueue.queue, got, got USING ERRCODE = '23505';
    END IF;
    RETURN got;
END;
$$;
