-- Grants for a capped or rate-limited queue (`flow_take()`, schema version 25), after the
-- worker's report of its earlier grants. $1 queue; $2 worker id; $3 wanted (0: only the
-- report); $4 cap; $5 rate (jobs); $6 rate window (ms); $7..$10 the worker's grant rows of
-- this queue, every one it still holds or runs anything of, with its counts now (ids, held,
-- running, started).
SELECT grant_id, granted, retry_in_ms FROM flow_take($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
