-- jobwarden schema, version 23: debounce, throttle and unique-for-a-while (issue 31, item 5).
--
-- THIS FILE IS A TEMPLATE, like versions 14, 18 and 20: every double-braced NAME is filled
-- from the constants of src/contract.rs when the migration runs.
--
-- A job (its envelope, SQL `enqueue()`, the CLI, the Rust client, a `then` spec) or its
-- queue (`[queues.q] debounce`, `debounce_max_wait`, `throttle`, `unique_for`) may ask for:
-- * debounce: the jobs of one key (and queue) that come within the window collapse into
--   one, the LAST one, which runs once the key has been quiet for the window, and at the
--   latest `debounce_max_wait` after the first of them came;
-- * throttle: at most one job per key per window; the others are kept as ended rows
--   (`cancelled`, last_error `throttled: ...`), never run;
-- * unique_for: the job's idempotency key is held for that long only; after it, a new job
--   with the same key is a new job (the old row keeps the key in `idempotency_key_released`).
--
-- One mechanism decides, whatever the door: the row trigger `jobs_gate` on INSERT INTO jobs,
-- which fires only for a row whose `gate` is set (`WHEN (NEW.gate IS NOT NULL)`, evaluated
-- by the executor: a plain job costs one NULL test, no function call). Every statement that
-- creates a job says what applies in `gate`: the claim statements and the keyed intake from
-- what the worker decoded (the message's fields, else its queue's settings), `enqueue()` and
-- the `then` round through `job_gate()` (the job's fields, else what the queue's workers
-- declared in `queue_gates`).
--
-- A debounced job waits as a `scheduled` row due when its key has been quiet for the window:
-- in PostgreSQL, not in the stream, so neither NATS's duplicate window nor ack_wait bounds
-- a debounce. The message that brought it is acked once that row is committed (the claim's
-- usual commit-then-ack); a worker that dies after that loses nothing: the scheduler of any
-- worker publishes the row when it is due.
--
-- What changes:
-- * jobs.gate (jsonb: debounce_ms, max_wait_ms, throttle_ms, unique_for_ms), jobs.debounced
--   (how many jobs collapsed into this one; NULL for none: every new column is NULL for a
--   plain job, so its row costs no more than the null bitmap's bits), jobs.debounce_since (when the first of them
--   came), jobs.gated_by (for a row that collapsed or was throttled: the job that runs
--   instead), jobs.idempotency_key_released (a key whose unique_for passed).
-- * queue_gates: each queue's settings as its workers declare them at start.
-- * contract_check_gate(): the fields' rules; contract_check() (re-created from version 20's
--   text, with the gate checked last) and enqueue() (re-created from version 20's text, with
--   four arguments more) take them.

ALTER TABLE jobs ADD COLUMN gate jsonb,
                 ADD COLUMN debounced integer,
                 ADD COLUMN debounce_since timestamptz,
                 ADD COLUMN gated_by text COLLATE "C",
                 ADD COLUMN idempotency_key_released text;

