-- jobwarden schema, version 32: batches. A batch is a set of jobs enqueued together (one
-- call: SQL `enqueue_batch()`, `jobwarden enqueue-batch`, `Client::enqueue_batch`) with
-- callback jobs that run once when every member has ended:
--   * on_complete: whatever became of the members;
--   * on_success: only when every member completed.
-- Each callback receives the batch's outcome as its parents' results (`parents`, as a job
-- that follows others does): {"<batch id>": {"batch", "size", "completed", "dead",
-- "cancelled", "pruned", "failed": [ids of dead or cancelled members, at most 1,000],
-- "failed_omitted": <how many more>}}.
--
-- No member updates a counter as it ends (a counter row would serialize every member's end
-- behind one lock): members carry their batch's id (`jobs.batch`, indexed for members only),
-- and each pod's scheduler, once a second, looks for open batches with no unfinished member
-- left (one probe of a partial index per open batch) and finishes them — the counts read
-- once, the callbacks enqueued, `finished_at` set, under the batch row's lock, so a batch
-- finishes once however many pods look.
--
--   SELECT jobwarden.enqueue_batch('{
--       "id": "newsletter-2026-11",
--       "jobs": [{"queue": "email", "payload": {"to": "a@example.com"}}, ...],
--       "on_complete": {"queue": "reports", "payload": {"report": "newsletter"}}
--   }');

ALTER TABLE jobs ADD COLUMN batch text COLLATE "C";
-- A batch's members (its progress, its counts when it finishes).
CREATE INDEX jobs_batch ON jobs (batch) WHERE batch IS NOT NULL;
-- A batch's unfinished members: empty once every member has ended.
CREATE INDEX jobs_batch_open ON jobs (batch)
    WHERE batch IS NOT NULL AND status NOT IN ('completed', 'dead', 'cancelled');

CREATE TABLE batches (
    id          text        COLLATE "C" PRIMARY KEY,
    size        integer     NOT NULL,   -- members enqueued
    on_complete jsonb,                  -- callback specs, as the contract checked them
    on_success  jsonb,
    created_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,            -- when the last member had ended (callbacks enqueued)
    outcome     jsonb,                  -- the counts and failed ids, at finish
    callbacks   text[]                  -- the callback jobs enqueued
);
CREATE INDEX batches_open ON batches (created_at) WHERE finished_at IS NULL;

DROP FUNCTION enqueue_many(jsonb);
CREATE FUNCTION enqueue_many(jobs jsonb, batch_id text DEFAULT NULL) RETURNS TABLE (n integer, id text)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    dup record;
    bad record;
    lim bigint := contract_payload_limit();
    ns integer[];
    cs jsonb[];
    ids text[];
    slows boolean[];
    created text[];
    out_ids text[];
    i integer;
