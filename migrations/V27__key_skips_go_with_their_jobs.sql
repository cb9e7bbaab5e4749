-- jobwarden schema, version 27: a skipped job's record (`key_skips`, version 22) goes when
-- its job is deleted (retention, `dlq purge`, by hand), as its attempt log does: the table
-- no longer grows with history. The trigger of version 10 (`jobs_delete_attempts`, one
-- statement-level delete per deleting statement) deletes both.
CREATE OR REPLACE FUNCTION job_attempts_cascade() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    DELETE FROM job_attempt_log a USING deleted d WHERE a.job_id = d.id;
    DELETE FROM key_skips s USING deleted d WHERE s.job_id = d.id;
    RETURN NULL;
END
$$;

-- Records whose job is gone already (deleted before this version).
DELETE FROM key_skips s WHERE NOT EXISTS (SELECT 1 FROM jobs j WHERE j.id = s.job_id);
