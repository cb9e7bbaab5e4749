-- A batch inside the caller's own transaction: the schema's `enqueue_batch()` (version 32).
-- Qualified by {schema} (see `store::in_schema`). $1 the batch: {"id", "jobs", "on_complete",
-- "on_success"}. Returns its id.
SELECT {schema}.enqueue_batch($1::jsonb)
