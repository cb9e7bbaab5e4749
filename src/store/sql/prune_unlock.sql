-- Ends what prune_lock.sql began. $1 the lock's name.
SELECT pg_advisory_unlock(hashtext($1))
