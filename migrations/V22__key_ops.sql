-- jobwarden schema, version 22: operating per-key flow control (issue 31, items 2, 4 and 7).
--
-- What changes:
-- * `key_limits` gains a per-key rate (`rate_n` starts per `rate_ms`) that replaces the
--   queue's key_rate_limit for that key (honoured by the takes and intakes of version 24).
-- * `set_key_limit()` / `unset_key_limit()`: the SQL door to the overrides (the CLI's
--   `jobwarden keys set|unset` calls them), each value checked with a message naming it.
-- * `skip_key_job()` and `key_skips`: an operator lets an ordered key's dead head go (its
--   later jobs run on), with a record of who and when. A skipped job leaves its key's order
--   (`seq` becomes NULL, so it no longer holds the key: see `jobs_key_held`); a retry of it
--   later runs it as the key's last job.
-- * `flow_queues` keeps the key rules the queue's workers last declared (as it keeps their
--   cap and rate), so `jobwarden jobs show` can say why a parked job waits.

-- A key's own rate: `rate_n` starts in any window of `rate_ms` (both or neither), within the
-- bounds of a queue's key_rate_limit (1 to 1000000 starts, 100 ms to 7 days).
ALTER TABLE key_limits
    ADD COLUMN rate_n  integer CHECK (rate_n BETWEEN 1 AND 1000000),
    ADD COLUMN rate_ms bigint  CHECK (rate_ms BETWEEN 100 AND 604800000),
    ADD CONSTRAINT key_limits_rate_whole CHECK ((rate_n IS NULL) = (rate_ms IS NULL)),
    ADD CONSTRAINT key_limits_concurrency_max CHECK (concurrency <= 1000000);

