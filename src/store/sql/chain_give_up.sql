-- A job's dependents cannot be resolved ($2 says why): it is no longer pending; the sweep's
-- recheck marks it again while it has waiting children. $1 id.
UPDATE jobs SET chain_pending = false, last_error = 'dependents not resolved: ' || $2::text
WHERE id = $1 AND chain_pending
