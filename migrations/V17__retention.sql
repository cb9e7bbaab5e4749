-- jobwarden schema, version 17: retention (finished jobs pruned by policy, see
-- docs/operations.md "Retention").
--
-- The pruner deletes finished jobs oldest first, by status, walking an index on completed_at
-- of that status: completed jobs have jobs_completed_at (V11), dead ones jobs_dead (V1).
-- Cancelled jobs had none; this one is written only when a job is cancelled (an operator's
-- act, or a chain's cancelled parent), never by the claim or the settle, so the hot path
-- pays nothing for it.
CREATE INDEX IF NOT EXISTS jobs_cancelled_at ON jobs (completed_at) WHERE status = 'cancelled';
