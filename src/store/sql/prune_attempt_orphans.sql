-- Deletes up to $2 attempt-log rows older than $1 ms whose job no longer exists (written
-- after their job's delete ran, or left by deletes made before version 10's trigger).
WITH v AS (
    SELECT a.id FROM job_attempt_log a
    WHERE a.finished_at < now() - $1::int8 * interval '1 millisecond'
      AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.id = a.job_id)
    LIMIT $2
)
DELETE FROM job_attempt_log a USING v WHERE a.id = v.id