-- The key rules of a keyed queue, as its workers last declared them (`key_rules_declare.sql`,
-- at each worker's first take).
ALTER TABLE flow_queues
    ADD COLUMN key_cap         integer,
    ADD COLUMN key_rate_n      integer,
    ADD COLUMN key_rate_ms     bigint,
    ADD COLUMN key_ordered     boolean,
    ADD COLUMN key_dead_blocks boolean,
    ADD COLUMN key_fair        boolean,
    ADD COLUMN key_declared_at timestamptz;

-- The dead heads of ordered keys that an operator skipped: who, when, and the job's place in
-- its key's order as it was.
CREATE TABLE key_skips (
    job_id     text        COLLATE "C" PRIMARY KEY,
    queue      text        COLLATE "C" NOT NULL,
    key        text        COLLATE "C" NOT NULL,
    seq        bigint      NOT NULL,
    skipped_by text        NOT NULL,
    skipped_at timestamptz NOT NULL DEFAULT now()
);

-- A rate written "<count>/<duration>" ("5/1s", "100/1m") as (starts, window in ms), or a
-- refusal naming the field `rate`.
CREATE FUNCTION key_rate_parse(rate text, OUT n integer, OUT ms bigint)
LANGUAGE plpgsql IMMUTABLE
SET search_path FROM CURRENT
AS $$
DECLARE
    m text[];
    win interval;
    fix constant text := 'write starts per window as "<count>/<duration>", e.g. "5/1s" or "100/1m", from 1 to 1000000 starts in 100ms to 7d';
BEGIN
    m := regexp_match(rate, '^\s*([0-9]{1,9})\s*/\s*(\S.*?)\s*$');
    IF m IS NULL THEN
        PERFORM contract_refuse('rate', format('%s is no rate; %s', to_jsonb(rate)::text, fix));
    END IF;
    n := m[1]::integer;
    BEGIN
        win := m[2]::interval;
    EXCEPTION WHEN others THEN
        PERFORM contract_refuse('rate', format('%s has no valid duration after the /; %s', to_jsonb(rate)::text, fix));
    END;
    ms := round(extract(epoch FROM win) * 1000)::bigint;
    IF n < 1 OR n > 1000000 THEN
        PERFORM contract_refuse('rate', format('%s allows %s starts; %s', to_jsonb(rate)::text, n, fix));
    END IF;
    IF ms < 100 OR ms > 604800000 THEN
        PERFORM contract_refuse('rate', format('%s has a window of %s ms; %s', to_jsonb(rate)::text, ms, fix));
    END IF;
END;
$$;

-- Sets a key's overrides in `key_limits`: the values given replace the key's, the others
-- (NULL) are kept; at least one is needed. `concurrency`: 1 to 1000000 jobs of the key
-- running at once; `rate`: "<count>/<duration>"; `weight`: its share of fair turns, above 0
-- and at most 1000. Whether the queue is keyed is the workers' configuration, which SQL does
-- not see: `jobwarden keys set` checks that too.
CREATE FUNCTION set_key_limit(queue text, key text, concurrency integer DEFAULT NULL,
                              rate text DEFAULT NULL, weight real DEFAULT NULL,
                              set_by text DEFAULT current_user)
RETURNS SETOF key_limits
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    rn integer;
    rms bigint;
BEGIN
    PERFORM contract_check_queue(set_key_limit.queue, 'queue');
    IF set_key_limit.key IS NULL THEN
        PERFORM contract_refuse('key', 'must be given: the key the override is for, e.g. "customer-42"');
    END IF;
    PERFORM contract_check_job_key(set_key_limit.key, 'key');
    IF set_key_limit.concurrency IS NULL AND set_key_limit.rate IS NULL
       AND set_key_limit.weight IS NULL THEN
        RAISE EXCEPTION 'jobwarden: an override needs at least one of concurrency, rate or weight, e.g. set_key_limit(''webhooks'', ''customer-42'', concurrency => 1)'
            USING ERRCODE = '22023';
    END IF;
    IF set_key_limit.concurrency IS NOT NULL
       AND (set_key_limit.concurrency < 1 OR set_key_limit.concurrency > 1000000) THEN
        PERFORM contract_refuse('concurrency', format('%s is out of range: give 1 to 1000000 jobs of the key running at once (unset_key_limit() drops the override)', set_key_limit.concurrency));
    END IF;
    IF set_key_limit.weight IS NOT NULL
       AND NOT (set_key_limit.weight > 0 AND set_key_limit.weight <= 1000) THEN
        PERFORM contract_refuse('weight', format('%s is out of range: give a share of the fair turns above 0 and at most 1000 (1 is every key''s default)', set_key_limit.weight));
    END IF;
    IF set_key_limit.set_by IS NULL OR set_key_limit.set_by = ''
       OR length(set_key_limit.set_by) > 200 THEN
        RAISE EXCEPTION 'jobwarden: an override must say who set it (set_by): 1 to 200 characters'
            USING ERRCODE = '22023';
    END IF;
    IF set_key_limit.rate IS NOT NULL THEN
        SELECT p.n, p.ms INTO rn, rms FROM key_rate_parse(set_key_limit.rate) p;
    END IF;
    RETURN QUERY
    INSERT INTO key_limits AS o (queue, key, concurrency, rate_n, rate_ms, weight, set_by, set_at)
    VALUES (set_key_limit.queue, set_key_limit.key, set_key_limit.concurrency,
            rn, rms, set_key_limit.weight, set_key_limit.set_by, now())
    ON CONFLICT (queue, key) DO UPDATE
    SET concurrency = COALESCE(EXCLUDED.concurrency, o.concurrency),
        rate_n = COALESCE(EXCLUDED.rate_n, o.rate_n),
        rate_ms = COALESCE(EXCLUDED.rate_ms, o.rate_ms),
        weight = COALESCE(EXCLUDED.weight, o.weight),
        set_by = EXCLUDED.set_by, set_at = now()
    RETURNING o.*;
END;
$$;

-- Drops a key's overrides (the queue's settings apply again); true when it had some.
CREATE FUNCTION unset_key_limit(queue text, key text) RETURNS boolean
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
BEGIN
    PERFORM contract_check_queue(unset_key_limit.queue, 'queue');
    PERFORM contract_check_job_key(unset_key_limit.key, 'key');
    DELETE FROM key_limits o
    WHERE o.queue = unset_key_limit.queue AND o.key = unset_key_limit.key;
    RETURN FOUND;
