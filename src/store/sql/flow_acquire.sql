-- Grants for a capped or rate-limited queue (the function is in the migrations).
-- $1 queue; $2 worker id; $3 wanted; $4 cap; $5 rate (jobs); $6 rate window (ms).
SELECT granted, retry_in_ms FROM flow_acquire($1, $2, $3, $4, $5, $6)
