-- A job's `then` jobs cannot be created ($2 says why): the specs are dropped (kept in
-- last_error), so its other dependents can still be resolved. $1 id.
UPDATE jobs
SET then_jobs = NULL,
    last_error = 'then jobs not created: ' || $2::text || '; specs: ' || left(then_jobs::text, 1000)
WHERE id = $1 AND chain_pending AND then_jobs IS NOT NULL