BEGIN
    IF jobs IS NULL OR jsonb_typeof(jobs) <> 'array' THEN
        PERFORM contract_wrong('jobs', 'a JSON array of jobs, e.g. ''[{"queue": "email", "payload": {}}]''', jobs);
    END IF;
    IF jsonb_array_length(jobs) = 0 THEN
        PERFORM contract_refuse('jobs', 'holds no job: give at least one');
    END IF;
    IF jsonb_array_length(jobs) > {{MAX_ENQUEUE_MANY}} THEN
        PERFORM contract_refuse('jobs', format('holds %s jobs; one call takes at most {{MAX_ENQUEUE_MANY}} (call it again in the same transaction for more)', jsonb_array_length(jobs)));
    END IF;
    SELECT e.n, e.value INTO bad
    FROM jsonb_array_elements(jobs) WITH ORDINALITY AS e(value, n)
    WHERE jsonb_typeof(e.value) <> 'object'
    ORDER BY e.n LIMIT 1;
    IF bad.n IS NOT NULL THEN
        PERFORM contract_wrong(format('jobs[%s]', bad.n), 'a job (a JSON object)', bad.value);
    END IF;
    -- Two members with one id are a mistake in the batch, not a repeat of an earlier call.
    SELECT min(e.n) AS first, max(e.n) AS second, e.value ->> 'id' AS job INTO dup
    FROM jsonb_array_elements(jobs) WITH ORDINALITY AS e(value, n)
    WHERE jsonb_typeof(e.value -> 'id') = 'string'
    GROUP BY e.value ->> 'id'
    HAVING count(*) > 1
    ORDER BY min(e.n)
    LIMIT 1;
    IF dup.job IS NOT NULL THEN
        PERFORM contract_refuse(format('jobs[%s].id', dup.second),
            format('%s is also the id of jobs[%s]: give each job of one call its own id', quote_literal(dup.job), dup.first));
    END IF;

    -- Every member checked (an error names jobs[i] and its field), its id decided, and
    -- whether it takes enqueue()'s own path (it waits for parents, or has a gate).
    SELECT array_agg(m.n ORDER BY m.n), array_agg(m.c ORDER BY m.n),
           array_agg(COALESCE(m.c ->> 'id', gen_random_uuid()::text) ORDER BY m.n),
           array_agg(m.c -> 'depends_on' IS NOT NULL OR m.g IS NOT NULL ORDER BY m.n)
    INTO ns, cs, ids, slows
    FROM (SELECT k.n::integer AS n, k.c,
                 job_gate(k.c ->> 'queue', job_gate_own(k.c), k.c ->> 'key',
                          k.c ->> 'idempotency_key') AS g
          -- The check in FROM: evaluated once per member (a call in a subquery's select
          -- list would be inlined into each use of its result).
          FROM (SELECT e.n, cc.checked AS c
                FROM jsonb_array_elements(jobs) WITH ORDINALITY AS e(value, n),
                     LATERAL contract_check(e.value, 'enqueue', lim, format('jobs[%s]', e.n), 0,
                                            {{MAX_THEN_JOBS}}) AS cc) k) m;

    -- The plain members, in one statement, each as enqueue() inserts one.
    WITH ins AS (
        INSERT INTO jobs (id, queue, payload, priority, max_attempts, timeout_ms, idempotency_key,
                          backoff, status, scheduled_at, then_jobs, pipeline, expires_at, key,
                          batch)
        SELECT u.id, u.c ->> 'queue', u.c -> 'payload',
               COALESCE((u.c ->> 'priority')::int2, {{DEFAULT_PRIORITY}}),
               COALESCE((u.c ->> 'max_attempts')::int4, {{DEFAULT_SQL_MAX_ATTEMPTS}}),
               (u.c ->> 'timeout_ms')::int4, u.c ->> 'idempotency_key', u.c -> 'backoff',
               'scheduled',
               GREATEST(now(), COALESCE(to_timestamp((u.c ->> 'run_at_ms')::float8 / 1000),
                                        now() + (u.c ->> 'delay_ms')::int8 * interval '1 millisecond',
                                        now())),
               u.c -> 'then', CASE WHEN u.c -> 'then' IS NOT NULL THEN u.id END,
               COALESCE(to_timestamp((u.c ->> 'expires_at_ms')::float8 / 1000),
                        now() + left(u.c ->> 'expires_in', -2)::int8 * interval '1 millisecond'),
               u.c ->> 'key', batch_id
        FROM unnest(ns, cs, ids, slows) AS u(n, c, id, slow)
        WHERE NOT u.slow
        ORDER BY u.n
        ON CONFLICT DO NOTHING
        RETURNING jobs.id
    )
    SELECT array_agg(ins.id) INTO created FROM ins;
    created := COALESCE(created, '{}');

    -- Plain members not inserted: their id or idempotency key is taken. The same payload is
    -- the same job (its id comes back); another payload refuses the call, as enqueue().
    out_ids := ids;
    FOR bad IN
        SELECT u.n, u.id AS wanted, u.c, h.id AS holder, h.payload = u.c -> 'payload' AS same
        FROM unnest(ns, cs, ids, slows) AS u(n, c, id, slow)
             LEFT JOIN LATERAL (
                 SELECT j.id, j.payload FROM jobs j
                 WHERE j.id = u.id
                    OR (j.queue = u.c ->> 'queue' AND j.idempotency_key = u.c ->> 'idempotency_key')
                 ORDER BY (j.id = u.id) DESC
                 LIMIT 1) h ON true
        -- (None, in the common case: every plain member was inserted.)
        WHERE cardinality(created) < (SELECT count(*) FROM unnest(slows) AS x(s) WHERE NOT x.s)
          AND NOT u.slow AND u.id NOT IN (SELECT unnest(created))
        ORDER BY u.n
    LOOP
        IF bad.same IS NOT TRUE THEN
            IF bad.holder IS NOT DISTINCT FROM bad.wanted THEN
                RAISE EXCEPTION 'jobwarden.enqueue_many: jobs[%]: job id % already belongs to a job with another payload; use a new id, or the same payload to get job % back',
                    bad.n, quote_literal(bad.wanted), bad.wanted USING ERRCODE = '23505';
            END IF;
            RAISE EXCEPTION 'jobwarden.enqueue_many: jobs[%]: idempotency key % of queue % already belongs to job % with another payload; use a new key for a different job, or the same payload to get job % back',
                bad.n, quote_literal(bad.c ->> 'idempotency_key'), bad.c ->> 'queue', bad.holder,
                bad.holder USING ERRCODE = '23505';
        END IF;
        out_ids[bad.n] := bad.holder;
    END LOOP;

    -- The others (depends_on, debounce, throttle, unique_for): enqueue() each, in order,
    -- with the member's own fields.
    i := 0;
    BEGIN
        FOR i IN SELECT u.n FROM unnest(ns, slows) AS u(n, slow) WHERE u.slow ORDER BY u.n LOOP
            out_ids[i] := enqueue(
                queue => cs[i] ->> 'queue',
                payload => cs[i] -> 'payload',
                priority => COALESCE((cs[i] ->> 'priority')::integer, {{DEFAULT_PRIORITY}}),
                run_at => CASE
                    WHEN cs[i] ? 'run_at_ms'
                        THEN to_timestamp((cs[i] ->> 'run_at_ms')::float8 / 1000)
                    WHEN cs[i] ? 'delay_ms'
                        THEN now() + (cs[i] ->> 'delay_ms')::bigint * interval '1 millisecond'
                    END,
                max_attempts => COALESCE((cs[i] ->> 'max_attempts')::integer,
                                         {{DEFAULT_SQL_MAX_ATTEMPTS}}),
                idempotency_key => cs[i] ->> 'idempotency_key',
                id => ids[i],
                timeout_ms => (cs[i] ->> 'timeout_ms')::integer,
                backoff => jobs -> (i - 1) -> 'backoff',
                depends_on => CASE WHEN jsonb_typeof(cs[i] -> 'depends_on') = 'array'
                                   THEN ARRAY(SELECT jsonb_array_elements_text(cs[i] -> 'depends_on'))
                              END,
                then_jobs => jobs -> (i - 1) -> 'then',
                expires_at => to_timestamp((cs[i] ->> 'expires_at_ms')::float8 / 1000),
                expires_in => jobs -> (i - 1) ->> 'expires_in',
                key => cs[i] ->> 'key',
                debounce => jobs -> (i - 1) ->> 'debounce',
                debounce_max_wait => jobs -> (i - 1) ->> 'debounce_max_wait',
                throttle => jobs -> (i - 1) ->> 'throttle',
                unique_for => jobs -> (i - 1) ->> 'unique_for');
        END LOOP;
    EXCEPTION WHEN OTHERS THEN
        -- One block for the whole loop (not a subtransaction per member).
        RAISE EXCEPTION 'jobwarden.enqueue_many: jobs[%]: %', i, SQLERRM USING ERRCODE = SQLSTATE;
    END;
    IF batch_id IS NOT NULL THEN
        -- The members enqueue() inserted (the few that wait for parents or have a gate).
        UPDATE jobs j SET batch = batch_id
        FROM unnest(ns, slows, out_ids) AS u(n, slow, id)
        WHERE u.slow AND j.id = u.id AND j.batch IS NULL;
    END IF;
    IF cardinality(created) > 0 THEN
        -- Delivered on commit only, as enqueue()'s.
        PERFORM pg_notify('jobwarden_enqueue', current_schema());
    END IF;
    RETURN QUERY SELECT u.n, u.id FROM unnest(ns, out_ids) AS u(n, id) ORDER BY u.n;
