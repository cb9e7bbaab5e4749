-- jobwarden schema, version 34: batches published over NATS. A message joins a batch by its
-- envelope's `batch` (a message's only; every member carries the same object):
--   {"payload": {...}, "batch": {"id": "newsletter-7", "size": 500,
--                                "on_complete": {"queue": "reports", "payload": {...}},
--                                "on_success": {...}}}
-- A batch enqueued through SQL (enqueue_batch()) has all its members at once: it is
-- `sealed`. One declared by messages is not: its first member to be claimed declares it
-- (size and callbacks: the workers' batch_join.sql), and it finishes once `size` members have come and
-- every one has ended (batch_finish()). No member updates a counter: the members are
-- counted once, when none is unfinished. A member is refused, and kept as a dead job that
-- says why, when its batch was enqueued through SQL, has finished already, or was declared
-- otherwise by its first member (that one joins the batch, dead: the batch does not wait for
-- it for ever). Retention keeps the members of an unfinished batch (prune_jobs.sql): a
-- member pruned would never be counted.

ALTER TABLE batches ADD COLUMN sealed boolean NOT NULL DEFAULT true;

-- A batch id: an id (its callbacks' ids are `<batch>.on_complete`, `<batch>.on_success`),
-- at most {{MAX_BATCH_ID_BYTES}} bytes. The twin of contract::check_batch_id.
CREATE FUNCTION contract_check_batch_id(id text, path text) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM contract_check_id(id, path);
    IF octet_length(id) > {{MAX_BATCH_ID_BYTES}} THEN
        PERFORM contract_refuse(path, format('is %s bytes long, the limit for a batch id is {{MAX_BATCH_ID_BYTES}} (its callbacks'' ids add ".on_complete" to it)', octet_length(id)));
    END IF;
END;
$$;

-- A batch's callback (`on_complete`, `on_success`) at `path`: NULL for none, else an
-- enqueue's spec that depends on nothing, checked (contract_check()'s `checked`).
CREATE FUNCTION contract_check_callback(cb jsonb, path text, payload_limit bigint) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path FROM CURRENT
AS $$
DECLARE
    checked jsonb;
BEGIN
    IF cb IS NULL OR jsonb_typeof(cb) = 'null' THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(cb) <> 'object' THEN
        PERFORM contract_wrong(path, 'an object', cb);
    END IF;
    SELECT cc.checked INTO checked
    FROM contract_check(cb, 'enqueue', payload_limit, path, 0, {{MAX_THEN_JOBS}}) AS cc;
    IF cb -> 'depends_on' IS NOT NULL AND jsonb_typeof(cb -> 'depends_on') <> 'null' THEN
        PERFORM contract_refuse(contract_join(path, 'depends_on'), 'a callback runs when its batch has ended: it depends on nothing else');
    END IF;
    RETURN checked;
END;
$$;

-- A message's `batch` at `at`: {"id", "size", "on_complete", "on_success"}. The twin of
-- contract::check_batch. Returns it checked.
CREATE FUNCTION contract_check_batch(b jsonb, at text, payload_limit bigint) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE
SET search_path FROM CURRENT
AS $$
DECLARE
    k text;
    id text;
    size numeric;
    cb jsonb;
    out jsonb;
BEGIN
    IF jsonb_typeof(b) <> 'object' THEN
        PERFORM contract_wrong(at, 'an object, e.g. {"id": "newsletter-7", "size": 500}', b);
    END IF;
    SELECT x INTO k FROM jsonb_object_keys(b) AS x
    WHERE x <> ALL (ARRAY['id', 'size', 'on_complete', 'on_success'])
    ORDER BY x COLLATE "C" LIMIT 1;
    IF k IS NOT NULL THEN
        RAISE EXCEPTION 'jobwarden: field `%` is not a field of a batch; the fields are id, size, on_complete, on_success',
            contract_join(at, k) USING ERRCODE = '22023';
    END IF;
    id := contract_string(b, at, 'id');
    IF id IS NULL THEN
        RAISE EXCEPTION 'jobwarden: field `%` is required', contract_join(at, 'id') USING ERRCODE = '22023';
    END IF;
    PERFORM contract_check_batch_id(id, contract_join(at, 'id'));
    size := contract_whole(b, at, 'size', 1, {{MAX_BATCH_SIZE}});
    IF size IS NULL THEN
        RAISE EXCEPTION 'jobwarden: field `%` is required', contract_join(at, 'size') USING ERRCODE = '22023';
    END IF;
    out := jsonb_build_object('id', id, 'size', size);
    FOREACH k IN ARRAY ARRAY['on_complete', 'on_success'] LOOP
        cb := contract_check_callback(b -> k, contract_join(at, k), payload_limit);
        IF cb IS NOT NULL THEN
            out := out || jsonb_build_object(k, cb);
        END IF;
    END LOOP;
    RETURN out;
END;
$$;

-- contract_check() as version 23 made it, under another name: the version below checks a
-- message's `batch` around it.
ALTER FUNCTION contract_check(jsonb, text, bigint, text, integer, integer)
    RENAME TO contract_check_v23;

-- As version 23's, and a message's `batch` (checked last, as contract::check_spec does).
CREATE FUNCTION contract_check(spec jsonb, door text, payload_limit bigint, at text,
                               depth integer, budget integer,
                               OUT checked jsonb, OUT left_over integer)
LANGUAGE plpgsql IMMUTABLE
SET search_path FROM CURRENT
AS $$
DECLARE
    fields text[] := ARRAY[{{V34_MESSAGE_FIELDS}}];
    k text;
BEGIN
    IF door <> 'message' THEN
        SELECT * INTO checked, left_over FROM contract_check_v23(spec, door, payload_limit, at, depth, budget);
        RETURN;
    END IF;
    SELECT f INTO k FROM jsonb_object_keys(spec) AS f
    WHERE f <> ALL (fields) ORDER BY f COLLATE "C" LIMIT 1;
    IF k IS NOT NULL THEN
        RAISE EXCEPTION 'jobwarden: field `%` is not a field of a message''s envelope; the fields are %',
            contract_join(at, k), array_to_string(fields, ', ') USING ERRCODE = '22023';
    END IF;
    SELECT * INTO checked, left_over
    FROM contract_check_v23(spec - 'batch', door, payload_limit, at, depth, budget);
    IF spec -> 'batch' IS NOT NULL AND jsonb_typeof(spec -> 'batch') <> 'null' THEN
        checked := checked || jsonb_build_object('batch',
            contract_check_batch(spec -> 'batch', contract_join(at, 'batch'), payload_limit));
    END IF;
END;
$$;

-- As version 32's, the batch's id checked as an id (its callbacks' ids are made of it), the
-- callbacks by contract_check_callback().
CREATE OR REPLACE FUNCTION enqueue_batch(spec jsonb) RETURNS text
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
    IF spec -> 'id' IS NOT NULL AND jsonb_typeof(spec -> 'id') <> 'null' THEN
        PERFORM contract_check_batch_id(contract_string(spec, 'batch', 'id'), 'batch.id');
    END IF;
    b := COALESCE(NULLIF(spec ->> 'id', ''), gen_random_uuid()::text);
    IF EXISTS (SELECT 1 FROM batches WHERE id = b) THEN
        RAISE EXCEPTION 'jobwarden.enqueue_batch: batch % already exists', quote_literal(b)
            USING ERRCODE = '23505', HINT = 'give each batch its own id (or none: one is made up)';
    END IF;
    FOREACH k IN ARRAY ARRAY['on_complete', 'on_success'] LOOP
        cb := contract_check_callback(spec -> k, 'batch.' || k, lim);
        IF cb IS NOT NULL THEN
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

-- As version 32's, and a batch declared by messages (not sealed) finishes only once every
-- member it declared has come.
CREATE OR REPLACE FUNCTION batch_finish(lim integer) RETURNS TABLE (id text, callbacks text[])
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
          -- (In this order: the members are counted only for a batch none of whose members
          -- is unfinished.)
          AND CASE WHEN EXISTS (SELECT 1 FROM jobs j
                                WHERE j.batch = x.id
                                  AND j.status NOT IN ('completed', 'dead', 'cancelled'))
                   THEN false
                   -- A batch declared by messages: every member it declared has come.
                   ELSE x.sealed OR (SELECT count(*) FROM jobs j WHERE j.batch = x.id) >= x.size
              END
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
