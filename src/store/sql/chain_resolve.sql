-- One round of chain resolution: for jobs that ended with dependents (chain_pending), create
-- the `then` jobs of the completed ones and decide their waiting children. A child whose
-- parents all completed becomes due now; one with a dead parent is dead, with a cancelled
-- parent cancelled (and is itself pending, so its own children follow next round). Rows are
-- locked with SKIP LOCKED, so several workers' schedulers share the work. A job created or
-- made due here carries its parents' results (`parent_results`, version 28).
-- $1 most parents per round; $2 one parent only (NULL: any). Returns how many parents it took, jobs it created and children it
-- decided, and the children it dead-lettered (ids, queues, reasons).
WITH parents AS (
    SELECT id, status, then_jobs, COALESCE(pipeline, id) AS pipeline, traceparent
    FROM jobs
    WHERE chain_pending AND ($2::text IS NULL OR id = $2::text)
    ORDER BY id
    LIMIT $1
    FOR UPDATE SKIP LOCKED
),
specs AS (
    SELECT p.id AS parent, p.pipeline, p.traceparent, e.spec,
           -- A derived id stays within the bytes an id may have (migration V14).
           COALESCE(e.spec ->> 'id', chain_child_id(p.id, e.n)) AS id
    FROM parents p, jsonb_array_elements(p.then_jobs) WITH ORDINALITY AS e(spec, n)
    WHERE p.status = 'completed' AND p.then_jobs IS NOT NULL
),
created AS (
    INSERT INTO jobs (id, queue, payload, priority, max_attempts, timeout_ms, idempotency_key,
                      backoff, status, scheduled_at, then_jobs, pipeline, expires_at, key, gate,
                      parent_results, traceparent)
    SELECT s.id, s.spec ->> 'queue', s.spec -> 'payload',
           COALESCE((s.spec ->> 'priority')::int2, 5),
           COALESCE((s.spec ->> 'max_attempts')::int4, 5),
           (s.spec ->> 'timeout_ms')::int4, s.spec ->> 'idempotency_key', s.spec -> 'backoff',
           'scheduled',
           now() + COALESCE((s.spec ->> 'delay_ms')::int8, 0) * interval '1 millisecond',
           s.spec -> 'then', s.pipeline,
           -- Checked specs hold expires_in as whole milliseconds ("3600000ms").
           now() + left(s.spec ->> 'expires_in', -2)::int8 * interval '1 millisecond',
           s.spec ->> 'key',
           -- Debounce, throttle, unique_for (version 23): the spec's, else its queue's.
           job_gate(s.spec ->> 'queue', job_gate_own(s.spec), s.spec ->> 'key',
                    s.spec ->> 'idempotency_key'),
           -- Its parent's result (version 28).
           job_parent_results(ARRAY[s.parent]),
           -- Its parent's trace: the parent's traced run when there was one (written by the
           -- settle), else the parent's own traceparent. A pipeline is one trace.
           s.traceparent
    FROM specs s
    ON CONFLICT DO NOTHING
    RETURNING id
),
lineage AS (
    INSERT INTO job_deps (parent, child)
    SELECT s.parent, s.id FROM specs s
    WHERE s.id IN (SELECT id FROM created)
    ON CONFLICT DO NOTHING
),
verdict AS (
    SELECT d.child AS id,
           bool_and(pp.status = 'completed') AS ready,
           array_agg(pp.id) AS parents,
           min(pp.id) FILTER (WHERE pp.status = 'cancelled') AS cancelled_by,
           min(pp.id) FILTER (WHERE pp.status = 'dead') AS dead_by
    FROM job_deps d
    JOIN jobs pp ON pp.id = d.parent
    WHERE d.child IN (SELECT k.child FROM job_deps k JOIN parents p ON p.id = k.parent)
    GROUP BY d.child
),
decided AS (
    UPDATE jobs c
    SET status = CASE WHEN v.cancelled_by IS NOT NULL THEN 'cancelled'
                      WHEN v.dead_by IS NOT NULL THEN 'dead'
                      ELSE 'scheduled' END,
        scheduled_at = CASE WHEN v.ready THEN GREATEST(c.scheduled_at, now()) ELSE c.scheduled_at END,
        completed_at = CASE WHEN v.ready THEN NULL ELSE now() END,
        blocked_by = COALESCE(v.cancelled_by, v.dead_by),
        last_error = CASE WHEN v.cancelled_by IS NOT NULL
                          THEN 'parent ' || v.cancelled_by || ' was cancelled'
                          WHEN v.dead_by IS NOT NULL THEN 'parent ' || v.dead_by || ' is dead'
                          ELSE c.last_error END,
        chain_pending = NOT v.ready AND c.has_dependents,
        -- Its parents' results (version 28).
        parent_results = CASE WHEN v.ready THEN job_parent_results(v.parents)
                              ELSE c.parent_results END,
        updated_at = now()
    FROM verdict v
    WHERE c.id = v.id AND c.status = 'waiting'
      AND (v.ready OR v.cancelled_by IS NOT NULL OR v.dead_by IS NOT NULL)
    RETURNING c.id, c.status, c.queue, c.last_error
),
cleared AS (
    UPDATE jobs j
    SET chain_pending = false, pipeline = COALESCE(j.pipeline, CASE WHEN j.then_jobs IS NOT NULL THEN j.id END)
    FROM parents p
    WHERE j.id = p.id
)
SELECT (SELECT count(*) FROM parents) AS parents,
       (SELECT count(*) FROM created) AS created,
       (SELECT count(*) FROM decided) AS decided,
       COALESCE((SELECT array_agg(id ORDER BY id) FROM decided WHERE status = 'dead'), '{}') AS dead_ids,
       COALESCE((SELECT array_agg(queue ORDER BY id) FROM decided WHERE status = 'dead'), '{}') AS dead_queues,
       COALESCE((SELECT array_agg(last_error ORDER BY id) FROM decided WHERE status = 'dead'), '{}') AS dead_errors
