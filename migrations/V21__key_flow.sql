-- jobwarden schema, version 21: per-key flow control (a queue's key_concurrency and
-- fair_by_key; issue 31).
--
-- A keyed queue runs from PostgreSQL. Its producer pulls messages ahead of its free slots
-- and parks their jobs here (`job_intake.sql`: status `queued`, `parked`), acking the
-- messages once the rows are committed; its slots then take parked jobs (`job_take()`),
-- within each key's limit and in turn order, so one key's backlog never stands in front of
-- another key's jobs, and a job over its key's limit waits without an ack timer, without a
-- stream slot and without spending an attempt. A parked job has no message in the stream:
-- broker-loss repair leaves it alone (`job_requeue_lost.sql`). A retry or a release goes
-- the usual way (scheduled, published when due) and is parked again by the intake.
--
-- `turn` orders a queue's parked jobs: the message's stream sequence (publish order), or,
-- with fair_by_key, a virtual time: each key's jobs are spaced one turn apart from the
-- later of the key's last turn and the queue's clock (the turn of the last job taken), so a
-- key that had nothing waiting starts level with the jobs starting now, and keys with work
-- alternate (a key's weight in `key_limits` spaces its jobs 1/weight apart: a key of weight 2
-- gets two turns for another's one).
--
-- Within a key, jobs go by priority, then publish order (`seq`: the stream sequence of the
-- message that first brought the job). With ordered_by_key, a key runs one job at a time in
-- publish order alone, and a job of the key that is on its way again (a retry, a release) or
-- (with ordered_on_dead = "block") dead holds the key's later jobs back.
ALTER TABLE jobs ADD COLUMN parked boolean NOT NULL DEFAULT false,
                 ADD COLUMN turn float8,
                 ADD COLUMN seq bigint;

-- A keyed queue's parked jobs, per key, in the key's order (jobs without a key under '').
CREATE INDEX jobs_parked ON jobs (queue, (COALESCE(key, '')), priority, seq)
    WHERE status = 'queued' AND parked;
-- The running jobs of a key (its limit).
CREATE INDEX jobs_key_running ON jobs (queue, key) WHERE status = 'processing' AND key IS NOT NULL;
-- The jobs of a key that hold an ordered key's later jobs back besides running ones: parked
-- once and now on their way again, or dead.
CREATE INDEX jobs_key_held ON jobs (queue, key)
    WHERE key IS NOT NULL AND seq IS NOT NULL AND NOT parked
      AND status IN ('scheduled', 'queued', 'dead');

-- Per key of a keyed queue: where its first parked job stands (a hint, never later than the
-- truth: `job_take()` visits keys in this order and puts the true head back), and the turn
-- its last job was given. A key whose jobs have all started and whose turn the queue's
-- clock has passed has no row.
CREATE TABLE job_keys (
    queue         text     COLLATE "C" NOT NULL,
    key           text     COLLATE "C" NOT NULL, -- '' for the jobs without a key
    head_priority smallint,
    head_turn     float8,
    last_turn     float8   NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, key)
);
CREATE INDEX job_keys_head ON job_keys (queue, head_priority, head_turn)
    WHERE head_turn IS NOT NULL;

-- The starts of a key_rate_limit queue's jobs, per key: each counts for a window after it,
-- while its attempt runs, and for a window after the job's row last changed (its end), so
-- no window of the handlers' own starts holds more than the limit, however late each
-- handler starts after its take. Pruned by the takes that visit the key.
CREATE TABLE key_starts (
    queue  text        COLLATE "C" NOT NULL,
    key    text        COLLATE "C" NOT NULL,
    at     timestamptz NOT NULL DEFAULT now(),
    job_id text        COLLATE "C" NOT NULL,
    lease  bigint      NOT NULL
);
CREATE INDEX key_starts_key ON key_starts (queue, key, at);

-- The queue's clock for fair turns: the latest turn taken.
ALTER TABLE flow_queues ADD COLUMN vturn float8 NOT NULL DEFAULT 0;

