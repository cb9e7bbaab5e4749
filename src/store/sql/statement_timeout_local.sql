-- Bounds the statements of this transaction. $1 the limit in milliseconds, as text.
SELECT set_config('statement_timeout', $1, true)
