-- The settle's common case: every attempt of the group completed its job (no error, nothing
-- refunded). The same fenced update as job_settle.sql, by owner and lease, for completions
-- only: three arrays instead of eight, and no attempt-log CTE (a completion is read from the
-- job's own row), so PostgreSQL keeps no tuple store of the updated rows. Returns the
-- positions (1-based) of the attempts it settled; the caller records the rest as late results.
-- $1 worker id; $2 ids; $3 leases; $4 results; $5 the traced runs' contexts (traceparent,
-- NULL for a run not traced): kept as the job's, which its `then` jobs inherit.
UPDATE jobs j
SET status = 'completed',
    completed_at = now(),
    result = i.result,
    traceparent = COALESCE(i.trace, j.traceparent),
    stale_at = NULL,
    -- Dependents (or a `then`) to resolve: the scheduler's chain round does it.
    chain_pending = j.then_jobs IS NOT NULL OR j.has_dependents,
    updated_at = now()
FROM unnest($2::text[], $3::int8[], $4::jsonb[], $5::text[])
     WITH ORDINALITY AS i(id, lease, result, trace, n)
-- The ids select the rows (primary key); the status test is written so that no partial index
-- over processing rows can drive the lookup instead (see job_settle.sql).
WHERE j.id = ANY($2::text[]) AND j.id = i.id AND j.worker_id = $1 AND j.lease = i.lease
  AND (j.status = 'processing') IS TRUE
RETURNING i.n::int4
