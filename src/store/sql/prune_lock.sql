-- Takes the pruner's lock of this schema if no other session holds it: true when taken.
-- A session lock, held by the round's own connection and released when the round ends or
-- the connection closes (a pod that dies holds it no longer). $1 the lock's name.
SELECT pg_try_advisory_lock(hashtext($1))
