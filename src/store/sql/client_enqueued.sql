-- What the client's enqueue made of a job, in the same transaction: a row created by it has
-- created_at = now() (the transaction's start). {schema}: see `store::in_schema`. $1 id.
SELECT status, generation, created_at = now() FROM {schema}.jobs WHERE id = $1
