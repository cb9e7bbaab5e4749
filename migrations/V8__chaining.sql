-- jobwarden schema, version 8: job chaining.
--
-- A job may name what runs after it (`then`: specs of jobs created when it completes) and
-- what it waits for (`depends_on`: parents that must all complete first; it waits as
-- `waiting` until then). Every job of a chain carries the id of the chain's first job in
-- `pipeline`, so a whole pipeline is one query:
--
--   SELECT id, queue, status, attempts, last_error FROM jobwarden.jobs
--   WHERE pipeline = 'order-42' ORDER BY created_at;
--
-- When a parent ends, its dependents are resolved (by any worker's scheduler, in one
-- transaction per round): all parents completed → the child is due now; a parent dead → the
-- child is dead too ("parent X is dead"), and so are its own dependents; a parent cancelled
-- → the child is cancelled. Retrying a dead parent from the dead-letter queue brings the
-- dependents it doomed back to `waiting`.

ALTER TABLE jobs DROP CONSTRAINT jobs_status_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_status_check CHECK (status IN
    ('waiting', 'queued', 'scheduled', 'processing', 'completed', 'dead', 'cancelled'));

ALTER TABLE jobs
    ADD COLUMN then_jobs     jsonb,                         -- specs created when this completes
    ADD COLUMN pipeline      text,                          -- the chain's first job
    ADD COLUMN has_dependents boolean NOT NULL DEFAULT false,-- some job depends_on it
    ADD COLUMN chain_pending boolean NOT NULL DEFAULT false,-- ended; dependents not resolved yet
    ADD COLUMN blocked_by    text;                          -- the parent that doomed this job

-- Parent → child edges: `depends_on`, and the jobs a `then` created (for the lineage).
CREATE TABLE job_deps (
    parent text NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    child  text NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    PRIMARY KEY (parent, child)
);
CREATE INDEX job_deps_child ON job_deps (child);

CREATE INDEX jobs_chain_pending ON jobs (id) WHERE chain_pending;
CREATE INDEX jobs_waiting ON jobs (id) WHERE status = 'waiting';
CREATE INDEX jobs_pipeline ON jobs (pipeline, created_at) WHERE pipeline IS NOT NULL;

