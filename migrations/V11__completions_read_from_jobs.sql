-- jobwarden schema, version 11: the attempt that completed a job is read from the job's row.
--
-- A completed job's row holds everything its completing attempt would have logged: the
-- owner (worker_id), the lease, the attempt number, started_at, completed_at. Writing it again
-- as an attempt row was a quarter of what a settle cost PostgreSQL and a quarter of the WAL
-- per job (a heap row, two index entries and an identity value, for every job). The table
-- keeps every other attempt (retries, deaths, releases, reclaims, late results) and is
-- renamed job_attempt_log; `job_attempts` becomes a view over both, with the same columns
-- (id is NULL for a completion), so queries written against it keep their answers.
ALTER TABLE job_attempts RENAME TO job_attempt_log;
ALTER INDEX job_attempts_job RENAME TO job_attempt_log_job;
ALTER INDEX job_attempts_finished RENAME TO job_attempt_log_finished;

-- Completions logged before this version: their jobs' rows show them now.
DELETE FROM job_attempt_log a USING jobs j
WHERE a.job_id = j.id AND a.outcome = 'completed' AND j.status = 'completed';

-- Recent completions by time (the dashboard's last minute, job_stats' last day). Written only
-- by the settle of a completion (the claim's insert skips a partial index), always at its
-- right-hand end. (Measured: a BRIN over all rows cost the claim and the settle 8 %; this
-- costs the settle about as much as a partial BRIN would, and finds rows exactly.)
CREATE INDEX jobs_completed_at ON jobs (completed_at) WHERE status = 'completed';

CREATE VIEW job_attempts AS
SELECT a.id, a.job_id, a.lease, a.attempt, a.worker_id, a.started_at, a.finished_at,
       a.outcome, a.error, a.queue
FROM job_attempt_log a
UNION ALL
SELECT NULL::bigint, j.id, j.lease, j.attempts, j.worker_id, j.started_at, j.completed_at,
       'completed'::text, NULL::text, j.queue
FROM jobs j
WHERE j.status = 'completed';

-- Views and functions that named the table: bound to the view (job_stats) or writing to the
-- log (the rest).
CREATE OR REPLACE VIEW job_stats AS
WITH runs AS (
    SELECT j.queue, a.outcome,
           extract(epoch FROM a.finished_at - a.started_at) AS seconds
    FROM job_attempts a JOIN jobs j ON j.id = a.job_id
    WHERE a.finished_at > now() - interval '24 hours'
      AND a.outcome IN ('completed', 'retry', 'dead')
),
run_stats AS (
    SELECT queue,
           percentile_cont(0.5) WITHIN GROUP (ORDER BY seconds) AS p50_run_seconds,
           percentile_cont(0.95) WITHIN GROUP (ORDER BY seconds) AS p95_run_seconds,
           count(*) FILTER (WHERE outcome = 'retry')::float8 / count(*) AS retry_rate
    FROM runs GROUP BY queue
),
counts AS (
    SELECT queue,
           count(*) FILTER (WHERE status = 'queued') AS queued,
           count(*) FILTER (WHERE status = 'scheduled') AS scheduled,
           count(*) FILTER (WHERE status = 'processing') AS processing,
           count(*) FILTER (WHERE status = 'completed'
                            AND completed_at > now() - interval '24 hours') AS completed_24h,
           count(*) FILTER (WHERE status = 'dead'
                            AND completed_at > now() - interval '24 hours') AS dead_24h,
           max(now() - updated_at) FILTER (WHERE status = 'queued') AS oldest_queued_age
    FROM jobs GROUP BY queue
)
SELECT c.queue, c.queued, c.scheduled, c.processing, c.completed_24h, c.dead_24h,
       c.oldest_queued_age, r.p50_run_seconds, r.p95_run_seconds,
       COALESCE(r.retry_rate, 0) AS retry_rate
FROM counts c LEFT JOIN run_stats r ON r.queue = c.queue;

CREATE OR REPLACE FUNCTION reclaim_jobs(victims text[], reason text)
RETURNS TABLE (id text, status text, owner text, queue text)
LANGUAGE sql VOLATILE AS $$
    WITH v AS (
        SELECT j.id, j.worker_id AS owner FROM jobs j
        WHERE j.id = ANY(victims) AND j.status = 'processing'
    ),
    r AS (
        UPDATE jobs j
        SET status = CASE WHEN j.attempts >= j.max_attempts THEN 'dead' ELSE 'scheduled' END,
            scheduled_at = now(),
            completed_at = CASE WHEN j.attempts >= j.max_attempts THEN now() END,
            last_error = format('%s during attempt %s of %s (%s)',
                CASE reason
                    WHEN 'owner_dead' THEN format('worker %s stopped heartbeating', v.owner)
                    WHEN 'restarted' THEN format('worker %s was gone when its host restarted', v.owner)
                    WHEN 'stale' THEN format('no progress from worker %s since %s', v.owner, j.last_activity_at)
                    WHEN 'self_fenced' THEN format('worker %s could not renew its heartbeat and stopped the job', v.owner)
                    ELSE format('worker %s lost the job', v.owner)
                END,
                j.attempts, j.max_attempts, reason),
            worker_id = NULL,
            stale_at = NULL,
            updated_at = now()
        FROM v
        WHERE j.id = v.id
        RETURNING j.id, j.lease, j.attempts, j.started_at, j.status, j.last_error, v.owner, j.queue
    ),
    history AS (
        INSERT INTO job_attempt_log (job_id, lease, attempt, worker_id, started_at, outcome, error,
                                     queue)
        SELECT r.id, r.lease, r.attempts, r.owner, r.started_at, reason, r.last_error, r.queue
        FROM r
    )
    SELECT r.id, r.status, r.owner, r.queue FROM r
$$;

CREATE OR REPLACE FUNCTION job_attempts_cascade() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    DELETE FROM job_attempt_log a USING deleted d WHERE a.job_id = d.id;
    RETURN NULL;
END
$$;
