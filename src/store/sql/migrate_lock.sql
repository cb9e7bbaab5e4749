-- Serialises migrations of one schema across pods (refinery takes no lock of its own).
-- $1 the lock's name.
SELECT pg_advisory_lock(hashtext($1))
