-- A keyed queue's slots take parked jobs: see job_take() (schema version 30).
-- $1 queue; $2 worker id; $3 how many at most; $4 the queue's stale_after (ms); $5 its
-- expire_after (ms, NULL for none); $6 each key's limit (NULL for none); $7 ordered by key;
-- $8 a dead job holds its ordered key's later jobs; $9 the ordered horizon (NULL: none);
-- $10 starts per $11 ms per key (key_rate_limit; NULL: none); $12 fair turns.
-- A last row with a NULL id says parked jobs are left. Each taken job's parents' results
-- (version 28) come last (version 30).
SELECT * FROM job_take($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