END;
$$;

-- Lets an ordered key's dead job go: its key's later jobs run on (it no longer holds the key:
-- it leaves the key's order), recorded in `key_skips` with `skipped_by` and the time. The job stays
-- dead (in the dead letters, its error kept); a retry of it runs it as the key's last job.
-- Returns the job's key. Refused, naming why, for a job that is not dead, has no key, is of a
-- queue its workers declare unordered, or holds no key's order (never parked in a keyed
-- queue, or skipped already).
CREATE FUNCTION skip_key_job(id text, skipped_by text DEFAULT current_user) RETURNS text
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    j record;
    s record;
BEGIN
    IF skip_key_job.skipped_by IS NULL OR skip_key_job.skipped_by = ''
       OR length(skip_key_job.skipped_by) > 200 THEN
        RAISE EXCEPTION 'jobwarden: a skip must say who skipped (skipped_by): 1 to 200 characters'
            USING ERRCODE = '22023';
    END IF;
    SELECT x.id, x.queue, x.key, x.status, x.seq INTO j FROM jobs x WHERE x.id = skip_key_job.id
    FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'jobwarden: no job with id %; check the id (jobwarden dlq list shows the dead jobs)',
            to_jsonb(skip_key_job.id)::text USING ERRCODE = '22023';
    END IF;
    IF j.status <> 'dead' THEN
        RAISE EXCEPTION 'jobwarden: job % is %, not dead: only a dead job can be skipped in its key''s order (a job on its way again holds its key until it completes or dies; cancel it with jobwarden jobs cancel)',
            j.id, j.status USING ERRCODE = '22023';
    END IF;
    IF j.key IS NULL THEN
        RAISE EXCEPTION 'jobwarden: job % has no key, so it holds no key''s order: nothing to skip (retry it with jobwarden dlq retry, or leave it)',
            j.id USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT 1 FROM flow_queues f WHERE f.queue = j.queue AND NOT f.key_ordered) THEN
        RAISE EXCEPTION 'jobwarden: queue % is not ordered by key (as its workers declare it), so dead job % holds no key''s order: nothing to skip (retry it with jobwarden dlq retry, or leave it)',
            j.queue, j.id USING ERRCODE = '22023';
    END IF;
    IF j.seq IS NULL THEN
        SELECT * INTO s FROM key_skips k WHERE k.job_id = j.id;
        IF FOUND THEN
            RAISE EXCEPTION 'jobwarden: job % was skipped in the order of key % already, by % at %: its key runs on',
                j.id, j.key, s.skipped_by, s.skipped_at USING ERRCODE = '22023';
        END IF;
        RAISE EXCEPTION 'jobwarden: job % never waited in the order of key % (it died before a keyed queue parked it), so it holds nothing back: nothing to skip',
            j.id, j.key USING ERRCODE = '22023';
    END IF;
    INSERT INTO key_skips (job_id, queue, key, seq, skipped_by)
    VALUES (j.id, j.queue, j.key, j.seq, skip_key_job.skipped_by)
    ON CONFLICT (job_id) DO UPDATE
    SET seq = EXCLUDED.seq, skipped_by = EXCLUDED.skipped_by, skipped_at = now();
    UPDATE jobs x SET seq = NULL, updated_at = now() WHERE x.id = j.id;
    RETURN j.key;
END;
$$;

-- job_take() honours a key's own rate from version 24 on (its job_take_keys() and
-- job_key_room() read key_limits.rate_n / rate_ms), which redefines the function.
