-- Views for operators: what `jobwarden stats` prints, queryable directly with psql.

-- Per queue: backlog, throughput and health over the last 24 hours.
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

-- The dead-letter queue: every dead job with its last error and how many attempts it had.
CREATE VIEW dead_jobs AS
SELECT id, queue, attempts, max_attempts, last_error, payload, created_at,
       completed_at AS died_at
FROM jobs WHERE status = 'dead';

-- Jobs that look stuck: running without progress for 5 minutes or under an owner that is
-- stopped or silent for 15 seconds (the recovery sweeps take these back), and jobs queued
-- for more than 5 minutes (a backlog, or a lost message).
CREATE VIEW stuck_jobs AS
SELECT j.id, j.queue, j.status, j.worker_id, j.started_at, j.last_activity_at,
       now() - COALESCE(j.last_activity_at, j.updated_at) AS silent_for,
       CASE
           WHEN j.status = 'queued' THEN 'queued for over 5 minutes'
           WHEN w.id IS NULL OR w.stopped_at IS NOT NULL THEN 'owner stopped'
           WHEN w.heartbeat_at < now() - interval '15 seconds' THEN 'owner silent'
           ELSE 'no progress for over 5 minutes'
       END AS why
FROM jobs j LEFT JOIN workers w ON w.id = j.worker_id
WHERE (j.status = 'processing'
       AND (j.last_activity_at < now() - interval '5 minutes'
            OR w.id IS NULL OR w.stopped_at IS NOT NULL
            OR w.heartbeat_at < now() - interval '15 seconds'))
   OR (j.status = 'queued' AND j.updated_at < now() - interval '5 minutes');

-- A job's own backoff, overriding its queue's (NULL: the queue's).
ALTER TABLE jobs ADD COLUMN backoff jsonb;

-- The W3C trace context the job was published with, passed to every attempt (retries and
-- recovered jobs too).
ALTER TABLE jobs ADD COLUMN traceparent text;

-- The worker's pid namespace: a pid can only be probed from the same namespace.
ALTER TABLE workers ADD COLUMN pid_ns text;

-- Takes jobs back from their owner, for every recovery path (the heartbeat reaper, start-up
-- reconciliation, the stale sweep): each victim still `processing` becomes `scheduled` now
-- (the scheduler republishes it at once) or `dead` when that attempt was its last (a crash
-- costs an attempt). The owner is cleared, so its late writes fail the fence, and the
-- attempt is recorded with the reason. The caller selects and locks the victims.
CREATE FUNCTION reclaim_jobs(victims text[], reason text)
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
                    ELSE format('worker %s lost the job', v.owner)
                END,
                j.attempts, j.max_attempts, reason),
            worker_id = NULL,
            updated_at = now()
        FROM v
        WHERE j.id = v.id
        RETURNING j.id, j.lease, j.attempts, j.started_at, j.status, j.last_error, v.owner, j.queue
    ),
    history AS (
        INSERT INTO job_attempts (job_id, lease, attempt, worker_id, started_at, outcome, error)
        SELECT r.id, r.lease, r.attempts, r.owner, r.started_at, reason, r.last_error FROM r
    )
    SELECT r.id, r.status, r.owner, r.queue FROM r
$$;
