-- jobwarden schema, version 14: one contract for what a job is, at every door.
--
-- THIS FILE IS A TEMPLATE. Every double-braced NAME is filled from the constants of src/contract.rs
-- when the migration runs (Store::migrate renders it), so the SQL checks and the Rust checks
-- read one source of truth. A property test (tests/contract.rs) gives the same random job
-- specs to both and requires the same verdict, naming the same field.
--
-- What changes:
-- * `job_check(spec, door, payload_limit)` checks a job spec (a JSON object with the
--   message envelope's field names, see docs/message-format.md) exactly as the workers'
--   decoder and the Rust client do, and raises the same named error (SQLSTATE 22023);
--   `enqueue()` runs it on its arguments before anything is stored. Before, enqueue()
--   accepted ids with a line break (the scheduler of every pod then panicked building the
--   message header), timeouts and backoffs no worker accepts (the job looped between
--   `queued` and a fresh dead row every sweep) and then trees of any depth.
-- * A backoff's durations are stored as nanoseconds ("1500000000ns"), a form every reader
--   of the row reads alike; whole numbers (priority 2.0) are stored as integers.
-- * Workers declare the payload limit they decode with (`workers.max_payload_bytes`); a
--   payload enqueued through SQL may not be larger than the smallest limit of the workers
--   alive (or the default, {{DEFAULT_MAX_PAYLOAD_BYTES}} bytes, when none is), measured as
--   PostgreSQL prints the payload.
-- * `chain_child_id(parent, n)`: the id a `then` job gets when its spec names none, cut at a
--   character boundary so it never exceeds {{MAX_ID_BYTES}} bytes (left() counted characters,
--   so a parent id of multi-byte characters made a child id the workers refuse).

ALTER TABLE workers ADD COLUMN max_payload_bytes integer;

-- The largest payload a worker alive decodes (the smallest of their limits).
CREATE FUNCTION contract_payload_limit() RETURNS bigint
LANGUAGE sql STABLE
SET search_path FROM CURRENT
AS $$
    SELECT COALESCE(min(w.max_payload_bytes), {{DEFAULT_MAX_PAYLOAD_BYTES}})
    FROM workers w
    WHERE w.stopped_at IS NULL AND w.max_payload_bytes IS NOT NULL
      AND w.heartbeat_at > now() - w.dead_after_ms * interval '1 millisecond'
$$;

CREATE FUNCTION contract_refuse(path text, reason text) RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    RAISE EXCEPTION 'jobwarden: field `%` is invalid: %', path, reason USING ERRCODE = '22023';
END;
$$;

CREATE FUNCTION contract_kind(v jsonb) RETURNS text
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE jsonb_typeof(v)
        WHEN 'null' THEN 'null' WHEN 'boolean' THEN 'a boolean' WHEN 'number' THEN 'a number'
        WHEN 'string' THEN 'a string' WHEN 'array' THEN 'an array' ELSE 'an object' END
$$;

CREATE FUNCTION contract_wrong(path text, expected text, got jsonb) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path FROM CURRENT
AS $$
BEGIN
    RAISE EXCEPTION 'jobwarden: field `%` must be %, found %', path, expected, contract_kind(got)
        USING ERRCODE = '22023';
END;
$$;

CREATE FUNCTION contract_join(at text, field text) RETURNS text
LANGUAGE sql IMMUTABLE
AS $$ SELECT CASE WHEN at = '' THEN field ELSE at || '.' || field END $$;

-- A character as errors name it: by code point when it is one an id may not hold.
CREATE FUNCTION contract_char(c text) RETURNS text
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE WHEN c ~ ('[{{ID_FORBIDDEN}}]' COLLATE "C") AND c NOT IN ('#', '/', '?')
                THEN 'U+' || upper(CASE WHEN ascii(c) < 4096 THEN lpad(to_hex(ascii(c)), 4, '0')
                                        ELSE to_hex(ascii(c)) END)
                ELSE '''' || c || '''' END
$$;

CREATE FUNCTION contract_check_id(id text, path text) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path FROM CURRENT
AS $$
DECLARE
    bad text;
BEGIN
    IF id = '' THEN
        PERFORM contract_refuse(path, 'must not be empty');
    END IF;
    IF octet_length(id) > {{MAX_ID_BYTES}} THEN
        PERFORM contract_refuse(path, format('is %s bytes long, the limit is {{MAX_ID_BYTES}}', octet_length(id)));
    END IF;
    bad := substring(id FROM ('[{{ID_FORBIDDEN}}]' COLLATE "C"));
    IF bad IS NOT NULL THEN
        PERFORM contract_refuse(path, format('contains %s; an id may not hold control characters, whitespace, invisible characters, / ? or #', contract_char(bad)));
    END IF;
    IF id IN ('.', '..') THEN
        PERFORM contract_refuse(path, format('%s cannot be an id (URL paths collapse it); add a letter or digit', to_jsonb(id)::text));
    END IF;
END;
$$;

CREATE FUNCTION contract_check_key(k text, path text) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path FROM CURRENT
AS $$
DECLARE
    bad text;
BEGIN
    IF octet_length(k) NOT BETWEEN 1 AND {{MAX_KEY_BYTES}} THEN
        PERFORM contract_refuse(path, format('is %s bytes long; a key is 1 to {{MAX_KEY_BYTES}} bytes', octet_length(k)));
    END IF;
    bad := substring(k FROM ('[{{KEY_FORBIDDEN}}]' COLLATE "C"));
    IF bad IS NOT NULL THEN
        PERFORM contract_refuse(path, format('contains %s; a key may not hold control or invisible characters', contract_char(bad)));
    END IF;
END;
$$;

CREATE FUNCTION contract_check_queue(q text, path text) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path FROM CURRENT
AS $$
BEGIN
    IF q !~ ('^[A-Za-z0-9_-]{1,{{MAX_QUEUE_BYTES}}}$' COLLATE "C") THEN
        PERFORM contract_refuse(path, format('queue name %s must be 1 to {{MAX_QUEUE_BYTES}} ASCII letters, digits, ''_'' or ''-'', e.g. "email"', to_jsonb(q)::text));
    END IF;
END;
$$;

-- A whole number (5, 5.0, 5e0) within [lo, hi]; NULL when absent or JSON null.
CREATE FUNCTION contract_whole(spec jsonb, at text, field text, lo numeric, hi numeric)
RETURNS bigint
LANGUAGE plpgsql IMMUTABLE
SET search_path FROM CURRENT
AS $$
DECLARE
    v jsonb := spec -> field;
    n numeric;
BEGIN
    IF v IS NULL OR jsonb_typeof(v) = 'null' THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(v) <> 'number' THEN
        PERFORM contract_wrong(contract_join(at, field), 'a whole number', v);
    END IF;
    n := v::text::numeric;
    IF n <> trunc(n) OR n NOT BETWEEN lo AND hi THEN
        PERFORM contract_refuse(contract_join(at, field), format('%s is not a whole number from %s to %s', v::text, lo, hi));
    END IF;
    RETURN n::bigint;
END;
$$;

CREATE FUNCTION contract_string(spec jsonb, at text, field text) RETURNS text
LANGUAGE plpgsql IMMUTABLE
SET search_path FROM CURRENT
AS $$
DECLARE
    v jsonb := spec -> field;
BEGIN
    IF v IS NULL OR jsonb_typeof(v) = 'null' THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(v) <> 'string' THEN
        PERFORM contract_wrong(contract_join(at, field), 'a string', v);
    END IF;
    RETURN v #>> '{}';
END;
$$;

-- A backoff duration in nanoseconds: terms of a number (at most {{MAX_DURATION_DIGITS}} digits, and
-- {{MAX_DURATION_DECIMALS}} after a point) and a unit, with spaces or tabs around them. The same scan as
-- contract::parse_duration_ns, character by character.
CREATE FUNCTION contract_duration_ns(t text, path text) RETURNS numeric
LANGUAGE plpgsql IMMUTABLE
SET search_path FROM CURRENT
AS $$
DECLARE
    n integer := length(t);
    i integer := 1;
    c text;
    int_part text;
    frac text;
    unit text;
    per numeric;
    total numeric := 0;
    terms integer := 0;
BEGIN
    IF octet_length(t) > {{MAX_DURATION_TEXT}} THEN
        PERFORM contract_refuse(path, format('is %s bytes long; write a duration of at most {{MAX_DURATION_TEXT}} bytes, e.g. "1h 30m"', octet_length(t)));
    END IF;
    LOOP
        WHILE i <= n AND substr(t, i, 1) IN (' ', E'\t') LOOP
            i := i + 1;
        END LOOP;
        EXIT WHEN i > n;
        int_part := '';
        WHILE i <= n AND ascii(substr(t, i, 1)) BETWEEN 48 AND 57 LOOP
            int_part := int_part || substr(t, i, 1);
            i := i + 1;
        END LOOP;
        frac := '';
        IF i <= n AND substr(t, i, 1) = '.' THEN
            i := i + 1;
            WHILE i <= n AND ascii(substr(t, i, 1)) BETWEEN 48 AND 57 LOOP
                frac := frac || substr(t, i, 1);
                i := i + 1;
            END LOOP;
            IF frac = '' THEN
                PERFORM contract_refuse(path, format('%s is not a duration: a digit must follow the point', to_jsonb(t)::text));
            END IF;
        END IF;
        IF int_part = '' THEN
            PERFORM contract_refuse(path, format('%s is not a duration: expected a number, e.g. "1s", "250ms" or "1h 30m"', to_jsonb(t)::text));
        END IF;
        IF length(int_part) > {{MAX_DURATION_DIGITS}} OR length(frac) > {{MAX_DURATION_DECIMALS}} THEN
            PERFORM contract_refuse(path, format('%s has a number with too many digits (at most {{MAX_DURATION_DIGITS}}, and {{MAX_DURATION_DECIMALS}} after the point)', to_jsonb(t)::text));
        END IF;
        WHILE i <= n AND substr(t, i, 1) IN (' ', E'\t') LOOP
            i := i + 1;
        END LOOP;
        unit := '';
        LOOP
            c := substr(t, i, 1);
            EXIT WHEN i > n OR ascii(c) BETWEEN 48 AND 57 OR c IN (' ', E'\t', '.');
            unit := unit || c;
            i := i + 1;
        END LOOP;
        SELECT u.ns INTO per FROM (VALUES {{DURATION_UNITS}}) AS u(name, ns) WHERE u.name = unit;
        IF per IS NULL THEN
            PERFORM contract_refuse(path, format('%s is not a duration: unknown unit %s; use ns, us, ms, s, m, h, d, w, M (months) or y, e.g. "1h 30m"', to_jsonb(t)::text, to_jsonb(unit)::text));
        END IF;
        total := total + int_part::numeric * per
                 + CASE WHEN frac = '' THEN 0 ELSE div(frac::numeric * per, 10::numeric ^ length(frac)) END;
        terms := terms + 1;
    END LOOP;
    IF terms = 0 THEN
        PERFORM contract_refuse(path, 'is empty; write a duration, e.g. "1s", "250ms" or "1h 30m"');
    END IF;
    RETURN total;
END;
$$;

-- A backoff object, checked; returned with its durations as nanoseconds.
CREATE FUNCTION contract_backoff(b jsonb, path text) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path FROM CURRENT
AS $$
DECLARE
    k text;
    kind text;
    base numeric;
    mx numeric;
    jitter float8 := 0;
    limit_ns numeric := {{MAX_DELAY_MS}}::numeric * 1000000;
BEGIN
    IF jsonb_typeof(b) <> 'object' THEN
        PERFORM contract_wrong(path, 'an object, e.g. {"kind":"exponential","base":"1s","max":"10m"}', b);
    END IF;
    SELECT key INTO k FROM jsonb_object_keys(b) AS key
    WHERE key NOT IN ('kind', 'base', 'max', 'jitter') ORDER BY key COLLATE "C" LIMIT 1;
    IF k IS NOT NULL THEN
        RAISE EXCEPTION 'jobwarden: field `%` is not a field of a backoff; the fields are kind, base, max, jitter',
            contract_join(path, k) USING ERRCODE = '22023';
    END IF;
    IF b -> 'kind' IS NULL OR jsonb_typeof(b -> 'kind') = 'null' THEN
        RAISE EXCEPTION 'jobwarden: field `%` is required', contract_join(path, 'kind') USING ERRCODE = '22023';
    END IF;
    kind := contract_string(b, path, 'kind');
    IF kind NOT IN ('fixed', 'linear', 'exponential') THEN
        PERFORM contract_refuse(contract_join(path, 'kind'), format('%s is not a backoff kind; use fixed, linear or exponential', to_jsonb(kind)::text));
    END IF;
    IF b -> 'base' IS NULL OR jsonb_typeof(b -> 'base') = 'null' THEN
        RAISE EXCEPTION 'jobwarden: field `%` is required', contract_join(path, 'base') USING ERRCODE = '22023';
    END IF;
    IF jsonb_typeof(b -> 'base') <> 'string' THEN
        PERFORM contract_wrong(contract_join(path, 'base'), 'a duration string, e.g. "1s"', b -> 'base');
    END IF;
    base := contract_duration_ns(b ->> 'base', contract_join(path, 'base'));
    IF base > limit_ns THEN
        PERFORM contract_refuse(contract_join(path, 'base'), format('%s is longer than {{MAX_DELAY_DAYS}} days, the longest delay', (b -> 'base')::text));
    END IF;
    IF b -> 'max' IS NULL OR jsonb_typeof(b -> 'max') = 'null' THEN
        mx := {{DEFAULT_BACKOFF_MAX_MS}}::numeric * 1000000;
    ELSIF jsonb_typeof(b -> 'max') <> 'string' THEN
        PERFORM contract_wrong(contract_join(path, 'max'), 'a duration string, e.g. "1s"', b -> 'max');
    ELSE
        mx := contract_duration_ns(b ->> 'max', contract_join(path, 'max'));
        IF mx > limit_ns THEN
            PERFORM contract_refuse(contract_join(path, 'max'), format('%s is longer than {{MAX_DELAY_DAYS}} days, the longest delay', (b -> 'max')::text));
        END IF;
    END IF;
    IF b -> 'jitter' IS NOT NULL AND jsonb_typeof(b -> 'jitter') <> 'null' THEN
        IF jsonb_typeof(b -> 'jitter') <> 'number' THEN
            PERFORM contract_wrong(contract_join(path, 'jitter'), 'a number', b -> 'jitter');
        END IF;
        jitter := (b ->> 'jitter')::float8;
        IF jitter NOT BETWEEN 0 AND 1 THEN
            PERFORM contract_refuse(contract_join(path, 'jitter'), format('%s is not a fraction from 0 to 1', (b -> 'jitter')::text));
        END IF;
    END IF;
    IF base = 0 AND kind <> 'fixed' THEN
        PERFORM contract_refuse(contract_join(path, 'base'), 'must be above zero for a linear or exponential backoff');
    END IF;
    IF mx < base THEN
        PERFORM contract_refuse(contract_join(path, 'max'), 'must not be below base (a backoff without max has a max of 1h)');
    END IF;
    RETURN jsonb_build_object('kind', kind, 'base', base::text || 'ns', 'max', mx::text || 'ns',
                              'jitter', jitter);
END;
$$;

-- Checks one spec at a door ('message', 'then' or 'enqueue'), and the `then` specs inside
-- it, depth first, as contract::check_spec does. Returns the spec as it is stored (whole
-- numbers as integers, backoffs with their durations in nanoseconds) and how many more
-- `then` jobs the tree may hold. Raises SQLSTATE 22023 naming the field.
CREATE FUNCTION contract_check(spec jsonb, door text, payload_limit bigint, at text,
                               depth integer, budget integer,
                               OUT checked jsonb, OUT left_over integer)
LANGUAGE plpgsql IMMUTABLE
SET search_path FROM CURRENT
AS $$
DECLARE
    fields text[] := CASE door WHEN 'message' THEN ARRAY[{{V14_MESSAGE_FIELDS}}]
                               WHEN 'then' THEN ARRAY[{{V14_THEN_FIELDS}}]
                               ELSE ARRAY[{{V14_ENQUEUE_FIELDS}}] END;
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
END;
$$;

-- Checks a job spec at a door; raises the named error (SQLSTATE 22023) or returns the spec as
-- stored. The SQL twin of contract::check_spec.
CREATE FUNCTION job_check(spec jsonb, door text DEFAULT 'enqueue',
                          payload_limit bigint DEFAULT NULL) RETURNS jsonb
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
AS $$
BEGIN
    IF spec IS NULL OR jsonb_typeof(spec) <> 'object' THEN
        RAISE EXCEPTION 'jobwarden: a job is a JSON object, not %', contract_kind(spec) USING ERRCODE = '22023';
    END IF;
    RETURN (contract_check(spec, door, payload_limit, '', 0, {{MAX_THEN_JOBS}})).checked;
END;
$$;

-- The id of the n-th `then` job of `parent` when its spec names none: "<parent>.<n>", or,
-- when that is over {{MAX_ID_BYTES}} bytes, the parent id cut to at most 100 bytes at a
-- character boundary, its md5 and n.
CREATE FUNCTION chain_child_id(parent text, n bigint) RETURNS text
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    head text := parent;
BEGIN
    IF octet_length(parent || '.' || n) <= {{MAX_ID_BYTES}} THEN
        RETURN parent || '.' || n;
    END IF;
    WHILE octet_length(head) > 100 LOOP
        head := left(head, -1);
    END LOOP;
    RETURN head || '.' || md5(parent) || '.' || n;
END;
$$;

DROP FUNCTION chain_spec_check(jsonb, text);

-- As version 8's, with every argument checked by job_check() first (NULL priority and
-- max_attempts mean the defaults, {{DEFAULT_PRIORITY}} and {{DEFAULT_SQL_MAX_ATTEMPTS}}).
CREATE OR REPLACE FUNCTION enqueue(
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
    spec jsonb;
    checked jsonb;
BEGIN
    IF enqueue.run_at IS NOT NULL AND NOT isfinite(enqueue.run_at) THEN
        PERFORM contract_refuse('run_at_ms', format('%s is not a time from 1970 to the end of 9999', enqueue.run_at));
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
        'depends_on', to_jsonb(enqueue.depends_on)));
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
                      backoff, status, scheduled_at, then_jobs, pipeline)
    VALUES (new_id, enqueue.queue, enqueue.payload,
            COALESCE(enqueue.priority, {{DEFAULT_PRIORITY}}),
            COALESCE(enqueue.max_attempts, {{DEFAULT_SQL_MAX_ATTEMPTS}}),
            enqueue.timeout_ms, enqueue.idempotency_key, checked -> 'backoff',
            CASE WHEN parents IS NULL THEN 'scheduled' ELSE 'waiting' END,
            GREATEST(now(), COALESCE(enqueue.run_at, now())), checked -> 'then', chain)
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
