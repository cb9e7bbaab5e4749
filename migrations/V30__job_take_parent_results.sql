-- jobwarden schema, version 30: a keyed queue's take returns each taken job's parents'
-- results (version 28) from its own UPDATE ... RETURNING, the last column, instead of the
-- statement reading them again per taken job (that second read cost the take's callers
-- about half a millisecond of publish-to-start latency, measured). Otherwise as version 24's.
DROP FUNCTION job_take(text, text, integer, bigint, bigint, integer, boolean, boolean, bigint,
                       integer, bigint, boolean);
CREATE FUNCTION job_take(q text, me text, want integer, stale_ms bigint, expire_ms bigint,
                         cap integer, ordered boolean, dead_blocks boolean, horizon bigint,
                         rate_n integer, rate_ms bigint, fair boolean)
RETURNS TABLE (id text, attempts integer, max_attempts integer, lease bigint,
               timeout_ms integer, payload jsonb, backoff jsonb, traceparent text,
               created_at timestamptz, parent_results jsonb)
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
                            NULL::timestamptz, NULL::jsonb;
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
                  p.weight, j.parent_results
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
           t.traceparent, t.created_at, t.parent_results
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
                            NULL::timestamptz, NULL::jsonb;
    END IF;
END;
$$;

