-- jobwarden schema, version 10: job_attempts without a foreign key to jobs.
-- The key checked every attempt row as it was written: a lookup of the job and a row lock
-- on it, per attempt, about a third of what a settle cost PostgreSQL. Attempt rows are only
-- written for jobs the same statement just updated or found, so the check never caught
-- anything. Deleting jobs still deletes their attempts (what ON DELETE CASCADE did): one
-- trigger per DELETE statement, over the deleted rows.
ALTER TABLE job_attempts DROP CONSTRAINT IF EXISTS job_attempts_job_id_fkey;

CREATE FUNCTION job_attempts_cascade() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    DELETE FROM job_attempts a USING deleted d WHERE a.job_id = d.id;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_delete_attempts
    AFTER DELETE ON jobs REFERENCING OLD TABLE AS deleted
    FOR EACH STATEMENT EXECUTE FUNCTION job_attempts_cascade();