END;
$$;


-- Enqueues a batch: {"id": optional, "jobs": [job specs, as enqueue_many()'s], "on_complete":
-- optional job spec, "on_success": optional job spec}. All or nothing, in the caller's
-- transaction. Returns the batch's id.
CREATE FUNCTION enqueue_batch(spec jsonb) RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    b text;
    members jsonb;
    lim bigint := contract_payload_limit();
    cb jsonb;
    checked jsonb := '{}';
    k text;
    n integer;
BEGIN
    IF spec IS NULL OR jsonb_typeof(spec) <> 'object' THEN
        PERFORM contract_wrong('batch', 'a JSON object {"jobs": [...], "on_complete": {...}}', spec);
    END IF;
    SELECT string_agg(x, ', ') INTO k FROM jsonb_object_keys(spec) AS x
    WHERE x NOT IN ('id', 'jobs', 'on_complete', 'on_success');
    IF k IS NOT NULL THEN
        PERFORM contract_refuse('batch', format('has unknown field(s) %s: a batch has id, jobs, on_complete and on_success', k));
    END IF;
    members := spec -> 'jobs';
    IF members IS NULL OR jsonb_typeof(members) <> 'array' THEN
        PERFORM contract_wrong('batch.jobs', 'a JSON array of jobs', members);
    END IF;
    IF jsonb_array_length(members) = 0 THEN
        PERFORM contract_refuse('batch.jobs', 'holds no job: a batch needs at least one member');
    END IF;
    IF spec ? 'id' AND (jsonb_typeof(spec -> 'id') <> 'string' OR spec ->> 'id' = ''
                        OR octet_length(spec ->> 'id') > {{MAX_ID_BYTES}} - 16
                        OR spec ->> 'id' ~ '[[:cntrl:]]') THEN
        PERFORM contract_wrong('batch.id', 'a text of 1 to ' || ({{MAX_ID_BYTES}} - 16) || ' bytes without control characters', spec -> 'id');
    END IF;
    b := COALESCE(spec ->> 'id', gen_random_uuid()::text);
    IF EXISTS (SELECT 1 FROM batches WHERE id = b) THEN
        RAISE EXCEPTION 'jobwarden.enqueue_batch: batch % already exists', quote_literal(b)
            USING ERRCODE = '23505', HINT = 'give each batch its own id (or none: one is made up)';
    END IF;
    FOREACH k IN ARRAY ARRAY['on_complete', 'on_success'] LOOP
        cb := spec -> k;
        IF cb IS NOT NULL AND cb <> 'null' THEN
            SELECT cc.checked INTO cb
            FROM contract_check(cb, 'enqueue', lim, 'batch.' || k, 0, {{MAX_THEN_JOBS}}) AS cc;
            IF cb ? 'depends_on' THEN
                PERFORM contract_refuse('batch.' || k || '.depends_on', 'a callback runs when its batch has ended: it depends on nothing else');
            END IF;
            checked := checked || jsonb_build_object(k, spec -> k);
        END IF;
    END LOOP;
    INSERT INTO batches (id, size, on_complete, on_success)
    VALUES (b, 0, checked -> 'on_complete', checked -> 'on_success');
    SELECT count(DISTINCT m.id) INTO n FROM enqueue_many(members, b) AS m;
    -- Members that were already jobs (a repeated id or idempotency key) stay in their own
    -- batch, or none: the size counts the ones that joined.
    UPDATE batches SET size = (SELECT count(*) FROM jobs j WHERE j.batch = b) WHERE id = b;
    RETURN b;
EXCEPTION WHEN OTHERS THEN
    RAISE EXCEPTION '%', replace(SQLERRM, 'jobwarden.enqueue_many: jobs[', 'jobwarden.enqueue_batch: jobs[')
        USING ERRCODE = SQLSTATE;
END;
$$;

-- A batch's progress: members by status (counted over the batch's own index entries).
CREATE FUNCTION batch_progress(batch_id text)
RETURNS TABLE (size integer, waiting int8, running int8, completed int8, dead int8,
               cancelled int8, finished_at timestamptz, callbacks text[], outcome jsonb)