-- The gated jobs of a key, newest first (the trigger's lookups); plain jobs are not in it.
CREATE INDEX jobs_gated ON jobs (queue, key, created_at) WHERE gate IS NOT NULL AND key IS NOT NULL;
-- Jobs whose idempotency key is held for a while only.
CREATE INDEX jobs_unique_for ON jobs (queue, idempotency_key_released)
    WHERE idempotency_key_released IS NOT NULL;

-- Each queue's debounce, throttle and unique_for as the workers that serve it declare them
-- (at start; the last one to start wins). Read by job_gate() for the jobs that come through
-- SQL, the CLI, the Rust client, cron and `then`; a worker applies its own settings to the
-- messages it claims.
CREATE TABLE queue_gates (
    queue         text COLLATE "C" PRIMARY KEY,
    debounce_ms   bigint CHECK (debounce_ms > 0),
    max_wait_ms   bigint CHECK (max_wait_ms >= debounce_ms),
    throttle_ms   bigint CHECK (throttle_ms > 0),
    unique_for_ms bigint CHECK (unique_for_ms > 0),
    declared_by   text,
    declared_at   timestamptz NOT NULL DEFAULT now(),
    CHECK (debounce_ms IS NULL OR throttle_ms IS NULL)
);

-- A window field (`debounce`, `debounce_max_wait`, `throttle`, `unique_for`): a duration
-- text from 1ms to the longest delay; NULL when absent. Returns whole milliseconds. The
-- Rust twin is contract::check_window.
CREATE FUNCTION contract_window_ms(spec jsonb, at text, field text) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE
SET search_path FROM CURRENT
AS $$
DECLARE
    v jsonb := spec -> field;
    ns numeric;
BEGIN
    IF v IS NULL OR jsonb_typeof(v) = 'null' THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(v) <> 'string' THEN
        PERFORM contract_wrong(contract_join(at, field), 'a duration string, e.g. "5s"', v);
    END IF;
    ns := contract_duration_ns(v #>> '{}', contract_join(at, field));
    IF ns < 1000000 THEN
        PERFORM contract_refuse(contract_join(at, field), format('%s is under a millisecond; a window is at least 1ms, e.g. "5s" (leave the field out for none)', v::text));
    END IF;
    IF ns > {{MAX_DELAY_MS}}::numeric * 1000000 THEN
        PERFORM contract_refuse(contract_join(at, field), format('%s is longer than {{MAX_DELAY_DAYS}} days, the longest window', v::text));
    END IF;
    RETURN div(ns, 1000000);
END;
$$;

-- The gate fields of a spec, checked: returns them as whole milliseconds ("5000ms"), or NULL
-- when the spec has none. The rules between them: debounce_max_wait only with debounce, and
-- not shorter; debounce or throttle, not both; each of them needs the job's key (at a door
-- other than a message's: a message may get its key from its queue's key_from, so the
-- worker checks it after its decode); unique_for needs an idempotency_key. Its twin is
-- contract::check_gate.
CREATE FUNCTION contract_check_gate(spec jsonb, door text, at text) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path FROM CURRENT
AS $$
DECLARE
    d bigint := contract_window_ms(spec, at, 'debounce');
    m bigint := contract_window_ms(spec, at, 'debounce_max_wait');
    t bigint := contract_window_ms(spec, at, 'throttle');
    u bigint := contract_window_ms(spec, at, 'unique_for');
BEGIN
    IF m IS NOT NULL AND d IS NULL THEN
        PERFORM contract_refuse(contract_join(at, 'debounce_max_wait'), 'is given without debounce; it bounds how long a debounce may hold a job back: add "debounce" (e.g. "5s") or leave debounce_max_wait out');
    END IF;
    IF m < d THEN
        PERFORM contract_refuse(contract_join(at, 'debounce_max_wait'), format('%s is shorter than debounce %s; a debounced job runs at the latest max_wait after the first one came, so max_wait is at least the debounce (e.g. debounce "5s", debounce_max_wait "30s")', (spec -> 'debounce_max_wait')::text, (spec -> 'debounce')::text));
    END IF;
    IF d IS NOT NULL AND t IS NOT NULL THEN
        PERFORM contract_refuse(contract_join(at, 'throttle'), 'is given with debounce; a key''s jobs are debounced (the last one runs) or throttled (the first one runs), not both: keep one');
    END IF;
    IF door <> 'message' AND spec ->> 'key' IS NULL AND (d IS NOT NULL OR t IS NOT NULL) THEN
        PERFORM contract_refuse(contract_join(at, CASE WHEN d IS NOT NULL THEN 'debounce' ELSE 'throttle' END), 'needs a key: it applies to the jobs of one key; add "key" (e.g. "customer-42")');
    END IF;
    IF u IS NOT NULL AND spec ->> 'idempotency_key' IS NULL THEN
        PERFORM contract_refuse(contract_join(at, 'unique_for'), 'needs an idempotency_key: it is how long the job''s idempotency key is held; add "idempotency_key" or leave unique_for out');
    END IF;
    IF d IS NULL AND t IS NULL AND u IS NULL THEN
        RETURN NULL;
    END IF;
    RETURN jsonb_strip_nulls(jsonb_build_object(
        'debounce', d::text || 'ms', 'debounce_max_wait', m::text || 'ms',
        'throttle', t::text || 'ms', 'unique_for', u::text || 'ms'));
END;
$$;

-- A checked spec's own windows in the form jobs.gate stores them (whole milliseconds), or
-- NULL when it has none.
CREATE FUNCTION job_gate_own(spec jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE
AS $$
    SELECT NULLIF(jsonb_strip_nulls(jsonb_build_object(
        'debounce_ms', left(spec ->> 'debounce', -2)::bigint,
        'max_wait_ms', left(spec ->> 'debounce_max_wait', -2)::bigint,
        'throttle_ms', left(spec ->> 'throttle', -2)::bigint,
        'unique_for_ms', left(spec ->> 'unique_for', -2)::bigint)), '{}'::jsonb)
$$;

-- What applies to a job of queue `q` (`jobs.gate`), or NULL: its own debounce or throttle
-- (`own`, jobs.gate's form) when it names one (it replaces its queue's debounce and
-- throttle), else its queue's as declared in queue_gates, for a job with a key (`job_key`);
-- its own unique_for, else its queue's, for a job with an idempotency key (`idem`). The
-- twin of contract::Gate::applied, which the workers use for the messages they claim.
CREATE FUNCTION job_gate(q text, own jsonb, job_key text, idem text) RETURNS jsonb
LANGUAGE sql STABLE
SET search_path FROM CURRENT
AS $$
    SELECT NULLIF(jsonb_strip_nulls(
        CASE WHEN own ? 'debounce_ms' OR own ? 'throttle_ms' THEN own - 'unique_for_ms'
             WHEN job_key IS NOT NULL
             THEN jsonb_build_object('debounce_ms', g.debounce_ms, 'max_wait_ms', g.max_wait_ms,
                                     'throttle_ms', g.throttle_ms)
             ELSE '{}'::jsonb END
        || jsonb_build_object('unique_for_ms',
                              CASE WHEN idem IS NOT NULL
                                   THEN COALESCE((own ->> 'unique_for_ms')::bigint,
                                                 g.unique_for_ms) END)), '{}'::jsonb)
    FROM (SELECT 1) AS one LEFT JOIN queue_gates g ON g.queue = q
$$;

-- The gate: for a new row whose `gate` is set, before it is inserted (see the header).
-- Serialised per (schema, queue, key) by a transaction-scoped advisory lock, so two doors
-- inserting jobs of one key at once decide one after the other (each statement of this
-- VOLATILE function sees what the other committed).
-- * unique_for: the holder of the idempotency key whose own unique_for has passed lets it go
--   (`idempotency_key_released`): the new row takes it. Otherwise the insert meets the
--   holder as it does today (ON CONFLICT: the same job).
-- * A row whose id or idempotency key exists already is left to the insert's conflict (a
--   redelivery must neither collapse nor throttle anything).
-- * throttle: a job of the key that was let through within the window → this one ends at
--   once, `cancelled`, last_error `throttled: ...`, gated_by the job that holds the window.
-- * debounce: the key's job still waiting for its quiet time (scheduled, not yet due) ends
--   `cancelled`, last_error `debounced: collapsed into <this job>`, gated_by this job; this
--   one takes its place, with the count (`debounced`) and the first one's arrival
--   (`debounce_since`), due when the key has been quiet for the window, at the latest
--   max_wait after that arrival. A waiting job that is due already is left to run.
-- Rows inserted ended (expired) or waiting for parents are not gated.
CREATE FUNCTION job_gate_insert() RETURNS trigger
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    g jsonb := NEW.gate;
    w bigint := (g ->> 'debounce_ms')::bigint;
    mw bigint := (g ->> 'max_wait_ms')::bigint;
    t bigint := (g ->> 'throttle_ms')::bigint;
    u bigint := (g ->> 'unique_for_ms')::bigint;
    prev record;
    since timestamptz;
BEGIN
    IF NEW.status NOT IN ('scheduled', 'queued', 'processing') THEN
        RETURN NEW;
    END IF;
    IF u IS NOT NULL AND NEW.idempotency_key IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(hashtextextended(
            format('jobwarden.unique_for/%s/%s/%s', current_schema(), NEW.queue, NEW.idempotency_key), 0));
        UPDATE jobs j
        SET idempotency_key_released = j.idempotency_key, idempotency_key = NULL,
            updated_at = now()
        WHERE j.queue = NEW.queue AND j.idempotency_key = NEW.idempotency_key AND j.id <> NEW.id
          AND j.gate ? 'unique_for_ms'
          AND j.created_at + (j.gate ->> 'unique_for_ms')::bigint * interval '1 millisecond' <= now();
    END IF;
    IF NEW.key IS NULL OR (w IS NULL AND t IS NULL) THEN
        RETURN NEW;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended(
        format('jobwarden.gate/%s/%s/%s', current_schema(), NEW.queue, NEW.key), 0));
    IF EXISTS (SELECT 1 FROM jobs j WHERE j.id = NEW.id)
       OR (NEW.idempotency_key IS NOT NULL
           AND EXISTS (SELECT 1 FROM jobs j WHERE j.queue = NEW.queue
                                              AND j.idempotency_key = NEW.idempotency_key)) THEN
        RETURN NEW;
    END IF;
    IF t IS NOT NULL THEN
        SELECT j.id, j.created_at INTO prev FROM jobs j
        WHERE j.queue = NEW.queue AND j.key = NEW.key AND j.gate IS NOT NULL
          AND j.gate ? 'throttle_ms' AND j.gated_by IS NULL
          AND j.created_at > now() - t * interval '1 millisecond'
        ORDER BY j.created_at DESC LIMIT 1;
        IF FOUND THEN
            NEW.status := 'cancelled';
            NEW.attempts := 0;
            NEW.worker_id := NULL;
            NEW.started_at := NULL;
            NEW.completed_at := now();
            NEW.parked := false;
            NEW.seq := NULL;
            NEW.gated_by := prev.id;
            NEW.last_error := format('throttled: key %s ran job %s at %s, within the throttle of %sms',
                                     NEW.key, prev.id, prev.created_at, t);
        END IF;
        RETURN NEW;
    END IF;
    SELECT j.id, j.debounced, j.debounce_since INTO prev FROM jobs j
    WHERE j.queue = NEW.queue AND j.key = NEW.key AND j.gate IS NOT NULL
      AND j.status = 'scheduled' AND j.debounce_since IS NOT NULL AND j.scheduled_at > now()
    ORDER BY j.created_at DESC LIMIT 1
    FOR UPDATE;
    since := now();
    IF FOUND THEN
        UPDATE jobs j
        SET status = 'cancelled', completed_at = now(), updated_at = now(), gated_by = NEW.id,
            last_error = format('debounced: collapsed into job %s', NEW.id),
            chain_pending = j.has_dependents
        WHERE j.id = prev.id;
        NEW.debounced := COALESCE(prev.debounced, 0) + 1;
        since := prev.debounce_since;
    END IF;
    NEW.debounce_since := since;
    NEW.status := 'scheduled';
    NEW.attempts := 0;
    NEW.worker_id := NULL;
    NEW.started_at := NULL;
    NEW.parked := false;
    NEW.seq := NULL;
    NEW.scheduled_at := greatest(NEW.scheduled_at,
                                 least(now() + w * interval '1 millisecond',
                                       since + COALESCE(mw, w + {{MAX_DELAY_MS}}) * interval '1 millisecond'));
    RETURN NEW;
