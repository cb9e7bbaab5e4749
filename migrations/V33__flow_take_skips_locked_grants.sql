-- jobwarden schema, version 33: flow_take() no longer deadlocks two workers of one rate-limited
-- queue. A worker's take first writes its own grant rows (its report), then waits for the
-- queue's row; the worker holding that row deleted the rows that count for nothing any more,
-- every worker's, and so waited for the first one's rows: PostgreSQL found the deadlock after
-- deadlock_timeout (1 s) and failed one of the two (both retried after a back-off; seen in
-- the flow tests' logs, `deadlock detected … cannot take grants`). Now that deletion skips the
-- rows another transaction holds (they go in a later round; they count for nothing either
-- way). Otherwise as version 25's.
CREATE OR REPLACE FUNCTION flow_take(q text, me text, want integer, cap integer, rate_n integer,
                          window_ms bigint, rows_id bigint[], rows_held integer[],
                          rows_running integer[], rows_started integer[],
                          per_job boolean DEFAULT false)
RETURNS TABLE (grant_id bigint, granted integer, retry_in_ms bigint)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    n integer := greatest(want, 0);
    taken integer;
    recent integer;
    period_ms float8;
    burst float8;
    tok float8;
    wait_ms bigint := 0;
    oldest timestamptz;
    row_id bigint;
    win interval := COALESCE(window_ms, 0) * interval '1 millisecond';
BEGIN
    -- (A worker of an earlier version, through flow_acquire(), reports nothing.)
    IF NOT per_job THEN
        -- The worker's report first: a row it no longer holds or runs anything of is done; one
        -- whose count of ended jobs went up had a job end now; one that started more, a start.
        UPDATE flow_grants g
        SET held = u.held, running = u.running, started = u.started,
            started_at = CASE WHEN u.started > g.started THEN now() ELSE g.started_at END,
            last_end_at = CASE WHEN u.started - u.running > g.started - g.running
                               THEN now() ELSE g.last_end_at END,
            done = u.held = 0 AND u.running = 0,
            done_at = CASE WHEN u.held = 0 AND u.running = 0 THEN now() END
        FROM unnest(rows_id, rows_held, rows_running, rows_started) AS u(id, held, running, started)
        WHERE g.id = u.id AND g.worker_id = me AND g.queue = q AND g.per_batch AND NOT g.done
          AND (g.held, g.running, g.started) IS DISTINCT FROM (u.held, u.running, u.started);
        -- The worker reports every row of the queue it still holds or runs anything of: another
        -- is one whose grant it never heard of (the answer was lost) or one of an earlier
        -- process under its id. Done now.
        UPDATE flow_grants g
        SET held = 0, running = 0, done = true, done_at = now(),
            last_end_at = CASE WHEN g.running > 0 THEN now() ELSE g.last_end_at END
        WHERE g.worker_id = me AND g.queue = q AND g.per_batch AND NOT g.done
          AND g.id <> ALL(rows_id);
        -- Done and counting for nothing more: without a rate limit at once, else a window after
        -- its last start and end.
        DELETE FROM flow_grants g
        WHERE g.worker_id = me AND g.queue = q AND g.per_batch AND g.done
          AND (rate_n IS NULL OR g.started = 0
               OR greatest(g.started_at, g.last_end_at) <= now() - win);
    END IF;
    IF want <= 0 THEN
        RETURN QUERY SELECT NULL::bigint, 0, 0::bigint;
        RETURN;
    END IF;
    IF rate_n IS NOT NULL THEN
        period_ms := window_ms::float8 / rate_n;
        burst := greatest(1, ceil(rate_n / 20.0));
    END IF;
    INSERT INTO flow_queues (queue, tokens, at) VALUES (q, COALESCE(burst, 0), now())
    ON CONFLICT (queue) DO NOTHING;
    -- One decision at a time per queue.
    SELECT f.tokens INTO tok FROM flow_queues f WHERE f.queue = q FOR UPDATE;
    UPDATE flow_queues f SET cap = flow_take.cap, rate_n = flow_take.rate_n,
                             window_ms = flow_take.window_ms
    WHERE f.queue = q
      AND (f.cap, f.rate_n, f.window_ms) IS DISTINCT FROM
          (flow_take.cap, flow_take.rate_n, flow_take.window_ms);
    IF cap IS NOT NULL THEN
        SELECT COALESCE(sum(CASE WHEN g.per_batch THEN g.held + g.running ELSE 1 END), 0)
        INTO taken
        FROM flow_grants g JOIN workers w ON w.id = g.worker_id
        WHERE g.queue = q AND NOT g.done AND w.stopped_at IS NULL;
        n := least(n, greatest(0, cap - taken));
        IF n = 0 THEN
            wait_ms := 100; -- a running job ends at any moment: look again soon
        END IF;
    END IF;
    IF rate_n IS NOT NULL THEN
        -- Other workers' rows that count for nothing any more; one a worker is writing (its
        -- own report, before it waits for this queue's row) is left for a later round: waiting
        -- for it here, while holding the queue's row that worker waits for, was a deadlock.
        DELETE FROM flow_grants g
        WHERE g.id IN (SELECT x.id FROM flow_grants x
                       WHERE x.queue = q AND x.done
                         AND greatest(x.done_at, x.started_at, x.last_end_at, '-infinity')
                             <= now() - win
                       FOR UPDATE SKIP LOCKED);
        -- A start counts for a window after it and for a window after its job's end (its
        -- row's last end), and a grant while it is pending.
        SELECT COALESCE(sum(
                   CASE WHEN NOT g.per_batch THEN 1
                        ELSE (CASE WHEN g.started_at > now() - win OR g.last_end_at > now() - win
                                   THEN g.started ELSE 0 END)
                             + (CASE WHEN NOT g.done AND w.stopped_at IS NULL AND w.id IS NOT NULL
                                     THEN g.held ELSE 0 END) END), 0)
        INTO recent
        FROM flow_grants g LEFT JOIN workers w ON w.id = g.worker_id
        WHERE g.queue = q
          AND (CASE WHEN g.per_batch
                    THEN g.started_at > now() - win OR g.last_end_at > now() - win
                         OR (g.held > 0 AND NOT g.done AND w.stopped_at IS NULL AND w.id IS NOT NULL)
                    ELSE g.started_at > now() - win OR g.done_at > now() - win
                         OR (g.started_at IS NULL AND NOT g.done AND w.stopped_at IS NULL
                             AND w.id IS NOT NULL) END);
        SELECT least(burst, f.tokens + extract(epoch FROM now() - f.at) * 1000 / period_ms)
        INTO tok FROM flow_queues f WHERE f.queue = q;
        n := least(n, greatest(0, rate_n - recent), floor(tok)::integer);
        UPDATE flow_queues f SET tokens = tok - n, at = now() WHERE f.queue = q;
        IF n = 0 THEN
            IF recent >= rate_n THEN
                SELECT min(CASE WHEN g.per_batch THEN greatest(g.started_at, g.last_end_at)
                                ELSE greatest(g.started_at, g.done_at) END) INTO oldest
                FROM flow_grants g
                WHERE g.queue = q
                  AND (g.started_at > now() - win OR g.done_at > now() - win
                       OR g.last_end_at > now() - win);
                wait_ms := greatest(wait_ms,
                    COALESCE(ceil(extract(epoch FROM oldest + win - now()) * 1000)::bigint, 50));
            END IF;
            IF tok < 1 THEN
                wait_ms := greatest(wait_ms, ceil((1 - tok) * period_ms)::bigint);
            END IF;
        END IF;
    END IF;
    IF n > 0 AND per_job THEN
        INSERT INTO flow_grants (queue, worker_id) SELECT q, me FROM generate_series(1, n);
    ELSIF n > 0 THEN
        INSERT INTO flow_grants (queue, worker_id, held, per_batch)
        VALUES (q, me, n, true)
        RETURNING id INTO row_id;
    END IF;
    RETURN QUERY SELECT row_id, n, wait_ms;
END;
$$;