-- Per-key limits that differ from the queue's: operators edit this table (or use
-- `jobwarden keys set`); a NULL column means the queue's setting.
CREATE TABLE key_limits (
    queue       text        COLLATE "C" NOT NULL,
    key         text        COLLATE "C" NOT NULL,
    concurrency integer     CHECK (concurrency >= 1),
    weight      real        CHECK (weight > 0 AND weight <= 1000),
    set_by      text        NOT NULL DEFAULT current_user,
    set_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue, key)
);

-- Takes up to `want` parked jobs of queue `q` for worker `me`: each key at most its limit
-- (`key_limits.concurrency`, else `cap`; NULL: none) running at once across all workers,
-- keys visited in the order of their first parked job (priority, then turn), a key's jobs in
-- priority and publish order. With `ordered`: one job of a key at a time, in publish order,
-- and none while a job of the key is on its way again (or dead, with `dead_blocks`); only jobs
-- whose message came before `horizon` (the lowest stream sequence whose message may not be
-- parked yet, as the caller read it from the queue's consumers: every earlier message of
-- the queue is parked, or otherwise done with), so a key's earlier job still on its way to
-- an intake (in another worker's hands, or in one that died) is never overtaken.
-- With `rate_n` per `rate_ms` (key_rate_limit): a key starts at most rate_n jobs in any
-- window of rate_ms: each start (`key_starts`) counts for a window after it, while it runs,
-- and for a window after its job's row last changed.
-- Nothing when the worker is not registered or the queue is paused.
-- Takes of one queue are decided one at a time (its flow_queues row), each statement here
-- seeing what the one before committed, so no key ever runs more than its limit.
-- `stale_ms`: the queue's stale_after as `me` declares it; `expire_ms`: its expire_after
-- (NULL: none); a job past its expiry is not taken (the scheduler's expiry round ends it).
CREATE FUNCTION job_take(q text, me text, want integer, stale_ms bigint, expire_ms bigint,
                         cap integer, ordered boolean, dead_blocks boolean, horizon bigint,
                         rate_n integer, rate_ms bigint)
RETURNS TABLE (id text, attempts integer, max_attempts integer, lease bigint,
               timeout_ms integer, payload jsonb, backoff jsonb, traceparent text,
               created_at timestamptz)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    keys text[];
    rooms integer[];
BEGIN
    IF want <= 0
       OR NOT EXISTS (SELECT 1 FROM workers w WHERE w.id = me AND w.stopped_at IS NULL)
       OR EXISTS (SELECT 1 FROM queue_pauses p WHERE p.queue = q) THEN
        RETURN;
    END IF;
    INSERT INTO flow_queues (queue) VALUES (q) ON CONFLICT (queue) DO NOTHING;
    -- One decision at a time per queue; every statement below sees the last one's commit.
    PERFORM 1 FROM flow_queues f WHERE f.queue = q FOR UPDATE;
    -- The keys with parked jobs and room, first parked job first.
    SELECT array_agg(c.key ORDER BY c.head_priority, c.head_turn),
           array_agg(c.room ORDER BY c.head_priority, c.head_turn) INTO keys, rooms
    FROM (
        SELECT k.key, k.head_priority, k.head_turn,
               least(CASE WHEN lim.cap IS NULL THEN want ELSE lim.cap - run.n END,
                     CASE WHEN rt.n IS NULL THEN want ELSE rate_n - rt.n END) AS room
        FROM job_keys k
             LEFT JOIN key_limits o ON o.queue = q AND o.key = k.key
             CROSS JOIN LATERAL (SELECT CASE WHEN k.key = '' THEN NULL
                                             WHEN ordered THEN 1
                                             ELSE COALESCE(o.concurrency, cap) END AS cap) lim
             CROSS JOIN LATERAL (SELECT count(*)::integer AS n FROM jobs r
                                 WHERE lim.cap IS NOT NULL AND r.queue = q AND r.key = k.key
                                   AND r.status = 'processing' AND r.key IS NOT NULL) run
             -- A rate-limited key's starts that still count.
             LEFT JOIN LATERAL (
                 SELECT count(*) AS n FROM key_starts s LEFT JOIN jobs j ON j.id = s.job_id
                 WHERE rate_n IS NOT NULL AND k.key <> '' AND s.queue = q AND s.key = k.key
                   AND (s.at > now() - rate_ms * interval '1 millisecond'
                        OR (j.status = 'processing' AND j.lease = s.lease)
                        OR j.updated_at > now() - rate_ms * interval '1 millisecond')
                 HAVING rate_n IS NOT NULL AND k.key <> '') rt ON true
        WHERE k.queue = q AND k.head_turn IS NOT NULL
          AND (lim.cap IS NULL OR run.n < lim.cap)
          AND (rt.n IS NULL OR rt.n < rate_n)
          AND NOT (ordered AND k.key <> '' AND EXISTS (
                  SELECT 1 FROM jobs b
                  WHERE b.queue = q AND b.key = k.key AND b.key IS NOT NULL
                    AND b.seq IS NOT NULL AND NOT b.parked
                    AND (b.status IN ('scheduled', 'queued')
                         OR (dead_blocks AND b.status = 'dead'))))
        ORDER BY k.head_priority, k.head_turn
        LIMIT want
    ) c;
    IF keys IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH picked AS (
        SELECT p.id, p.priority, p.turn
        FROM unnest(keys, rooms) AS c(key, room)
             CROSS JOIN LATERAL (
                (SELECT j.id, j.priority, j.turn FROM jobs j
                 WHERE NOT ordered
                   AND j.queue = q AND COALESCE(j.key, '') = c.key AND j.status = 'queued'
                   AND j.parked
                   AND (COALESCE(j.expires_at, j.created_at + expire_ms * interval '1 millisecond')
                        > now()) IS NOT FALSE
                 ORDER BY j.priority, j.seq
                 LIMIT least(c.room, want))
                 UNION ALL
                 -- Ordered: the key's first job in publish order, whatever its priority (the
                 -- first of each priority, then the earliest of those).
                 (SELECT f.id, f.priority, f.turn
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
        ORDER BY p.priority, p.turn
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
                  j.backoff, j.traceparent, j.created_at, j.priority, j.turn, j.key
    ),
    started AS (
        INSERT INTO key_starts (queue, key, job_id, lease)
        SELECT q, t.key, t.id, t.lease FROM taken t WHERE rate_n IS NOT NULL AND t.key IS NOT NULL
    ),
    clock AS (
        UPDATE flow_queues f SET vturn = greatest(f.vturn, (SELECT max(t.turn) FROM taken t))
        WHERE f.queue = q AND EXISTS (SELECT 1 FROM taken)
    )
    SELECT t.id, t.attempts, t.max_attempts, t.lease, t.timeout_ms, t.payload, t.backoff,
           t.traceparent, t.created_at
    FROM taken t ORDER BY t.priority, t.turn;
    -- The visited keys' first parked jobs, as they stand now. Locking the keys' rows first
    -- waits for intakes that are parking jobs of these keys: once they hold the locks, their
    -- jobs are committed and seen here (an intake after this lowers the hint itself).
    PERFORM 1 FROM job_keys k WHERE k.queue = q AND k.key = ANY(keys) ORDER BY k.key FOR UPDATE;
    UPDATE job_keys k
    SET (head_priority, head_turn) = (
        SELECT j.priority, j.turn FROM jobs j
        WHERE j.queue = q AND COALESCE(j.key, '') = k.key AND j.status = 'queued' AND j.parked
        ORDER BY j.priority, j.seq LIMIT 1)
    WHERE k.queue = q AND k.key = ANY(keys);
    IF rate_n IS NOT NULL THEN
        DELETE FROM key_starts s
        WHERE s.queue = q AND s.key = ANY(keys)
          AND s.at <= now() - rate_ms * interval '1 millisecond'
          AND NOT EXISTS (SELECT 1 FROM jobs j
                          WHERE j.id = s.job_id
                            AND ((j.status = 'processing' AND j.lease = s.lease)
                                 OR j.updated_at > now() - rate_ms * interval '1 millisecond'));
    END IF;
    -- Keys with nothing parked whose last turn the clock has passed: their row says nothing
    -- a new one would not (a key that comes back starts at the clock).
    DELETE FROM job_keys k
    WHERE k.queue = q AND k.key = ANY(keys) AND k.head_turn IS NULL
      AND k.last_turn <= (SELECT f.vturn FROM flow_queues f WHERE f.queue = q);
END;
$$;