END;
$$;

CREATE TRIGGER jobs_gate BEFORE INSERT ON jobs
    FOR EACH ROW WHEN (NEW.gate IS NOT NULL) EXECUTE FUNCTION job_gate_insert();

-- As version 20's, with debounce, debounce_max_wait, throttle and unique_for (checked last,
-- by contract_check_gate()).
CREATE OR REPLACE FUNCTION contract_check(spec jsonb, door text, payload_limit bigint, at text,
                               depth integer, budget integer,
                               OUT checked jsonb, OUT left_over integer)
LANGUAGE plpgsql IMMUTABLE
SET search_path FROM CURRENT
AS $$
DECLARE
    fields text[] := CASE door WHEN 'message' THEN ARRAY[{{V23_MESSAGE_FIELDS}}]
                               WHEN 'then' THEN ARRAY[{{V23_THEN_FIELDS}}]
                               ELSE ARRAY[{{V23_ENQUEUE_FIELDS}}] END;
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
    job_key text;
    gate jsonb;
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
    -- The key (version 20), checked last, as contract::check_spec does.
    job_key := contract_string(spec, at, 'key');
    IF job_key IS NOT NULL THEN
        PERFORM contract_check_job_key(job_key, contract_join(at, 'key'));
    END IF;
    -- Debounce, throttle, unique_for (version 23), after the key they need.
    gate := contract_check_gate(spec, door, at);
    IF gate IS NOT NULL THEN
        checked := checked || gate;
    END IF;
