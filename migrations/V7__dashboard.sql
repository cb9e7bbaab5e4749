-- The dashboard's overview reads the last minute of attempts per queue: attempts carry their
-- queue (settles write it; older rows and non-attempt events keep NULL), and a BRIN index on
-- finished_at (attempts are insert-only, so their physical order follows finished_at) makes
-- "the last minute" a range scan for almost no write cost.
ALTER TABLE job_attempts ADD COLUMN queue text;
CREATE INDEX job_attempts_finished ON job_attempts USING brin (finished_at);
