-- A bulk enqueue inside the caller's own transaction: the schema's `enqueue_many()` (version
-- 29), one row per job in input order (its position from 1, its id). Qualified by {schema}
-- (see `store::in_schema`): the caller's connection has its own search_path.
-- $1 the jobs: a JSON array of job specs.
SELECT n, id FROM {schema}.enqueue_many($1::jsonb)