END;
$$;

DROP FUNCTION enqueue(text, jsonb, integer, timestamptz, integer, text, text, integer, jsonb,
                      text[], jsonb, timestamptz, text, text);

-- As version 20's, with the four windows (`debounce`, `debounce_max_wait`, `throttle`,
-- `unique_for`: duration texts, NULL for none), checked by job_check() with the rest; what
-- applies (the job's own, else its queue's as declared in queue_gates) is stored in
-- jobs.gate, and the gate trigger decides. A throttled job's id is returned as any other
-- (its row says `cancelled`, `throttled: ...`); a debounced one's is the job that will run
-- unless a later one of its key collapses it (its row then names that one in gated_by).
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
    expires_in text DEFAULT NULL,
    key text DEFAULT NULL,
    debounce text DEFAULT NULL,
    debounce_max_wait text DEFAULT NULL,
    throttle text DEFAULT NULL,
    unique_for text DEFAULT NULL
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
        'expires_in', enqueue.expires_in,
        'key', enqueue.key,
        'debounce', enqueue.debounce,
        'debounce_max_wait', enqueue.debounce_max_wait,
        'throttle', enqueue.throttle,
        'unique_for', enqueue.unique_for));
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
                      backoff, status, scheduled_at, then_jobs, pipeline, expires_at, key, gate)
    VALUES (new_id, enqueue.queue, enqueue.payload,
            COALESCE(enqueue.priority, {{DEFAULT_PRIORITY}}),
            COALESCE(enqueue.max_attempts, {{DEFAULT_SQL_MAX_ATTEMPTS}}),
            enqueue.timeout_ms, enqueue.idempotency_key, checked -> 'backoff',
            CASE WHEN parents IS NULL THEN 'scheduled' ELSE 'waiting' END,
            GREATEST(now(), COALESCE(enqueue.run_at, now())), checked -> 'then', chain, expiry,
            enqueue.key,
            job_gate(enqueue.queue, job_gate_own(checked), enqueue.key, enqueue.idempotency_key))
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