LANGUAGE sql STABLE
SET search_path FROM CURRENT
AS $$
    SELECT b.size,
           count(j.id) FILTER (WHERE j.status IN ('waiting', 'queued', 'scheduled')),
           count(j.id) FILTER (WHERE j.status IN ('processing', 'awaiting')),
           count(j.id) FILTER (WHERE j.status = 'completed'),
           count(j.id) FILTER (WHERE j.status = 'dead'),
           count(j.id) FILTER (WHERE j.status = 'cancelled'),
           b.finished_at, b.callbacks, b.outcome
    FROM batches b LEFT JOIN jobs j ON j.batch = b.id
    WHERE b.id = batch_id
    GROUP BY b.id
$$;

-- The scheduler's batch round: finishes up to `lim` open batches none of whose members is
-- unfinished (rows another pod holds are skipped): counts read once, the callbacks enqueued
-- (ids `<batch>.on_complete` and `<batch>.on_success` unless their specs name one) with the
-- outcome as their parents' results, `finished_at` set. Returns each finished batch's id and
-- its callbacks.
CREATE FUNCTION batch_finish(lim integer) RETURNS TABLE (id text, callbacks text[])
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    b batches;
    o jsonb;
    done int8;
    dead_n int8;
    cancelled_n int8;
    failed text[];
    failed_n int8;
    cbs text[];
    cb_id text;
    k text;
