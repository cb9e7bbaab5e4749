-- jobwarden schema, version 31: completion from outside. A handler may answer "accepted, I
-- will report" (an http 202 with `Jobwarden-Defer: <deadline>`, an exec exit code 202, a Rust
-- handler's `job.defer(deadline)`): its worker settles the attempt as `awaiting` (the slot is
-- freed, the message acked, no heartbeat needed), the row keeping its owner and lease, until
--   * complete(job_id, token, result) or fail(job_id, token, error, ...) comes, from any pod's
--     local API (`POST /v1/jobs/<id>/complete`, `/fail`), the CLI (`jobwarden jobs complete`),
--     the Rust client, or any SQL session; or
--   * its deadline passes: job_await_expire(), run by every pod's scheduler, retries it after
--     the backoff its worker computed as it deferred (`await_retry_ms`), or dead-letters it
--     when it had no attempts left.
-- The token names the attempt: `<lease>.<32 hex digits>`, the digits the first half of
-- HMAC-SHA256(key, job id || NUL || lease) under this schema's `completion_key`. Workers
-- compute it for every attempt they start (a Rust handler's `job.completion_token`, the http
-- request's `completion_token`, an exec command's JOB_COMPLETION_TOKEN); these functions check
-- it without storing any. A token of an earlier attempt (stale), of no attempt (forged or
-- mistyped), for a job that is not awaiting it (cancelled, past its deadline, settled
-- otherwise) is refused with its own SQLSTATE, and the local API and the CLI record each
-- refusal in job_attempt_log (outcome `completion_refused`). Completing twice with the same
-- token answers `already completed` and changes nothing, as does failing twice.

ALTER TABLE jobs DROP CONSTRAINT jobs_status_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_status_check CHECK (status IN
    ('waiting', 'queued', 'scheduled', 'processing', 'awaiting', 'completed', 'dead', 'cancelled'))
    NOT VALID;
ALTER TABLE jobs VALIDATE CONSTRAINT jobs_status_check;

ALTER TABLE jobs
    ADD COLUMN await_until    timestamptz,  -- an awaiting job's deadline
    ADD COLUMN await_retry_ms bigint;       -- its retry's delay, should it fail or time out

-- The deadline sweep, and the count of awaiting jobs per queue.
CREATE INDEX jobs_awaiting ON jobs (await_until) WHERE status = 'awaiting';

-- HMAC-SHA256's inner and outer keys (the 64-byte block xor 0x36, xor 0x5c): one row.
CREATE TABLE completion_key (
    one  boolean PRIMARY KEY DEFAULT true CHECK (one),
    ipad bytea   NOT NULL CHECK (octet_length(ipad) = 64),
    opad bytea   NOT NULL CHECK (octet_length(opad) = 64)
);
DO $$
DECLARE
    -- 244 random bits from the server's strong random source (PostgreSQL 13+), zero-padded
    -- to HMAC's block.
    k bytea := decode(replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', '')
                      || repeat('00', 32), 'hex');
    i bytea := k;
    o bytea := k;
