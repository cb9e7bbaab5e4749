-- jobwarden schema, version 24: a keyed queue's jobs start at once when their key has room
-- (issue 31, item 6: flow control must not cost the queue its throughput).
--
-- Until now every job of a keyed queue was parked by its intake (`job_intake.sql`) and taken
-- by a second statement (`job_take()`), serialized per queue: about a tenth of a plain
-- queue's throughput even when no limit ever bound. Now the intake first tries to start the
-- group's jobs directly, as a plain claim does (`job_intake_new.sql`): a job starts there
-- when its key has room (its running jobs and, with key_rate_limit, its counted starts are
-- under its limit) and nothing of its key is parked (with fair_by_key: nothing of the queue),
-- so no parked job is overtaken; the rest is parked as before.
--
-- A key's room is decided under the key's lock (`job_key_lock()`: a transaction-level
-- advisory lock per queue and key, taken in one order), and counted after it is held, so
-- what an earlier holder started is seen: two intakes, or an intake and a take, never start
-- more than a key's limit between them. job_take() takes the locks of the keys it chose and
-- counts their room again before it takes.

-- Locks keys of queue `q` for the rest of the transaction, in one order (no deadlock between
-- two lockers of overlapping keys). The two-int advisory lock space: apart from the
-- single-bigint locks of migrations and pruning.
CREATE FUNCTION job_key_lock(q text, keys text[]) RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(s.a, s.b)
    FROM (SELECT DISTINCT hashtext(q) AS a, hashtext(u.k) AS b FROM unnest(keys) AS u(k)
          ORDER BY 1, 2) s;
END;
$$;

-- The jobs of key `k` running now.
CREATE FUNCTION job_key_running(q text, k text) RETURNS bigint
LANGUAGE sql STABLE
AS $$
    SELECT count(*) FROM jobs r
    WHERE r.queue = q AND r.key = k AND r.status = 'processing' AND r.key IS NOT NULL;
$$;

-- The starts of key `k` that count against its key_rate_limit of one per `rate_ms` (see
-- `key_starts` in version 21): those of the last window, those still running, and those whose
-- job ended within the last window.
CREATE FUNCTION job_key_started(q text, k text, rate_ms bigint) RETURNS bigint
LANGUAGE sql STABLE
AS $$
    SELECT count(*) FROM key_starts s LEFT JOIN jobs j ON j.id = s.job_id
    WHERE s.queue = q AND s.key = k
      AND (s.at > now() - rate_ms * interval '1 millisecond'
           OR (j.status = 'processing' AND j.lease = s.lease)
           OR j.updated_at > now() - rate_ms * interval '1 millisecond');
$$;