-- Checks one `then` spec (recursively), raising an error that names the problem.
CREATE FUNCTION chain_spec_check(spec jsonb, what text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    s jsonb;
    i integer := 0;
BEGIN
    IF spec IS NULL THEN
        RETURN;
    END IF;
    IF jsonb_typeof(spec) <> 'array' THEN
        RAISE EXCEPTION 'jobwarden.enqueue: % must be a JSON array of jobs, e.g. ''[{"queue": "email", "payload": {}}]''', what
            USING ERRCODE = '22023';
    END IF;
    FOR s IN SELECT value FROM jsonb_array_elements(spec) LOOP
        i := i + 1;
        IF jsonb_typeof(s) <> 'object' OR jsonb_typeof(s -> 'queue') IS DISTINCT FROM 'string'
           OR s ->> 'queue' !~ '^[A-Za-z0-9_-]{1,64}$' THEN
            RAISE EXCEPTION 'jobwarden.enqueue: %[%] needs a "queue" of 1 to 64 ASCII letters, digits, _ or -', what, i
                USING ERRCODE = '22023';
        END IF;
        IF jsonb_typeof(s -> 'payload') IS DISTINCT FROM 'object' THEN
            RAISE EXCEPTION 'jobwarden.enqueue: %[%] needs a "payload" that is a JSON object', what, i
                USING ERRCODE = '22023';
        END IF;
        IF (s ? 'priority' AND ((s ->> 'priority') !~ '^[0-9]$'))
           OR (s ? 'max_attempts' AND CASE WHEN (s ->> 'max_attempts') ~ '^[0-9]{1,4}$'
                                          THEN (s ->> 'max_attempts')::int NOT BETWEEN 1 AND 1000
                                          ELSE true END)
           OR (s ? 'timeout_ms' AND CASE WHEN (s ->> 'timeout_ms') ~ '^[0-9]{1,9}$'
                                        THEN (s ->> 'timeout_ms')::int8 NOT BETWEEN 1 AND 604800000
                                        ELSE true END)
           OR (s ? 'delay_ms' AND (s ->> 'delay_ms') !~ '^[0-9]{1,12}$')
           OR (s ? 'id' AND (jsonb_typeof(s -> 'id') <> 'string'
                             OR octet_length(s ->> 'id') NOT BETWEEN 1 AND 200
                             OR (s ->> 'id') ~ '[[:space:][:cntrl:]/?#]'))
           OR (s ? 'idempotency_key' AND (jsonb_typeof(s -> 'idempotency_key') <> 'string'
                                          OR octet_length(s ->> 'idempotency_key') NOT BETWEEN 1 AND 200)) THEN
            RAISE EXCEPTION 'jobwarden.enqueue: %[%]: priority must be 0 to 9, max_attempts 1 to 1000, timeout_ms 1 to 604800000 and delay_ms whole milliseconds, id and idempotency_key 1 to 200 bytes (an id without spaces, control characters, / ? or #)', what, i
                USING ERRCODE = '22023';
        END IF;
        PERFORM chain_spec_check(s -> 'then', what || '[' || i || '].then');
    END LOOP;
END;
$$;

DROP FUNCTION enqueue(text, jsonb, integer, timestamptz, integer, text, text, integer, jsonb);

-- As version 4's, plus chaining:
--   depends_on => ARRAY['charge-42', 'stock-42']  -- waits until both completed
--   then_jobs  => '[{"queue": "email", "payload": {...}, "then": [...]}]'
-- A `then` job's id is the spec's "id", or "<parent id>.<n>" (n from 1), so creating it
-- twice is impossible. Spec fields: queue, payload (required), id, priority, max_attempts
-- (default 5), timeout_ms, delay_ms, idempotency_key, backoff, then.
CREATE FUNCTION enqueue(
    queue text,
    payload jsonb,
    priority integer DEFAULT 5,
    run_at timestamptz DEFAULT NULL,
    max_attempts integer DEFAULT 5,
    idempotency_key text DEFAULT NULL,
    id text DEFAULT NULL,
    timeout_ms integer DEFAULT NULL,
    backoff jsonb DEFAULT NULL,
    depends_on text[] DEFAULT NULL,
    then_jobs jsonb DEFAULT NULL
) RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    new_id text := COALESCE(enqueue.id, gen_random_uuid()::text);
    got text;
    same boolean;
    missing text;
    parents text[] := (SELECT array_agg(DISTINCT p) FROM unnest(enqueue.depends_on) p);
    chain text;
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
    PERFORM chain_spec_check(enqueue.then_jobs, 'then_jobs');
    IF parents IS NOT NULL THEN
        IF array_position(enqueue.depends_on, NULL) IS NOT NULL THEN
            RAISE EXCEPTION 'jobwarden.enqueue: depends_on holds a NULL; name each parent by its job id'
                USING ERRCODE = '22023';
        END IF;
        IF new_id = ANY (parents) THEN
            RAISE EXCEPTION 'jobwarden.enqueue: job % cannot depend on itself', quote_literal(new_id)
                USING ERRCODE = '22023';
        END IF;
        SELECT p INTO missing FROM unnest(parents) p
        WHERE NOT EXISTS (SELECT 1 FROM jobs j WHERE j.id = p) LIMIT 1;
        IF missing IS NOT NULL THEN
            RAISE EXCEPTION 'jobwarden.enqueue: depends_on names job %, which does not exist; enqueue the parents first',
                quote_literal(missing) USING ERRCODE = '23503';
        END IF;
        -- The pipeline of the first parent named (or the one it begins).
        SELECT COALESCE(j.pipeline, j.id) INTO chain FROM jobs j WHERE j.id = enqueue.depends_on[1];
    ELSIF enqueue.then_jobs IS NOT NULL THEN
        chain := new_id;
    END IF;

    INSERT INTO jobs (id, queue, payload, priority, max_attempts, timeout_ms, idempotency_key,
                      backoff, status, scheduled_at, then_jobs, pipeline)
    VALUES (new_id, enqueue.queue, enqueue.payload, enqueue.priority, enqueue.max_attempts,
            enqueue.timeout_ms, enqueue.idempotency_key, enqueue.backoff,
            CASE WHEN parents IS NULL THEN 'scheduled' ELSE 'waiting' END,
            GREATEST(now(), COALESCE(enqueue.run_at, now())), enqueue.then_jobs, chain)
    ON CONFLICT DO NOTHING
    RETURNING jobs.id INTO got;
    IF got IS NOT NULL THEN
        IF parents IS NOT NULL THEN
            INSERT INTO job_deps (parent, child) SELECT p, got FROM unnest(parents) p;
            -- The parents learn they have dependents, in their own rows: the settle of a parent
            -- ending at this moment waits for this row lock and then reads the newest version,
            -- so it marks itself for resolution; a parent that ended already is marked here.
            -- (The lock lasts until this transaction commits: keep transactions that enqueue
            -- with depends_on short. Rows that know already are not touched.)
            UPDATE jobs j
            SET has_dependents = true,
                chain_pending = j.chain_pending OR j.status IN ('completed', 'dead', 'cancelled')
            WHERE j.id = ANY (parents)
              AND (NOT j.has_dependents
                   OR (j.status IN ('completed', 'dead', 'cancelled') AND NOT j.chain_pending));
        END IF;
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
