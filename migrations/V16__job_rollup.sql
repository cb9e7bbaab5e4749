-- jobwarden schema, version 16: counts of finished work per queue and minute (the rollup), so
-- that `job_stats`, `jobwarden stats`, the dashboard and its charts answer from a few rows
-- per queue however many years of finished jobs the table holds.
--
-- Nothing on the hot path writes here. A worker's rollup service (one pod at a time: a step
-- holds the mark's row) reads what finished since its mark through the partial indexes of finished
-- rows, adds it to the rows of its minutes, and moves the mark. The mark only passes a time
-- once every transaction that could still commit a row finished before it has ended (see
-- rollup_safe_upto), so a settle that commits late is never skipped. Readers add the live
-- tail after the mark (seconds of rows, read through the same indexes): answers are exact and
-- fresh. Minutes older than two hours fold into hours; hours are kept 90 days.

-- Run and wait times are counted in buckets: the first holds [0, 5 ms), each next one from the
-- previous bound to its own, the last one from an hour on. Percentiles are read off them
-- (rollup_quantile).
CREATE FUNCTION rollup_bounds() RETURNS float8[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '{5,10,25,50,100,250,500,1000,2500,5000,10000,30000,60000,300000,900000,3600000}'::float8[] $$;

CREATE TABLE job_rollup (
    queue     text COLLATE "C" NOT NULL,
    span      text        NOT NULL CHECK (span IN ('minute', 'hour')),
    bucket    timestamptz NOT NULL,         -- the start of its minute or hour
    completed int8        NOT NULL DEFAULT 0,
    retried   int8        NOT NULL DEFAULT 0,  -- attempts that failed and were retried
    dead      int8        NOT NULL DEFAULT 0,
    cancelled int8        NOT NULL DEFAULT 0,  -- by an operator, a pipeline or expiry
    -- Run time of every attempt counted above that ran (completed, retried, dead).
    run_ms    float8      NOT NULL DEFAULT 0,
    run_hist  int8[]      NOT NULL,
    -- Wait of each completed or dead job before its last attempt (from when it was due).
    wait_ms   float8      NOT NULL DEFAULT 0,
    wait_hist int8[]      NOT NULL,
    PRIMARY KEY (queue, span, bucket)
);
CREATE INDEX job_rollup_bucket ON job_rollup (bucket);

-- How far the rollup has read (one row).
CREATE TABLE rollup_mark (
    one  boolean     PRIMARY KEY DEFAULT true CHECK (one),
    upto timestamptz NOT NULL
);
-- The day before this version is rolled up too (the service catches up in steps).
INSERT INTO rollup_mark (upto) VALUES (date_trunc('hour', now()) - interval '25 hours');

-- Finished rows by time, for the rollup's reads; dead ones also in the dead-letter list's
-- order (the most recently dead first), for every queue and for one, so that a page of the
-- list reads a page of the index, never the whole dead-letter queue. Cancels and deaths are
-- rare writes.
CREATE INDEX jobs_dead_at ON jobs (completed_at DESC NULLS LAST, id) WHERE status = 'dead';
DROP INDEX jobs_dead;
CREATE INDEX jobs_dead ON jobs (queue, completed_at DESC NULLS LAST, id) WHERE status = 'dead';
CREATE INDEX jobs_cancelled_at ON jobs (completed_at) WHERE status = 'cancelled';

-- A histogram: one more count in the bucket of `ms`.
CREATE FUNCTION rollup_hist_step(state int8[], ms float8) RETURNS int8[]
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
    -- The bounds of rollup_bounds(), written out: a function called per row is not given a
    -- search_path of its own.
    b int := width_bucket(greatest(ms, 0),
        '{5,10,25,50,100,250,500,1000,2500,5000,10000,30000,60000,300000,900000,3600000}'::float8[]) + 1;
BEGIN
    IF ms IS NULL THEN
        RETURN state;
    END IF;
    state[b] := state[b] + 1;
    RETURN state;
END
$$;
CREATE AGGREGATE rollup_hist(float8) (
    SFUNC = rollup_hist_step, STYPE = int8[],
    INITCOND = '{0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0}'
);

-- Two histograms added bucket by bucket (NULL is empty).
CREATE FUNCTION rollup_add(a int8[], b int8[]) RETURNS int8[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN a IS NULL THEN b WHEN b IS NULL THEN a
                ELSE ARRAY(SELECT x + y FROM unnest(a, b) WITH ORDINALITY AS t(x, y, i) ORDER BY i)
           END
$$;
CREATE AGGREGATE rollup_sum(int8[]) (SFUNC = rollup_add, STYPE = int8[]);

-- The q-quantile (0..1) of a histogram, in seconds: linear within its bucket (the last
-- bucket, which has no upper bound, answers its lower bound). NULL when it is empty.
CREATE FUNCTION rollup_quantile(hist int8[], q float8) RETURNS float8
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
    bounds float8[] :=
        '{5,10,25,50,100,250,500,1000,2500,5000,10000,30000,60000,300000,900000,3600000}'::float8[];
    total float8 := 0;
    seen float8 := 0;
    want float8;
    lo float8;
    n int8;
BEGIN
    IF hist IS NULL THEN
        RETURN NULL;
    END IF;
    FOREACH n IN ARRAY hist LOOP
        total := total + n;
    END LOOP;
    IF total = 0 THEN
        RETURN NULL;
    END IF;
    want := q * total;
    FOR i IN 1 .. array_length(hist, 1) LOOP
        lo := CASE WHEN i = 1 THEN 0 ELSE bounds[i - 1] END;
        IF hist[i] > 0 AND seen + hist[i] >= want THEN
            IF i > array_length(bounds, 1) THEN
                RETURN lo / 1000;
            END IF;
            RETURN (lo + (bounds[i] - lo) * greatest(want - seen, 0) / hist[i]) / 1000;
        END IF;
        seen := seen + hist[i];
    END LOOP;
    RETURN lo / 1000;
END
$$;

-- What finished in [lo, hi): one row per finished job (completed, dead, cancelled) and per
-- attempt that failed and was retried, with its run and wait times (ms). Each branch reads a
-- partial index by time. (No search_path of its own, so that PostgreSQL inlines it into the
-- query that calls it; its callers, rollup_step and job_window, set theirs.)
CREATE FUNCTION job_ends(lo timestamptz, hi timestamptz)
RETURNS TABLE (queue text, at timestamptz, what text, run_ms float8, wait_ms float8)
LANGUAGE sql STABLE
AS $$
    SELECT queue, completed_at, 'completed',
           extract(epoch FROM completed_at - started_at) * 1000,
           extract(epoch FROM started_at - scheduled_at) * 1000
    FROM jobs WHERE status = 'completed' AND completed_at >= lo AND completed_at < hi
    UNION ALL
    SELECT queue, completed_at, 'dead',
           extract(epoch FROM completed_at - started_at) * 1000,
           extract(epoch FROM started_at - scheduled_at) * 1000
    FROM jobs WHERE status = 'dead' AND completed_at >= lo AND completed_at < hi
    UNION ALL
    SELECT queue, completed_at, 'cancelled', NULL, NULL
    FROM jobs WHERE status = 'cancelled' AND completed_at >= lo AND completed_at < hi
    UNION ALL
    SELECT queue, finished_at, 'retried', extract(epoch FROM finished_at - started_at) * 1000, NULL
    FROM job_attempt_log
    WHERE outcome = 'retry' AND queue IS NOT NULL AND finished_at >= lo AND finished_at < hi
$$;

-- How far the rollup may read now: rows stamped before this time are all committed. A row's
-- time is its transaction's start (now()), so none can still come before the start of the
-- oldest transaction running in this database — unless that one has run for over five
-- minutes (an operator's open session), which is not waited for. Two seconds behind the
-- clock at most.
CREATE FUNCTION rollup_safe_upto() RETURNS timestamptz
LANGUAGE sql VOLATILE
AS $$
    SELECT least(clock_timestamp() - interval '2 seconds',
                 min(a.xact_start) FILTER (WHERE a.xact_start > clock_timestamp() - interval '5 minutes'))
    FROM pg_stat_activity a
    WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
      AND a.backend_type = 'client backend'
$$;

-- One step of the rollup service: adds what finished in
-- [mark, hi) to its minutes, hi being at most `max_step` past the mark and never past what is
-- safe; moves the mark; folds minutes older than two hours into hours and drops hours older
-- than 90 days. Returns the new mark, how many finished rows it read, and whether it read
-- all that is safe to read now (a step stopped by `max_step` did not); a NULL mark when
-- another step is running (it holds the mark's row).
CREATE FUNCTION rollup_step(max_step interval DEFAULT interval '15 minutes',
                            OUT upto timestamptz, OUT rows_read int8, OUT caught_up boolean)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    lo timestamptz;
    hi timestamptz;
BEGIN
    -- One step at a time, cluster-wide: a step running elsewhere holds the mark.
    SELECT m.upto INTO lo FROM rollup_mark m FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        upto := NULL;
        rows_read := 0;
        caught_up := true;
        RETURN;
    END IF;
    hi := least(lo + max_step, rollup_safe_upto());
    -- Stopped by what is safe, not by the step's length: nothing more to read now.
    caught_up := hi < lo + max_step;
    IF hi <= lo THEN
        upto := lo;
        rows_read := 0;
        RETURN;
    END IF;
    WITH ends AS (
        SELECT * FROM job_ends(lo, hi)
    ), added AS (
        INSERT INTO job_rollup AS r (queue, span, bucket, completed, retried, dead, cancelled,
                                     run_ms, run_hist, wait_ms, wait_hist)
        SELECT e.queue, 'minute', date_trunc('minute', e.at),
               count(*) FILTER (WHERE e.what = 'completed'),
               count(*) FILTER (WHERE e.what = 'retried'),
               count(*) FILTER (WHERE e.what = 'dead'),
               count(*) FILTER (WHERE e.what = 'cancelled'),
               COALESCE(sum(greatest(e.run_ms, 0)), 0), rollup_hist(e.run_ms),
               COALESCE(sum(greatest(e.wait_ms, 0)), 0), rollup_hist(e.wait_ms)
        FROM ends e
        GROUP BY 1, 3
        ON CONFLICT (queue, span, bucket) DO UPDATE
        SET completed = r.completed + EXCLUDED.completed,
            retried = r.retried + EXCLUDED.retried,
            dead = r.dead + EXCLUDED.dead,
            cancelled = r.cancelled + EXCLUDED.cancelled,
            run_ms = r.run_ms + EXCLUDED.run_ms,
            run_hist = rollup_add(r.run_hist, EXCLUDED.run_hist),
            wait_ms = r.wait_ms + EXCLUDED.wait_ms,
            wait_hist = rollup_add(r.wait_hist, EXCLUDED.wait_hist)
    )
    SELECT count(*) INTO rows_read FROM ends;
    UPDATE rollup_mark SET upto = hi;
    upto := hi;

    -- Minutes older than two hours become hours.
    WITH gone AS (
        DELETE FROM job_rollup
        WHERE span = 'minute' AND bucket < date_trunc('hour', hi) - interval '1 hour'
        RETURNING *
    )
    INSERT INTO job_rollup AS r (queue, span, bucket, completed, retried, dead, cancelled,
                                 run_ms, run_hist, wait_ms, wait_hist)
    SELECT g.queue, 'hour', date_trunc('hour', g.bucket), sum(g.completed), sum(g.retried),
           sum(g.dead), sum(g.cancelled), sum(g.run_ms), rollup_sum(g.run_hist),
           sum(g.wait_ms), rollup_sum(g.wait_hist)
    FROM gone g
    GROUP BY 1, 3
    ON CONFLICT (queue, span, bucket) DO UPDATE
    SET completed = r.completed + EXCLUDED.completed,
        retried = r.retried + EXCLUDED.retried,
        dead = r.dead + EXCLUDED.dead,
        cancelled = r.cancelled + EXCLUDED.cancelled,
        run_ms = r.run_ms + EXCLUDED.run_ms,
        run_hist = rollup_add(r.run_hist, EXCLUDED.run_hist),
        wait_ms = r.wait_ms + EXCLUDED.wait_ms,
        wait_hist = rollup_add(r.wait_hist, EXCLUDED.wait_hist);

    DELETE FROM job_rollup WHERE span = 'hour' AND bucket < hi - interval '90 days';
END
$$;

-- Finished work per queue since `since` (to the minute for the last two hours, to the hour
-- before): the rollup's rows that overlap it, plus the live tail after the mark.
CREATE FUNCTION job_window(since timestamptz)
RETURNS TABLE (queue text, completed int8, retried int8, dead int8, cancelled int8,
               run_ms float8, run_hist int8[], wait_ms float8, wait_hist int8[])
LANGUAGE sql STABLE
SET search_path FROM CURRENT
AS $$
    WITH mark AS (
        SELECT upto FROM rollup_mark
    ),
    parts AS (
        SELECT r.queue, r.completed, r.retried, r.dead, r.cancelled, r.run_ms, r.run_hist,
               r.wait_ms, r.wait_hist
        FROM job_rollup r
        WHERE r.bucket > since - interval '1 hour'
          AND r.bucket + CASE r.span WHEN 'hour' THEN interval '1 hour'
                                     ELSE interval '1 minute' END > since
        UNION ALL
        SELECT e.queue,
               count(*) FILTER (WHERE e.what = 'completed'),
               count(*) FILTER (WHERE e.what = 'retried'),
               count(*) FILTER (WHERE e.what = 'dead'),
               count(*) FILTER (WHERE e.what = 'cancelled'),
               COALESCE(sum(greatest(e.run_ms, 0)), 0), rollup_hist(e.run_ms),
               COALESCE(sum(greatest(e.wait_ms, 0)), 0), rollup_hist(e.wait_ms)
        FROM mark, job_ends(greatest(mark.upto, since), 'infinity') e
        GROUP BY e.queue
    )
    SELECT p.queue, sum(p.completed)::int8, sum(p.retried)::int8, sum(p.dead)::int8,
           sum(p.cancelled)::int8, sum(p.run_ms), rollup_sum(p.run_hist), sum(p.wait_ms),
           rollup_sum(p.wait_hist)
    FROM parts p
    GROUP BY p.queue
$$;

-- The operators' view, now from the rollup (same columns as before): live counts over the
-- partial indexes of unfinished jobs, finished work of the last 24 hours (to the hour).
DROP VIEW job_stats;
CREATE VIEW job_stats AS
WITH live AS (
    SELECT queue, count(*) AS queued, 0::int8 AS scheduled, 0::int8 AS processing,
           max(now() - updated_at) AS oldest_queued_age
    FROM jobs WHERE status = 'queued' GROUP BY queue
    UNION ALL
    SELECT queue, 0, count(*), 0, NULL FROM jobs WHERE status = 'scheduled' GROUP BY queue
    UNION ALL
    SELECT queue, 0, 0, count(*), NULL FROM jobs WHERE status = 'processing' GROUP BY queue
),
counts AS (
    SELECT queue, sum(queued)::int8 AS queued, sum(scheduled)::int8 AS scheduled,
           sum(processing)::int8 AS processing, max(oldest_queued_age) AS oldest_queued_age
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
       COALESCE(d.retried::float8 / nullif(d.completed + d.retried + d.dead, 0), 0) AS retry_rate
FROM counts c FULL JOIN day d ON d.queue = c.queue;
