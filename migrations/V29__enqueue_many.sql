-- jobwarden schema, version 29: bulk enqueue. One call enqueues many jobs, each exactly as
-- `enqueue()` would (the same contract, chains, keys, debounce, idempotency), in the caller's
-- transaction: all of them or, when one member is refused, none, the error naming the
-- member (`jobs[17]`) and its field. Each member is a job spec, the fields of
-- `enqueue()`'s contract (docs/message-format.md: queue, payload, id, priority,
-- max_attempts, timeout_ms, idempotency_key, run_at_ms or delay_ms, backoff, then,
-- depends_on, expires_at_ms or expires_in, key, debounce, debounce_max_wait, throttle,
-- unique_for):
--
--   SELECT * FROM jobwarden.enqueue_many('[
--       {"queue": "email", "payload": {"to": "a@example.com"}, "id": "welcome-1"},
--       {"queue": "email", "payload": {"to": "b@example.com"}, "delay_ms": 60000}
--   ]');
--
-- Returns one row per member, in order: its position (from 1) and its job's id (an existing
-- job's, for a repeated id or idempotency key with the same payload, as `enqueue()`). The
-- jobs are published by the workers' schedulers once the transaction commits (one NOTIFY
-- wakes them), in batches.
--
-- Set-based: every member is checked by the contract (`contract_check()`, naming
-- `jobs[i].<field>`), then the plain ones (no `depends_on`, no debounce, throttle or
-- unique_for) are inserted by one INSERT ... SELECT, as `enqueue()` would insert each; the
-- others (a few, normally) go through `enqueue()` one by one, in order, after them (so a
-- member may depend on an earlier plain one).
CREATE FUNCTION enqueue_many(jobs jsonb) RETURNS TABLE (n integer, id text)
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
                          backoff, status, scheduled_at, then_jobs, pipeline, expires_at, key)
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
               u.c ->> 'key'
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
    IF cardinality(created) > 0 THEN
        -- Delivered on commit only, as enqueue()'s.
        PERFORM pg_notify('jobwarden_enqueue', current_schema());
    END IF;
    RETURN QUERY SELECT u.n, u.id FROM unnest(ns, out_ids) AS u(n, id) ORDER BY u.n;
END;
$$;
