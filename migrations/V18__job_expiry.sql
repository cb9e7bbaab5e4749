-- jobwarden schema, version 18: job expiry (issue 30, part 5).
--
-- THIS FILE IS A TEMPLATE, like version 14: every double-braced NAME is filled from the
-- constants of src/contract.rs when the migration runs.
--
-- A job may carry an expiry: not started by `jobs.expires_at`, it never runs. It ends
-- `cancelled` with last_error `expired: not started by <instant>` (the status set stays as it
-- is: chains, retention and the rollups treat it as any cancelled job). Who ends it:
-- * the claim statements (job_claim.sql, job_claim_new.sql): a message whose job is past its
--   expiry is not claimed; its row is ended in the same statement and the message acked;
-- * the scheduler's round (job_expire_due.sql): queued and scheduled jobs past their expiry,
--   a bounded batch per round over the partial index below, whether or not a message is
--   still on its way (a retry whose backoff passes the expiry ends so; a message that is
--   gone still ends its job).
-- A job already running when its instant passes runs to its end: expiry is about starting.
--
-- What changes:
-- * `jobs.expires_at`, NULL for a job that never expires.
-- * `contract_check()` (and so `job_check()`) takes `expires_at_ms` (Unix ms, as run_at_ms)
--   and `expires_in` (a duration, as a backoff's), never both, at the message and enqueue
--   doors; the Rust contract (contract::check_spec) is its twin.
-- * `enqueue()` takes `expires_at timestamptz` and `expires_in text` (its old signature is
--   dropped: two overloads would make named calls ambiguous).
-- A queue's default (`[queues.<name>] expire_after`) is a worker setting: the workers apply
-- it to messages at decode (from the time the stream stored the message) and, at the claim,
-- to rows that carry no expiry (from their `created_at`).

ALTER TABLE jobs ADD COLUMN expires_at timestamptz;

-- The last_error of an expired job: "expired: not started by 2026-11-27T03:00:00.000Z" (UTC,
-- milliseconds, RFC 3339).
CREATE FUNCTION job_expired_reason(expires_at timestamptz) RETURNS text
LANGUAGE sql STABLE
AS $$
    SELECT 'expired: not started by '
           || to_char(expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
$$;

-- The scheduler's expiry round reads only jobs that may still expire.
CREATE INDEX jobs_expiring ON jobs (expires_at)
    WHERE expires_at IS NOT NULL AND status IN ('queued', 'scheduled');

-- Checks one spec at a door ('message', 'then' or 'enqueue'), and the `then` specs inside
-- it, depth first, as contract::check_spec does. Returns the spec as it is stored (whole
-- numbers as integers, backoffs with their durations in nanoseconds) and how many more
-- `then` jobs the tree may hold. Raises SQLSTATE 22023 naming the field.
CREATE OR REPLACE FUNCTION contract_check(spec jsonb, door text, payload_limit bigint, at text,
                               depth integer, budget integer,
                               OUT checked jsonb, OUT left_over integer)
LANGUAGE plpgsql IMMUTABLE
SET search_path FROM CURRENT
AS $$
DECLARE
    fields text[] := CASE door WHEN 'message' THEN ARRAY[{{V18_MESSAGE_FIELDS}}]
                               WHEN 'then' THEN ARRAY[{{V18_THEN_FIELDS}}]
                               ELSE ARRAY[{{V18_ENQUEUE_FIELDS}}] END;
    k text;
    s jsonb;
    i integer;
    id text;
    q text;
    key text;
    p jsonb;
    size bigint;
    num bigint;
    kids jsonb := '[]';
    child record;
    parent jsonb;
    expiry jsonb;
    ns numeric;
BEGIN
    checked := spec;
    left_over := budget;
    SELECT f INTO k FROM jsonb_object_keys(spec) AS f
    WHERE f <> ALL (fields) ORDER BY f COLLATE "C" LIMIT 1;
    IF k IS NOT NULL THEN
        RAISE EXCEPTION 'jobwarden: field `%` is not a field of %; the fields are %',
            contract_join(at, k),
            CASE door WHEN 'message' THEN 'a message''s envelope' WHEN 'then' THEN 'a `then` job'
                      ELSE 'an enqueued job' END,
            array_to_string(fields, ', ') USING ERRCODE = '22023';
    END IF;
    q := contract_string(spec, at, 'queue');
    IF q IS NOT NULL THEN
        PERFORM contract_check_queue(q, contract_join(at, 'queue'));
    ELSIF door <> 'message' THEN
        RAISE EXCEPTION 'jobwarden: field `%` is required', contract_join(at, 'queue') USING ERRCODE = '22023';
    END IF;
    p := spec -> 'payload';
    IF p IS NULL OR jsonb_typeof(p) = 'null' THEN
        RAISE EXCEPTION 'jobwarden: field `%` is required', contract_join(at, 'payload') USING ERRCODE = '22023';
    END IF;
    IF jsonb_typeof(p) <> 'object' THEN
        PERFORM contract_wrong(contract_join(at, 'payload'), 'an object', p);
    END IF;
    IF payload_limit IS NOT NULL THEN
        size := octet_length(p::text);
        IF size > payload_limit THEN
            PERFORM contract_refuse(contract_join(at, 'payload'), format('is %s bytes, over the limit of %s bytes (worker.max_payload_bytes); store large data elsewhere and pass a reference', size, payload_limit));
        END IF;
    END IF;
    id := contract_string(spec, at, 'id');
    IF id IS NOT NULL THEN
        PERFORM contract_check_id(id, contract_join(at, 'id'));
    END IF;
    FOR k, num IN
        SELECT f.name, contract_whole(spec, at, f.name, f.lo, f.hi)
        FROM (VALUES (1, 'priority', {{MIN_PRIORITY}}, {{MAX_PRIORITY}}),
                     (2, 'max_attempts', 1, {{MAX_ATTEMPTS}}),
                     (3, 'timeout_ms', 1, {{MAX_TIMEOUT_MS}}),
                     (4, 'run_at_ms', 0, {{MAX_RUN_AT_MS}}),
                     (5, 'delay_ms', 0, {{MAX_DELAY_MS}})) AS f(n, name, lo, hi)
        ORDER BY f.n
    LOOP
        IF num IS NOT NULL THEN
            checked := jsonb_set(checked, ARRAY[k], to_jsonb(num));
        END IF;
    END LOOP;
    key := contract_string(spec, at, 'idempotency_key');
    IF key IS NOT NULL THEN
        PERFORM contract_check_key(key, contract_join(at, 'idempotency_key'));
    END IF;
    IF spec -> 'backoff' IS NOT NULL AND jsonb_typeof(spec -> 'backoff') <> 'null' THEN
        checked := jsonb_set(checked, '{backoff}', contract_backoff(spec -> 'backoff', contract_join(at, 'backoff')));
    END IF;
    IF spec -> 'depends_on' IS NOT NULL AND jsonb_typeof(spec -> 'depends_on') <> 'null' THEN
        IF door = 'message' THEN
            PERFORM contract_refuse(contract_join(at, 'depends_on'), 'a job that waits for others must be stored before anything runs it: enqueue it through PostgreSQL (SQL enqueue(..., depends_on => ...), the Rust client, or `jobwarden enqueue --depends-on`), not by publishing');
        END IF;
        IF jsonb_typeof(spec -> 'depends_on') <> 'array' THEN
            PERFORM contract_wrong(contract_join(at, 'depends_on'), 'an array of job ids', spec -> 'depends_on');
        END IF;
        IF jsonb_array_length(spec -> 'depends_on') > {{MAX_DEPENDS_ON}} THEN
            PERFORM contract_refuse(contract_join(at, 'depends_on'), format('names %s jobs; a job may wait for at most {{MAX_DEPENDS_ON}}', jsonb_array_length(spec -> 'depends_on')));
        END IF;
        FOR parent, i IN SELECT e.value, e.n FROM jsonb_array_elements(spec -> 'depends_on') WITH ORDINALITY AS e(value, n) ORDER BY e.n LOOP
            IF jsonb_typeof(parent) <> 'string' THEN
                PERFORM contract_wrong(contract_join(at, 'depends_on') || '[' || i || ']', 'a job id (a string)', parent);
            END IF;
            PERFORM contract_check_id(parent #>> '{}', contract_join(at, 'depends_on') || '[' || i || ']');
            IF parent #>> '{}' = id THEN
                PERFORM contract_refuse(contract_join(at, 'depends_on') || '[' || i || ']', 'a job cannot depend on itself');
            END IF;
        END LOOP;
    END IF;
    IF spec -> 'then' IS NOT NULL AND jsonb_typeof(spec -> 'then') <> 'null' THEN
        IF jsonb_typeof(spec -> 'then') <> 'array' THEN
            PERFORM contract_wrong(contract_join(at, 'then'), 'an array of jobs, e.g. [{"queue":"email","payload":{}}]', spec -> 'then');
        END IF;
        IF depth + 1 > {{MAX_THEN_DEPTH}} THEN
            PERFORM contract_refuse(contract_join(at, 'then'), 'nests deeper than {{MAX_THEN_DEPTH}} levels of then');
        END IF;
        FOR s, i IN SELECT e.value, e.n FROM jsonb_array_elements(spec -> 'then') WITH ORDINALITY AS e(value, n) ORDER BY e.n LOOP
            IF left_over = 0 THEN
                PERFORM contract_refuse(contract_join(at, 'then') || '[' || i || ']', 'one job may create at most {{MAX_THEN_JOBS}} jobs through then');
            END IF;
            left_over := left_over - 1;
            IF jsonb_typeof(s) <> 'object' THEN
                PERFORM contract_wrong(contract_join(at, 'then') || '[' || i || ']', 'an object', s);
            END IF;
            SELECT * INTO child FROM contract_check(s, 'then', payload_limit,
                contract_join(at, 'then') || '[' || i || ']', depth + 1, left_over);
            left_over := child.left_over;
            kids := kids || jsonb_build_array(child.checked);
        END LOOP;
        checked := jsonb_set(checked, '{then}', kids);
    END IF;
    -- Expiry (version 18): an instant or a duration from the enqueue, never both.
    num := contract_whole(spec, at, 'expires_at_ms', 0, {{MAX_RUN_AT_MS}});
    IF num IS NOT NULL THEN
        checked := jsonb_set(checked, '{expires_at_ms}', to_jsonb(num));
    END IF;
    expiry := spec -> 'expires_in';
    IF expiry IS NOT NULL AND jsonb_typeof(expiry) <> 'null' THEN
        IF jsonb_typeof(expiry) <> 'string' THEN
            PERFORM contract_wrong(contract_join(at, 'expires_in'), 'a duration string, e.g. "1h"', expiry);
        END IF;
        ns := contract_duration_ns(expiry #>> '{}', contract_join(at, 'expires_in'));
        IF ns < 1000000 THEN
            PERFORM contract_refuse(contract_join(at, 'expires_in'), format('%s is under a millisecond; a job expires at least 1ms after it is enqueued, e.g. "1h"', expiry::text));
        END IF;
        IF ns > {{MAX_DELAY_MS}}::numeric * 1000000 THEN
            PERFORM contract_refuse(contract_join(at, 'expires_in'), format('%s is longer than {{MAX_DELAY_DAYS}} days, the longest delay', expiry::text));
        END IF;
        IF num IS NOT NULL THEN
            PERFORM contract_refuse(contract_join(at, 'expires_in'), 'is given with expires_at_ms; give one of them: expires_at_ms (an instant, Unix ms) or expires_in (a duration from the enqueue, e.g. "1h")');
        END IF;
        checked := jsonb_set(checked, '{expires_in}', to_jsonb(div(ns, 1000000)::text || 'ms'));
    END IF;
END;
$$;

DROP FUNCTION enqueue(text, jsonb, integer, timestamptz, integer, text, text, integer, jsonb,
                      text[], jsonb);

-- As version 14's, with an expiry: `expires_at` (an instant) or `expires_in` (a duration
-- from now, as the contract's duration text), checked by job_check() with the rest. Version 14's
-- function, checked by job_check() first (NULL priority and
-- max_attempts mean the defaults, {{DEFAULT_PRIORITY}} and {{DEFAULT_SQL_MAX_ATTEMPTS}}).
CREATE FUNCTION enqueue(
    queue text,
    payload jsonb,
    priority integer DEFAULT {{DEFAULT_PRIORITY}},
    run_at timestamptz DEFAULT NULL,
    max_attempts integer DEFAULT {{DEFAULT_SQL_MAX_ATTEMPTS}},
    idempotency_key text DEFAULT NULL,
    id text DEFAULT NULL,
    timeout_ms integer DEFAULT NULL,
    backoff jsonb DEFAULT NULL,
    depends_on text[] DEFAULT NULL,
    then_jobs jsonb DEFAULT NULL,
    expires_at timestamptz DEFAULT NULL,
    expires_in text DEFAULT NULL
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
    spec jsonb;
    checked jsonb;
    expiry timestamptz;
BEGIN
    IF enqueue.run_at IS NOT NULL AND NOT isfinite(enqueue.run_at) THEN
        PERFORM contract_refuse('run_at_ms', format('%s is not a time from 1970 to the end of 9999', enqueue.run_at));
    END IF;
    IF enqueue.expires_at IS NOT NULL AND NOT isfinite(enqueue.expires_at) THEN
        PERFORM contract_refuse('expires_at_ms', format('%s is not a time from 1970 to the end of 9999', enqueue.expires_at));
    END IF;
    spec := jsonb_strip_nulls(jsonb_build_object(
        'queue', enqueue.queue,
        'payload', enqueue.payload,
        'id', enqueue.id,
        'priority', enqueue.priority,
        'max_attempts', enqueue.max_attempts,
        'timeout_ms', enqueue.timeout_ms,
        'idempotency_key', enqueue.idempotency_key,
        'run_at_ms', floor(extract(epoch FROM enqueue.run_at) * 1000),
        'backoff', enqueue.backoff,
        'then', enqueue.then_jobs,
        'depends_on', to_jsonb(enqueue.depends_on),
        'expires_at_ms', floor(extract(epoch FROM enqueue.expires_at) * 1000),
        'expires_in', enqueue.expires_in));
    -- jsonb_strip_nulls also drops nulls inside the payload: the payload itself is checked
    -- as given (a NULL payload is the missing field).
    IF enqueue.payload IS NOT NULL THEN
        spec := jsonb_set(spec, '{payload}', enqueue.payload);
    END IF;
    IF enqueue.then_jobs IS NOT NULL THEN
        spec := jsonb_set(spec, '{then}', enqueue.then_jobs);
    END IF;
    IF enqueue.depends_on IS NOT NULL THEN
        spec := jsonb_set(spec, '{depends_on}', to_jsonb(enqueue.depends_on));
    END IF;
    IF enqueue.backoff IS NOT NULL THEN
        spec := jsonb_set(spec, '{backoff}', enqueue.backoff);
    END IF;
    checked := job_check(spec, 'enqueue', contract_payload_limit());
    expiry := COALESCE(enqueue.expires_at,
                       now() + left(checked ->> 'expires_in', -2)::bigint * interval '1 millisecond');

    IF parents IS NOT NULL THEN
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
                      backoff, status, scheduled_at, then_jobs, pipeline, expires_at)
    VALUES (new_id, enqueue.queue, enqueue.payload,
            COALESCE(enqueue.priority, {{DEFAULT_PRIORITY}}),
            COALESCE(enqueue.max_attempts, {{DEFAULT_SQL_MAX_ATTEMPTS}}),
            enqueue.timeout_ms, enqueue.idempotency_key, checked -> 'backoff',
            CASE WHEN parents IS NULL THEN 'scheduled' ELSE 'waiting' END,
            GREATEST(now(), COALESCE(enqueue.run_at, now())), checked -> 'then', chain, expiry)
    ON CONFLICT DO NOTHING
    RETURNING jobs.id INTO got;
    IF got IS NOT NULL THEN
        IF parents IS NOT NULL THEN
            INSERT INTO job_deps (parent, child) SELECT p, got FROM unnest(parents) p;
            -- The parents learn they have dependents, in their own rows (see version 8).
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
