-- jobwarden schema, version 9: the rate limit holds where its effect is seen.
--
-- Version 5 counted a grant for the rate limit from its job's start for one window. But a
-- job's effect (the email it sends, the API call it makes) comes later than its start, by
-- its handler's latency, which varies: a server counting what it receives could see one more
-- than the limit in some window (the SaaS scenario saw 101 sends in 6 s with "100/6s"). Now
-- a grant counts for a window after its job started and again for a window after it ended:
-- a job shorter than the window is counted from its start until a window after its end, so
-- no window holds more than the limit's effects wherever in the job each happens. (A job
-- longer than the window does not count while it runs past its first window: the limit
-- stays a rate, not a cap on running jobs; an effect in the middle of such a job is not
-- covered.)

ALTER TABLE flow_grants ADD COLUMN done_at timestamptz;

CREATE OR REPLACE FUNCTION flow_acquire(q text, me text, want integer, cap integer, rate_n integer,
                             window_ms bigint)
RETURNS TABLE (granted integer, retry_in_ms bigint)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    n integer := greatest(want, 0);
    held integer;
    recent integer;
    period_ms float8;
    burst float8;
    tok float8;
    wait_ms bigint := 0;
    oldest timestamptz;
    win interval := COALESCE(window_ms, 0) * interval '1 millisecond';
BEGIN
    IF rate_n IS NOT NULL THEN
        period_ms := window_ms::float8 / rate_n;
        burst := greatest(1, ceil(rate_n / 20.0));
    END IF;
    INSERT INTO flow_queues (queue, tokens, at) VALUES (q, COALESCE(burst, 0), now())
    ON CONFLICT (queue) DO NOTHING;
    -- One decision at a time per queue.
    SELECT f.tokens INTO tok FROM flow_queues f WHERE f.queue = q FOR UPDATE;
    UPDATE flow_queues f SET cap = flow_acquire.cap, rate_n = flow_acquire.rate_n,
                             window_ms = flow_acquire.window_ms
    WHERE f.queue = q
      AND (f.cap, f.rate_n, f.window_ms) IS DISTINCT FROM
          (flow_acquire.cap, flow_acquire.rate_n, flow_acquire.window_ms);
    IF cap IS NOT NULL THEN
        SELECT count(*) INTO held
        FROM flow_grants g JOIN workers w ON w.id = g.worker_id
        WHERE g.queue = q AND NOT g.done AND w.stopped_at IS NULL;
        n := least(n, greatest(0, cap - held));
        IF n = 0 THEN
            wait_ms := 100; -- a running job ends at any moment: look again soon
        END IF;
    END IF;
    IF rate_n IS NOT NULL THEN
        DELETE FROM flow_grants g
        WHERE g.queue = q AND g.done
          AND COALESCE(g.done_at, g.started_at, '-infinity') <= now() - win;
        -- A job's effect (the email it sends) comes after its start, by its handler's
        -- latency: a grant counts for a window after its start and for a window after its
        -- end, and while pending.
        SELECT count(*) INTO recent
        FROM flow_grants g LEFT JOIN workers w ON w.id = g.worker_id
        WHERE g.queue = q
          AND (g.started_at > now() - win
               OR g.done_at > now() - win
               OR (g.started_at IS NULL AND NOT g.done AND w.stopped_at IS NULL
                   AND w.id IS NOT NULL));
        SELECT least(burst, f.tokens + extract(epoch FROM now() - f.at) * 1000 / period_ms)
        INTO tok FROM flow_queues f WHERE f.queue = q;
        n := least(n, greatest(0, rate_n - recent), floor(tok)::integer);
        UPDATE flow_queues f SET tokens = tok - n, at = now() WHERE f.queue = q;
        IF n = 0 AND want > 0 THEN
            IF recent >= rate_n THEN
                SELECT min(COALESCE(g.done_at, g.started_at)) INTO oldest FROM flow_grants g
                WHERE g.queue = q AND (g.started_at > now() - win OR g.done_at > now() - win);
                wait_ms := greatest(wait_ms,
                    COALESCE(ceil(extract(epoch FROM oldest + win - now()) * 1000)::bigint, 50));
            END IF;
            IF tok < 1 THEN
                wait_ms := greatest(wait_ms, ceil((1 - tok) * period_ms)::bigint);
            END IF;
        END IF;
    END IF;
    IF n > 0 THEN
        INSERT INTO flow_grants (queue, worker_id) SELECT q, me FROM generate_series(1, n);
    END IF;
    RETURN QUERY SELECT n, wait_ms;
END;
$$;