-- How many more jobs of each of `keys` may start now without parking: each key locked first
-- (`job_key_lock`), then counted with what committed before. None for a key with parked jobs
-- (or, with `fair`, when the queue has any: they go first), else the key's limit less its
-- running jobs (`key_limits.concurrency`, else `cap`; NULL: no limit) and, with a rate (the
-- key's own in `key_limits`, else `rate_n` per `rate_ms`), less its counted starts. The jobs without a key ('') have no limit.
-- 2147483647 stands for no limit.
CREATE FUNCTION job_key_room(q text, keys text[], cap integer, fair boolean, rate_n integer,
                             rate_ms bigint)
RETURNS TABLE (key text, room integer)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM job_key_lock(q, keys);
    -- Set-based: one scan of the keys' running jobs, one of their parked hints, one of their
    -- starts (a statement per key costs more than the rest of the intake).
    RETURN QUERY
    WITH u AS (SELECT DISTINCT x.k FROM unnest(keys) AS x(k)),
    -- Each key's limits: its own in key_limits (version 22), else the queue's.
    lim AS (
        SELECT u.k, COALESCE(o.concurrency, cap) AS cap,
               COALESCE(o.rate_n, job_key_room.rate_n) AS rate_n,
               COALESCE(o.rate_ms, job_key_room.rate_ms) AS rate_ms
        FROM u LEFT JOIN key_limits o ON o.queue = q AND o.key = u.k),
    running AS (
        SELECT r.key AS k, count(*) AS n FROM jobs r
        WHERE r.queue = q AND r.key = ANY(keys) AND r.status = 'processing'
          AND r.key IS NOT NULL
        GROUP BY r.key),
    -- (Nothing of the queue parked, the common case: no key of it has anything parked.)
    parked AS (
        SELECT p.key AS k FROM job_keys p
        WHERE p.queue = q AND p.key = ANY(keys) AND p.head_turn IS NOT NULL
          AND EXISTS (SELECT 1 FROM job_keys a WHERE a.queue = q AND a.head_turn IS NOT NULL)),
    started AS (
        SELECT s.key AS k, count(*) AS n
        FROM lim JOIN key_starts s ON s.queue = q AND s.key = lim.k
             LEFT JOIN jobs j ON j.id = s.job_id
        WHERE lim.rate_n IS NOT NULL
          AND (s.at > now() - lim.rate_ms * interval '1 millisecond'
               OR (j.status = 'processing' AND j.lease = s.lease)
               OR j.updated_at > now() - lim.rate_ms * interval '1 millisecond')
        GROUP BY s.key),
    queue_parked AS (
        SELECT fair AND EXISTS (SELECT 1 FROM job_keys a
                                WHERE a.queue = q AND a.head_turn IS NOT NULL) AS any)
    SELECT lim.k,
           CASE WHEN (SELECT qp.any FROM queue_parked qp)
                  OR EXISTS (SELECT 1 FROM parked p WHERE p.k = lim.k)
                THEN 0
                ELSE greatest(0, least(
                    CASE WHEN lim.k = '' OR lim.cap IS NULL THEN 2147483647
                         ELSE lim.cap - COALESCE(r.n, 0) END,
                    CASE WHEN lim.k = '' OR lim.rate_n IS NULL THEN 2147483647
                         ELSE lim.rate_n - COALESCE(st.n, 0) END))::integer
           END
    FROM lim
         LEFT JOIN running r ON r.k = lim.k
         LEFT JOIN started st ON st.k = lim.k;
END;
$$;

-- The keys of queue `q` a take may take from now (all of them, or those `among` a list), in the
-- order of their first parked job, with how many each may start; at most `want` keys.
CREATE FUNCTION job_take_keys(q text, want integer, cap integer, ordered boolean,
                              dead_blocks boolean, rate_n integer, rate_ms bigint,
                              among text[])
RETURNS TABLE (key text, room integer, head_priority smallint, head_turn float8,
               weight float8)
LANGUAGE sql STABLE
AS $$
    SELECT c.key, c.room, c.head_priority, c.head_turn, c.weight FROM (
        SELECT k.key, k.head_priority, k.head_turn, COALESCE(o.weight, 1)::float8 AS weight,
               least(CASE WHEN lim.cap IS NULL THEN want ELSE lim.cap - run.n END,
                     CASE WHEN rt.n IS NULL THEN want ELSE lim.rate_n - rt.n END)::integer AS room
        FROM job_keys k
             LEFT JOIN key_limits o ON o.queue = q AND o.key = k.key
             CROSS JOIN LATERAL (SELECT CASE WHEN k.key = '' THEN NULL
                                             WHEN ordered THEN 1
                                             ELSE COALESCE(o.concurrency, cap) END AS cap,
                                        -- The key's own rate (version 22), else the queue's.
                                        COALESCE(o.rate_n, job_take_keys.rate_n) AS rate_n,
                                        COALESCE(o.rate_ms, job_take_keys.rate_ms) AS rate_ms) lim
             CROSS JOIN LATERAL (SELECT CASE WHEN lim.cap IS NULL THEN 0
                                             ELSE job_key_running(q, k.key) END AS n) run
             -- A rate-limited key's starts that still count.
             CROSS JOIN LATERAL (SELECT CASE WHEN lim.rate_n IS NULL OR k.key = '' THEN NULL
                                             ELSE job_key_started(q, k.key, lim.rate_ms)
                                        END AS n) rt
        WHERE k.queue = q AND k.head_turn IS NOT NULL
          AND (among IS NULL OR k.key = ANY(among))
          AND (lim.cap IS NULL OR run.n < lim.cap)
          AND (rt.n IS NULL OR rt.n < lim.rate_n)
          AND NOT (ordered AND k.key <> '' AND EXISTS (
                  SELECT 1 FROM jobs b
                  WHERE b.queue = q AND b.key = k.key AND b.key IS NOT NULL
                    AND b.seq IS NOT NULL AND NOT b.parked
                    AND (b.status IN ('scheduled', 'queued')
                         OR (dead_blocks AND b.status = 'dead'))))
        ORDER BY k.head_priority, k.head_turn
        LIMIT want
    ) c
    ORDER BY c.head_priority, c.head_turn;
$$;

-- job_take() as in version 22 (a key's own rate in key_limits replaces the queue's), with
-- these changes:
-- - it returns at once, without a lock or a write, when nothing of the queue is parked (a
--   keyed queue whose jobs start at their intake asks often and mostly finds nothing);
-- - it takes the locks of the keys it chose (`job_key_lock()`, then their job_keys rows) and
--   counts their room again before it takes (an intake may have started jobs of those keys);
-- - with `fair` turns, a key's turns are counted from its row, not stored in its jobs: the
--   key's next job has turn `head_turn`, the one after it head_turn + 1/weight, and so on,
--   whichever of its jobs it is (a key's jobs run in priority and publish order, while the
--   turns an intake gave them followed the order the intakes of several workers committed
--   in: taking a key's first job in publish order could give the clock a turn far ahead of
--   the key's others, and a new key then waited behind them all);
-- - its last row, with a NULL id, says parked jobs are left (`more`): the caller asks again
--   when one of its jobs ends, else only now and then.
DROP FUNCTION job_take(text, text, integer, bigint, bigint, integer, boolean, boolean, bigint,
                       integer, bigint);
CREATE FUNCTION job_take(q text, me text, want integer, stale_ms bigint, expire_ms bigint,
                         cap integer, ordered boolean, dead_blocks boolean, horizon bigint,
                         rate_n integer, rate_ms bigint, fair boolean)
RETURNS TABLE (id text, attempts integer, max_attempts integer, lease bigint,
               timeout_ms integer, payload jsonb, backoff jsonb, traceparent text,
               created_at timestamptz)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    keys text[];
    rooms integer[];
    heads float8[];
    weights float8[];
BEGIN
    IF want <= 0
       OR NOT EXISTS (SELECT 1 FROM job_keys k WHERE k.queue = q AND k.head_turn IS NOT NULL)
       OR NOT EXISTS (SELECT 1 FROM workers w WHERE w.id = me AND w.stopped_at IS NULL)
       OR EXISTS (SELECT 1 FROM queue_pauses p WHERE p.queue = q) THEN
        RETURN;
    END IF;
    INSERT INTO flow_queues (queue) VALUES (q) ON CONFLICT (queue) DO NOTHING;
    -- One decision at a time per queue; every statement below sees the last one's commit.
    PERFORM 1 FROM flow_queues f WHERE f.queue = q FOR UPDATE;
    -- The keys with parked jobs and room, first parked job first; then, with their locks
    -- held (an intake that starts or parks jobs of these keys has committed), their room
    -- and turn again.
    SELECT array_agg(c.key ORDER BY c.head_priority, c.head_turn) INTO keys
    FROM job_take_keys(q, want, cap, ordered, dead_blocks, rate_n, rate_ms, NULL) c;
    IF keys IS NOT NULL THEN
        PERFORM job_key_lock(q, keys);
        PERFORM 1 FROM job_keys k WHERE k.queue = q AND k.key = ANY(keys) ORDER BY k.key
        FOR UPDATE;
        SELECT array_agg(c.key ORDER BY c.head_priority, c.head_turn),
               array_agg(c.room ORDER BY c.head_priority, c.head_turn),
               array_agg(c.head_turn ORDER BY c.head_priority, c.head_turn),
               array_agg(c.weight ORDER BY c.head_priority, c.head_turn)
          INTO keys, rooms, heads, weights
        FROM job_take_keys(q, want, cap, ordered, dead_blocks, rate_n, rate_ms, keys) c;
    END IF;
    IF keys IS NULL THEN
        RETURN QUERY SELECT NULL::text, NULL::integer, NULL::integer, NULL::bigint,
                            NULL::integer, NULL::jsonb, NULL::jsonb, NULL::text,
                            NULL::timestamptz;
        RETURN;
    END IF;
    RETURN QUERY
    WITH picked AS (
        SELECT p.id, p.priority, c.key, c.weight,
               CASE WHEN fair THEN c.head + (p.rn - 1) / c.weight ELSE p.turn END AS turn
        FROM unnest(keys, rooms, heads, weights) AS c(key, room, head, weight)
             CROSS JOIN LATERAL (
                (SELECT y.id, y.priority, y.turn,
                        row_number() OVER (ORDER BY y.priority, y.seq) AS rn
                 FROM (SELECT j.id, j.priority, j.turn, j.seq FROM jobs j
                       WHERE NOT ordered
                         AND j.queue = q AND COALESCE(j.key, '') = c.key
                         AND j.status = 'queued' AND j.parked
                         AND (COALESCE(j.expires_at,
                                       j.created_at + expire_ms * interval '1 millisecond')
                              > now()) IS NOT FALSE
                       ORDER BY j.priority, j.seq
                       LIMIT least(c.room, want)) y)
                 UNION ALL
                 -- Ordered: the key's first job in publish order, whatever its priority (the
                 -- first of each priority, then the earliest of those).
                 (SELECT f.id, f.priority, f.turn, 1::bigint
                  FROM generate_series(0, 9) AS pr(p)
                       CROSS JOIN LATERAL (
                           SELECT j.id, j.priority, j.turn, j.seq, j.expires_at, j.created_at
                           FROM jobs j
                           WHERE ordered AND j.queue = q AND COALESCE(j.key, '') = c.key
                             AND j.priority = pr.p AND j.status = 'queued' AND j.parked
                           ORDER BY j.seq LIMIT 1) f
                  -- A first job past its expiry holds the key until the expiry round ends it;
                  -- a first job beyond the horizon waits for the messages before it.
                  WHERE f.seq < COALESCE(horizon, f.seq + 1)
                    AND (COALESCE(f.expires_at,
                                  f.created_at + expire_ms * interval '1 millisecond')
                         > now()) IS NOT FALSE
                  ORDER BY f.seq LIMIT 1)) p
        ORDER BY 2, 5
        LIMIT want
    ),
    taken AS (
        UPDATE jobs j
        SET status = 'processing', parked = false, attempts = j.attempts + 1, worker_id = me,
            lease = j.lease + 1, started_at = now(), last_activity_at = now(),
            stale_at = now() + stale_ms * interval '1 millisecond', stage = NULL,
            progress = NULL, message = NULL, updated_at = now(),
            expires_at = COALESCE(j.expires_at,
                                  j.created_at + expire_ms * interval '1 millisecond')
        FROM picked p
        WHERE j.id = p.id AND j.status = 'queued' AND j.parked
        RETURNING j.id, j.attempts, j.max_attempts, j.lease, j.timeout_ms, j.payload,
                  j.backoff, j.traceparent, j.created_at, j.priority, p.turn, j.key, p.key AS k,
                  p.weight
    ),
    started AS (
        INSERT INTO key_starts (queue, key, job_id, lease)
        SELECT q, t.key, t.id, t.lease FROM taken t
        WHERE t.key IS NOT NULL
          -- Also the starts of a key with a rate of its own (version 22).
          AND (job_take.rate_n IS NOT NULL
               OR EXISTS (SELECT 1 FROM key_limits o
                          WHERE o.queue = q AND o.key = t.key AND o.rate_n IS NOT NULL))
    ),
    clock AS (
        UPDATE flow_queues f SET vturn = greatest(f.vturn, (SELECT max(t.turn) FROM taken t))
        WHERE f.queue = q AND EXISTS (SELECT 1 FROM taken)
    ),
    -- Fair turns: each key's next turn moves on by the jobs it was given.
    turned AS (
        UPDATE job_keys k
        SET head_turn = k.head_turn + n.given / n.weight,
            last_turn = greatest(k.last_turn, k.head_turn + n.given / n.weight)
        FROM (SELECT t.k, count(*) AS given, min(t.weight) AS weight FROM taken t
              GROUP BY t.k) n
        WHERE fair AND k.queue = q AND k.key = n.k
    )
    SELECT t.id, t.attempts, t.max_attempts, t.lease, t.timeout_ms, t.payload, t.backoff,
           t.traceparent, t.created_at
    FROM taken t ORDER BY t.priority, t.turn;
    -- The visited keys' first parked jobs, as they stand now (their rows are locked: intakes
    -- parking jobs of these keys have committed, and those after this lower the hint
    -- themselves). With fair turns a key keeps its next turn while it has jobs parked.
    UPDATE job_keys k
    SET (head_priority, head_turn) = (
        SELECT j.priority, CASE WHEN fair THEN k.head_turn ELSE j.turn END FROM jobs j
        WHERE j.queue = q AND COALESCE(j.key, '') = k.key AND j.status = 'queued' AND j.parked
        ORDER BY j.priority, j.seq LIMIT 1)
    WHERE k.queue = q AND k.key = ANY(keys);
    -- Also on a queue without key_rate_limit whose keys have rates of their own; each key's
    -- starts by its own window (none left when no rate applies to it any more).
    IF job_take.rate_n IS NOT NULL
       OR EXISTS (SELECT 1 FROM key_limits o WHERE o.queue = q AND o.rate_n IS NOT NULL) THEN
        DELETE FROM key_starts s
        USING (SELECT u.key, COALESCE(o.rate_ms, job_take.rate_ms, 0) AS ms
               FROM unnest(keys) AS u(key)
                    LEFT JOIN key_limits o ON o.queue = q AND o.key = u.key) w
        WHERE s.queue = q AND s.key = w.key
          AND s.at <= now() - w.ms * interval '1 millisecond'
          AND NOT EXISTS (SELECT 1 FROM jobs j
                          WHERE j.id = s.job_id
                            AND ((j.status = 'processing' AND j.lease = s.lease)
                                 OR j.updated_at > now() - w.ms * interval '1 millisecond'));
    END IF;
    -- Keys with nothing parked whose last turn the clock has passed: their row says nothing
    -- a new one would not (a key that comes back starts at the clock).
    DELETE FROM job_keys k
    WHERE k.queue = q AND k.key = ANY(keys) AND k.head_turn IS NULL
      AND k.last_turn <= (SELECT f.vturn FROM flow_queues f WHERE f.queue = q);
    -- Parked jobs are left: the caller asks again when one of its jobs ends.
    IF EXISTS (SELECT 1 FROM job_keys k WHERE k.queue = q AND k.head_turn IS NOT NULL) THEN
        RETURN QUERY SELECT NULL::text, NULL::integer, NULL::integer, NULL::bigint,
                            NULL::integer, NULL::jsonb, NULL::jsonb, NULL::text,
                            NULL::timestamptz;
    END IF;
END;
$$;
