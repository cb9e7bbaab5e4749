-- jobwarden schema, version 5: cluster-wide flow control per queue (a concurrency cap and a
-- rate limit that hold across every pod).
--
-- A worker pulls a limited queue's messages only with grants it took here first, so a job
-- waiting for its turn stays in the stream: it holds no ack timer, no max_ack_pending slot
-- and burns no attempt. One row per grant:
--   granted (started_at NULL, done false) -> started (the claim ran it) -> done (finished);
--   a grant the worker did not use is deleted.
-- The cap counts the grants of live workers that are not done; the rate limit counts grants
-- started inside the window, and grants of live workers not started yet. Rows of a worker
-- that stopped count for the cap no more (its jobs are taken back), and for the rate limit
-- only once started.
CREATE TABLE flow_grants (
    id         bigserial   PRIMARY KEY,
    queue      text        NOT NULL,
    worker_id  text        NOT NULL,
    granted_at timestamptz NOT NULL DEFAULT now(),
    started_at timestamptz,
    done       boolean     NOT NULL DEFAULT false
);
CREATE INDEX flow_grants_queue ON flow_grants (queue, started_at);
CREATE INDEX flow_grants_worker ON flow_grants (worker_id, queue) WHERE NOT done;

-- Per queue: the rate limit's token bucket (spreads a burst smoothly over the window) and
-- the row every grant locks, so grants of one queue are decided one at a time.
-- The limits as the workers last declared them (for `jobwarden jobs show`).
CREATE TABLE flow_queues (
    queue     text        PRIMARY KEY,
    tokens    real        NOT NULL DEFAULT 0,
    at        timestamptz NOT NULL DEFAULT now(),
    cap       integer,
    rate_n    integer,
    window_ms bigint
);

-- Grants worker `me` up to `want` starts of queue `q` now, within the cap (`cap` jobs of the
-- queue running at once across all workers; NULL: none) and the rate limit (`rate_n` starts
-- per `window_ms`; NULL: none). The rate limit never lets more than rate_n start in any
-- window, and a token bucket (burst: a twentieth of the limit, at least 1) spreads a backlog
-- evenly over the window instead of in bursts. Returns how many were granted and, when none
-- were, how long to wait before asking again.
CREATE FUNCTION flow_acquire(q text, me text, want integer, cap integer, rate_n integer,
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
        WHERE g.queue = q AND g.done AND (g.started_at IS NULL OR g.started_at <= now() - win);
        SELECT count(*) INTO recent
        FROM flow_grants g LEFT JOIN workers w ON w.id = g.worker_id
        WHERE g.queue = q
          AND (g.started_at > now() - win
               OR (g.started_at IS NULL AND NOT g.done AND w.stopped_at IS NULL
                   AND w.id IS NOT NULL));
        SELECT least(burst, f.tokens + extract(epoch FROM now() - f.at) * 1000 / period_ms)
        INTO tok FROM flow_queues f WHERE f.queue = q;
        n := least(n, greatest(0, rate_n - recent), floor(tok)::integer);
        UPDATE flow_queues f SET tokens = tok - n, at = now() WHERE f.queue = q;
        IF n = 0 AND want > 0 THEN
            IF recent >= rate_n THEN
                SELECT min(g.started_at) INTO oldest FROM flow_grants g
                WHERE g.queue = q AND g.started_at > now() - win;
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
