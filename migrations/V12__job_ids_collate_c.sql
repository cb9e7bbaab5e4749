-- jobwarden schema, version 12: job ids compare byte by byte (COLLATE "C").
--
-- A job id is an opaque key: nobody sorts ids for a reader, and equality is all the hot path
-- asks of them. Under the database's default collation (often en_US.UTF-8 or C.UTF-8) every
-- comparison in a B-tree descent of jobs_pkey (each claim's insert, each settle's lookup,
-- the sort of each batch's id array) went through strcoll(); byte order costs a memcmp.
-- Every column that holds a job id changes together, so that joins between them compare
-- under one collation and keep using their indexes. The views that read these columns are
-- dropped and created again as they were (a column under a view cannot change type).
DROP VIEW job_stats;
DROP VIEW job_attempts;
DROP VIEW dead_jobs;
DROP VIEW stuck_jobs;

ALTER TABLE jobs ALTER COLUMN id TYPE text COLLATE "C";
ALTER TABLE job_attempt_log ALTER COLUMN job_id TYPE text COLLATE "C";
ALTER TABLE job_deps ALTER COLUMN parent TYPE text COLLATE "C",
                     ALTER COLUMN child TYPE text COLLATE "C";

CREATE VIEW job_attempts AS
SELECT a.id, a.job_id, a.lease, a.attempt, a.worker_id, a.started_at, a.finished_at,
       a.outcome, a.error, a.queue
FROM job_attempt_log a
UNION ALL
SELECT NULL::bigint, j.id, j.lease, j.attempts, j.worker_id, j.started_at, j.completed_at,
       'completed'::text, NULL::text, j.queue
FROM jobs j
WHERE j.status = 'completed';

CREATE VIEW job_stats AS
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

CREATE VIEW dead_jobs AS
SELECT id, queue, attempts, max_attempts, last_error, payload, created_at,
       completed_at AS died_at
FROM jobs WHERE status = 'dead';

CREATE VIEW stuck_jobs AS
SELECT j.id, j.queue, j.status, j.worker_id, j.started_at, j.last_activity_at,
       now() - COALESCE(j.last_activity_at, j.updated_at) AS silent_for,
       CASE
           WHEN j.status = 'queued' THEN 'queued for over 5 minutes'
           WHEN w.id IS NULL OR w.stopped_at IS NOT NULL THEN 'owner stopped'
           WHEN w.heartbeat_at < now() - w.dead_after_ms * interval '1 millisecond' THEN 'owner silent'
           ELSE 'no progress within its stale_after'
       END AS why
FROM jobs j LEFT JOIN workers w ON w.id = j.worker_id
WHERE (j.status = 'processing'
       AND (j.stale_at < now()
            OR w.id IS NULL OR w.stopped_at IS NOT NULL
            OR w.heartbeat_at < now() - w.dead_after_ms * interval '1 millisecond'))
   OR (j.status = 'queued' AND j.updated_at < now() - interval '5 minutes');