BEGIN
    FOR b IN
        SELECT * FROM batches x
        WHERE x.finished_at IS NULL
          AND NOT EXISTS (SELECT 1 FROM jobs j
                          WHERE j.batch = x.id
                            AND j.status NOT IN ('completed', 'dead', 'cancelled'))
        ORDER BY x.created_at
        LIMIT lim
        FOR UPDATE SKIP LOCKED
    LOOP
        SELECT count(*) FILTER (WHERE j.status = 'completed'),
               count(*) FILTER (WHERE j.status = 'dead'),
               count(*) FILTER (WHERE j.status = 'cancelled')
        INTO done, dead_n, cancelled_n
        FROM jobs j WHERE j.batch = b.id;
        SELECT array_agg(f.id ORDER BY f.id) INTO failed
        FROM (SELECT j.id FROM jobs j
              WHERE j.batch = b.id AND j.status IN ('dead', 'cancelled')
              ORDER BY j.id LIMIT 1000) f;
        failed_n := dead_n + cancelled_n;
        o := jsonb_build_object(
            'batch', b.id, 'size', b.size, 'completed', done, 'dead', dead_n,
            'cancelled', cancelled_n,
            -- Members pruned by retention before the batch ended (they had ended).
            'pruned', GREATEST(b.size - done - dead_n - cancelled_n, 0),
            'failed', COALESCE(to_jsonb(failed), '[]'),
            'failed_omitted', GREATEST(failed_n - 1000, 0));
        cbs := '{}';
        BEGIN
        FOREACH k IN ARRAY ARRAY['on_complete', 'on_success'] LOOP
            CONTINUE WHEN (CASE k WHEN 'on_complete' THEN b.on_complete ELSE b.on_success END) IS NULL;
            CONTINUE WHEN k = 'on_success' AND done < b.size;
            cb_id := COALESCE(CASE k WHEN 'on_complete' THEN b.on_complete ELSE b.on_success END ->> 'id',
                              b.id || '.' || k);
            SELECT m.id INTO cb_id
            FROM enqueue_many(jsonb_build_array(
                     (CASE k WHEN 'on_complete' THEN b.on_complete ELSE b.on_success END)
                     || jsonb_build_object('id', cb_id))) AS m;
            UPDATE jobs j SET parent_results = jsonb_build_object(b.id, o) WHERE j.id = cb_id;
            cbs := cbs || cb_id;
        END LOOP;
        EXCEPTION WHEN OTHERS THEN
            -- A callback PostgreSQL refuses (its id taken by another job with another payload):
            -- the batch finishes without it, saying why, rather than hold up every other batch.
            o := o || jsonb_build_object('callback_error', SQLERRM);
            cbs := '{}';
        END;
        UPDATE batches x SET finished_at = now(), outcome = o, callbacks = cbs WHERE x.id = b.id;
        id := b.id;
        callbacks := cbs;
        RETURN NEXT;
    END LOOP;
END;
$$;
