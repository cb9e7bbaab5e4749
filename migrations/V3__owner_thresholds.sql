-- jobwarden schema, version 3: every job and every worker is judged by the thresholds its
-- owner declared (stored in the row), never by the settings of whichever pod sweeps; the
-- stream sequence of each queued job's message, for broker-loss repair under load; what
-- waits on subjects no pod serves yet.

-- The stale deadline of a running job: the claim and every progress report set it to
-- now() + the stale_after of the job's queue as the owning pod declares it. Every pod's stale
-- sweep compares it with now(); none applies its own settings to other pods' jobs. It is
-- cleared whenever a job leaves `processing`.
ALTER TABLE jobs ADD COLUMN stale_at timestamptz;
UPDATE jobs SET stale_at = COALESCE(last_activity_at, updated_at) + interval '5 minutes'
WHERE status = 'processing';
DROP INDEX jobs_processing_activity;
CREATE INDEX jobs_processing_stale ON jobs (stale_at) WHERE status = 'processing';

-- The stream sequence the broker gave the job's current message when the publish was
-- confirmed (NULL: not confirmed). A queued job whose sequence the queue's consumer has
-- already delivered (or the stream no longer holds) has lost its message.
ALTER TABLE jobs ADD COLUMN stream_seq bigint;
CREATE INDEX jobs_queued_seq ON jobs (queue, stream_seq) WHERE status = 'queued';

-- What each worker declared: every reaper judges its heartbeat by these. (Rows of older
-- versions get the defaults those versions used.)
ALTER TABLE workers ADD COLUMN heartbeat_every_ms bigint NOT NULL DEFAULT 5000;
ALTER TABLE workers ADD COLUMN dead_after_ms bigint NOT NULL DEFAULT 15000;

-- Messages waiting on subjects no consumer serves (producers deployed before the workers of
-- a new queue, a typo in a subject), as the janitors last saw them. Rows are replaced every
-- sweep; `jobwarden stats` prints them.
CREATE TABLE unserved_subjects (
    subject      text        PRIMARY KEY,
    queue        text        NOT NULL,
    messages     bigint      NOT NULL,
    oldest_at    timestamptz NOT NULL,   -- when the oldest waiting message was stored
    dead_letter_at timestamptz NOT NULL, -- when its messages become dead jobs (unserved_grace)
    seen_at      timestamptz NOT NULL DEFAULT now()
);

-- Taking jobs back now also covers a worker giving back what it no longer runs after a
-- self-fence: the attempt counts, and a job at its last attempt becomes dead.
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
        INSERT INTO job_attempts (job_id, lease, attempt, worker_id, started_at, outcome, error)
        SELECT r.id, r.lease, r.attempts, r.owner, r.started_at, reason, r.last_error FROM r
    )
    SELECT r.id, r.status, r.owner, r.queue FROM r
$$;

-- Stuck jobs, judged like the sweeps judge them: past the stale deadline their owner
-- declared, or under an owner stopped or silent past its own dead_after.
CREATE OR REPLACE VIEW stuck_jobs AS
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
