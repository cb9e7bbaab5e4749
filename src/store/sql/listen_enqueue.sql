LISTEN jobwarden_enqueue
-- Wakes the scheduler on every enqueue (the NOTIFY of `enqueue()` names the schema). The
-- statement comes first: pg_stat_activity shows the scheduler's connection as LISTEN.