BEGIN
    FOR n IN 0..63 LOOP
        i := set_byte(i, n, get_byte(k, n) # 54);
        o := set_byte(o, n, get_byte(k, n) # 92);
    END LOOP;
    INSERT INTO completion_key (ipad, opad) VALUES (i, o);
END $$;

-- The token of attempt `lease` of job `job_id`.
CREATE FUNCTION completion_token(job_id text, lease bigint) RETURNS text
LANGUAGE sql STABLE
SET search_path FROM CURRENT
AS $$
    SELECT lease || '.' || encode(substr(sha256(k.opad || sha256(
               k.ipad || convert_to(job_id, 'UTF8') || '\x00'::bytea
               || convert_to(lease::text, 'UTF8'))), 1, 16), 'hex')
    FROM completion_key k
$$;

-- Locks job `job_id` and checks that `token` names its current attempt and that this attempt
-- may still be completed or failed from outside; raises the refusal otherwise. Returns the
-- row (status `awaiting`; or, for a repeat of what that token already did, `completed` after
-- a complete, `scheduled` or `dead` after a fail or the deadline).
-- SQLSTATEs: JW404 no such job; JW403 a token that names no attempt of this job (forged,
-- mistyped, or for another job); JW409 an attempt that cannot be ended from outside (stale,
-- not deferred, cancelled, past its deadline, ended otherwise).
CREATE FUNCTION job_awaited(fn text, job_id text, token text) RETURNS jobs
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    j jobs;
    tl bigint;
BEGIN
    SELECT * INTO j FROM jobs WHERE id = job_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'jobwarden.%: no job %', fn, quote_literal(job_id)
            USING ERRCODE = 'JW404',
                  HINT = 'check the id: it is the `id` the job was enqueued with (`jobwarden jobs show <id>`)';
    END IF;
    IF token IS NULL OR token !~ '^[0-9]{1,18}\.[0-9a-f]{32}$' THEN
        RAISE EXCEPTION 'jobwarden.%: job %: % is not a completion token', fn,
            quote_literal(job_id), COALESCE(quote_literal(left(token, 80)), 'NULL')
            USING ERRCODE = 'JW403',
                  HINT = 'pass the token the attempt was handed, exactly: `<lease>.<32 hex digits>` (the http request''s `completion_token`, an exec command''s JOB_COMPLETION_TOKEN, a Rust handler''s `job.completion_token`)';
    END IF;
    tl := split_part(token, '.', 1)::bigint;
    IF token IS DISTINCT FROM completion_token(j.id, tl) THEN
        RAISE EXCEPTION 'jobwarden.%: job %: the token % was not issued for this job', fn,
            quote_literal(job_id), quote_literal(token)
            USING ERRCODE = 'JW403',
                  HINT = 'a forged or mistyped token, or one of another job (or of another jobwarden schema): pass the token this job''s attempt was handed';
    END IF;
    IF tl <> j.lease THEN
        RAISE EXCEPTION 'jobwarden.%: job %: the token names attempt lease %, but the job has moved on to lease % (status %)',
            fn, quote_literal(job_id), tl, j.lease, j.status
            USING ERRCODE = 'JW409',
                  HINT = 'a stale token: that attempt ended (its deadline passed, it failed, or its worker died) and the job ran again; only the latest attempt''s token counts';
    END IF;
    IF j.status = 'awaiting' AND j.await_until <= now() THEN
        RAISE EXCEPTION 'jobwarden.%: job %: its deadline passed at % (now %); it is retried or dead-lettered by its policy',
            fn, quote_literal(job_id), j.await_until, now()
            USING ERRCODE = 'JW409',
                  HINT = 'complete it before the deadline its handler gave (Jobwarden-Defer); a longer deadline needs a longer deferral';
    ELSIF j.status = 'awaiting' THEN
        RETURN j;
    ELSIF j.status = 'cancelled' THEN
        RAISE EXCEPTION 'jobwarden.%: job % was cancelled at % (%)', fn, quote_literal(job_id),
            j.completed_at, COALESCE(j.last_error, 'no reason given')
            USING ERRCODE = 'JW409', HINT = 'a cancelled job is never completed or failed';
    ELSIF j.status = 'processing' THEN
        RAISE EXCEPTION 'jobwarden.%: job % is still running its handler (attempt lease %): it has not deferred',
            fn, quote_literal(job_id), j.lease
            USING ERRCODE = 'JW409',
                  HINT = 'a job is completed from outside only once its handler answered deferred (http 202 with Jobwarden-Defer, exec exit 202, job.defer() in Rust); try again in a moment';
    ELSIF (fn = 'complete' AND j.status = 'completed')
          OR (fn = 'fail' AND j.status IN ('scheduled', 'dead') AND j.await_until IS NOT NULL) THEN
        RETURN j;
    END IF;
    RAISE EXCEPTION 'jobwarden.%: job %: its attempt lease % already ended (status %)%',
        fn, quote_literal(job_id), j.lease, j.status,
        CASE WHEN j.last_error IS NOT NULL THEN ': ' || j.last_error ELSE '' END
        USING ERRCODE = 'JW409',
              HINT = 'an attempt is ended once: by its handler, from outside, or by its deadline';
END
$$;

-- Completes awaiting job `job_id` with `job_result` (NULL for none). Returns `completed`, or
-- `already completed` when this token completed it before (nothing changes).
CREATE FUNCTION complete(job_id text, token text, job_result jsonb DEFAULT NULL) RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    j jobs;
    bytes integer := octet_length(job_result::text);
BEGIN
    IF bytes > {{MAX_RESULT_BYTES}} THEN
        RAISE EXCEPTION 'jobwarden.complete: job %: the result is % bytes, over the limit of {{MAX_RESULT_BYTES}} bytes',
            quote_literal(job_id), bytes
            USING ERRCODE = '54000',
                  HINT = 'store a large result elsewhere (object storage, a table of your own) and complete the job with a reference to it';
    END IF;
    j := job_awaited('complete', job_id, token);
    IF j.status = 'completed' THEN
        RETURN 'already completed';
    END IF;
    UPDATE jobs
    SET status = 'completed', completed_at = now(), result = job_result, await_until = NULL,
        -- Dependents (or a `then`) to resolve: the scheduler's chain round does it.
        chain_pending = then_jobs IS NOT NULL OR has_dependents,
        updated_at = now()
    WHERE id = j.id;
    -- The chain round runs on the scheduler's next tick; wake it.
    PERFORM pg_notify('jobwarden_enqueue', current_schema());
    RETURN 'completed';
END
$$;

-- Ends an awaiting attempt as failed (the deadline sweep's and fail()'s one transition): a
-- permanent failure, or one with no attempts left, is dead; any other is retried after
-- `retry_ms` (the backoff its worker computed as it deferred, or the caller's own delay).
-- Records the attempt in job_attempt_log. Returns the job's new status.
CREATE FUNCTION job_await_end(j jobs, why text, permanent boolean, retry_ms bigint, outcome text)
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    dead boolean := permanent OR j.attempts >= j.max_attempts;
    err text := CASE WHEN permanent THEN 'permanent error: ' || why
                     WHEN j.attempts >= j.max_attempts
                     THEN format('%s (attempt %s of %s, no attempts left)', why, j.attempts,
                                 j.max_attempts)
                     ELSE why END;
BEGIN
    UPDATE jobs
    SET status = CASE WHEN dead THEN 'dead' ELSE 'scheduled' END,
        completed_at = CASE WHEN dead THEN now() END,
        scheduled_at = CASE WHEN dead THEN scheduled_at
                            ELSE now() + LEAST(GREATEST(retry_ms, 0), {{MAX_DELAY_MS}})
                                         * interval '1 millisecond' END,
        last_error = err,
        chain_pending = dead AND (then_jobs IS NOT NULL OR has_dependents),
        updated_at = now()
    WHERE id = j.id;
    INSERT INTO job_attempt_log (job_id, lease, attempt, worker_id, started_at, outcome, error, queue)
    VALUES (j.id, j.lease, j.attempts, j.worker_id, j.started_at,
            CASE WHEN dead THEN 'dead' ELSE outcome END, err, j.queue);
    PERFORM pg_notify('jobwarden_enqueue', current_schema());
    RETURN CASE WHEN dead THEN 'dead' ELSE 'scheduled' END;
END
$$;

-- Fails awaiting job `job_id`: retried after its backoff (or `retry_after_ms`, when given),
-- dead when `permanent` or out of attempts. Returns the new status (`scheduled` or `dead`), or
-- `already failed` when this token's attempt had ended so before (nothing changes).
CREATE FUNCTION fail(job_id text, token text, error text, permanent boolean DEFAULT false,
                     retry_after_ms bigint DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    j jobs;
BEGIN
    IF retry_after_ms < 0 OR retry_after_ms > {{MAX_DELAY_MS}} THEN
        RAISE EXCEPTION 'jobwarden.fail: job %: retry_after_ms % is out of range', quote_literal(job_id), retry_after_ms
            USING ERRCODE = '22023',
                  HINT = 'give 0 to {{MAX_DELAY_MS}} ms, or NULL for the queue''s backoff';
    END IF;
    j := job_awaited('fail', job_id, token);
    IF j.status <> 'awaiting' THEN
        RETURN 'already failed';
    END IF;
    RETURN job_await_end(j, COALESCE(NULLIF(left(error, 8192), ''), 'failed from outside (no error given)'),
                         permanent, COALESCE(retry_after_ms, j.await_retry_ms, 0), 'failed');
END
$$;

-- The deadline sweep: ends up to `lim` awaiting jobs whose deadline passed, the earliest
-- first (rows another session holds are skipped: a completion in flight, another pod's
-- sweep). Returns each one's id, queue and new status.
CREATE FUNCTION job_await_expire(lim integer)
RETURNS TABLE (id text, queue text, status text)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    j jobs;
BEGIN
    FOR j IN
        SELECT * FROM jobs x
        WHERE x.status = 'awaiting' AND x.await_until <= now()
        ORDER BY x.await_until
        LIMIT lim
        FOR UPDATE SKIP LOCKED
    LOOP
        id := j.id;
        queue := j.queue;
        status := job_await_end(j,
            format('deadline passed: no completion or failure came within %s of deferring (deadline %s)',
                   j.await_until - j.last_activity_at, j.await_until),
            false, COALESCE(j.await_retry_ms, 0), 'deadline');
        RETURN NEXT;
    END LOOP;
END
$$;

-- Records a refused completion or failure (the local API and the CLI call it after the
-- refusal, whose own transaction rolled back). Nothing for an unknown job.
CREATE FUNCTION completion_refused(job_id text, token text, who text, why text) RETURNS void
LANGUAGE sql VOLATILE
SET search_path FROM CURRENT
AS $$
    INSERT INTO job_attempt_log (job_id, lease, attempt, worker_id, outcome, error, queue)
    SELECT j.id, COALESCE(CASE WHEN token ~ '^[0-9]{1,18}\.' THEN split_part(token, '.', 1)::bigint END, 0),
           0, left(who, 200), 'completion_refused', left(why, 2000), j.queue
    FROM jobs j WHERE j.id = job_id
$$;

-- The operators' view: awaiting jobs counted with the live ones.
DROP VIEW job_stats;
CREATE VIEW job_stats AS
WITH live AS (
    SELECT queue, count(*) AS queued, 0::int8 AS scheduled, 0::int8 AS processing,
           0::int8 AS awaiting, max(now() - updated_at) AS oldest_queued_age
    FROM jobs WHERE status = 'queued' GROUP BY queue
    UNION ALL
    SELECT queue, 0, count(*), 0, 0, NULL FROM jobs WHERE status = 'scheduled' GROUP BY queue
    UNION ALL
    SELECT queue, 0, 0, count(*), 0, NULL FROM jobs WHERE status = 'processing' GROUP BY queue
    UNION ALL
    SELECT queue, 0, 0, 0, count(*), NULL FROM jobs WHERE status = 'awaiting' GROUP BY queue
),
counts AS (
    SELECT queue, sum(queued)::int8 AS queued, sum(scheduled)::int8 AS scheduled,
           sum(processing)::int8 AS processing, sum(awaiting)::int8 AS awaiting,
           max(oldest_queued_age) AS oldest_queued_age
    FROM live GROUP BY queue
),
day AS (
    SELECT * FROM job_window(now() - interval '24 hours')
)
SELECT COALESCE(c.queue, d.queue) AS queue,
       COALESCE(c.queued, 0) AS queued,
       COALESCE(c.scheduled, 0) AS scheduled,
       COALESCE(c.processing, 0) AS processing,
       COALESCE(d.completed, 0) AS completed_24h,
       COALESCE(d.dead, 0) AS dead_24h,
       c.oldest_queued_age,
       rollup_quantile(d.run_hist, 0.5) AS p50_run_seconds,
       rollup_quantile(d.run_hist, 0.95) AS p95_run_seconds,
       COALESCE(d.retried::float8 / nullif(d.completed + d.retried + d.dead, 0), 0) AS retry_rate,
       COALESCE(c.awaiting, 0) AS awaiting
FROM counts c FULL JOIN day d ON d.queue = c.queue;
