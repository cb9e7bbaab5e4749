-- jobwarden schema, version 15: pausing a queue, cluster-wide.
--
-- A paused queue starts nothing new on any worker: every claim statement reads this table
-- (one row per paused queue) and claims nothing of a queue found here; workers stop pulling
-- its messages, which wait in the stream (no attempt spent, no ack timer running). Running
-- jobs finish. `pause_queue()` and `resume_queue()` are the SQL door; the CLI
-- (`jobwarden queues pause|resume`) and the dashboard call them.
CREATE TABLE queue_pauses (
    queue     text COLLATE "C" PRIMARY KEY,
    paused_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    paused_by text        NOT NULL,
    reason    text
);

-- The queues each worker serves (a pause of a queue no live worker serves is refused unless
-- forced: most often a typo).
ALTER TABLE workers ADD COLUMN queues text[] NOT NULL DEFAULT '{}';

-- Pauses `p_queue`; returns since when it is paused (a queue paused already keeps its time,
-- and takes the new reason when one is given). Refused, naming the queues that are served,
-- when no live worker serves it, unless `p_force` (to pause a queue before its workers run).
CREATE FUNCTION pause_queue(p_queue text, p_by text DEFAULT current_user,
                            p_reason text DEFAULT NULL, p_force boolean DEFAULT false)
RETURNS timestamptz
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    since timestamptz;
    served text;
BEGIN
    PERFORM contract_check_queue(p_queue, 'queue');
    IF p_by IS NULL OR p_by = '' THEN
        RAISE EXCEPTION 'jobwarden: a pause must say who paused (p_by), e.g. pause_queue(''email'', ''alice'')'
            USING ERRCODE = '22023';
    END IF;
    IF length(p_by) > 200 OR length(COALESCE(p_reason, '')) > 1000 THEN
        RAISE EXCEPTION 'jobwarden: a pause''s author may have at most 200 characters and its reason at most 1000 (got % and %); shorten them',
            length(p_by), length(COALESCE(p_reason, '')) USING ERRCODE = '22023';
    END IF;
    IF NOT p_force AND NOT EXISTS (
        SELECT 1 FROM workers WHERE stopped_at IS NULL AND p_queue = ANY (queues)
    ) THEN
        SELECT string_agg(DISTINCT q, ', ' ORDER BY q) INTO served
        FROM workers, unnest(queues) AS q WHERE stopped_at IS NULL;
        RAISE EXCEPTION 'jobwarden: no running worker serves queue "%" (served: %); check the name, or force the pause to hold it before its workers start',
            p_queue, COALESCE(served, 'none') USING ERRCODE = '22023';
    END IF;
    INSERT INTO queue_pauses AS p (queue, paused_by, reason)
    VALUES (p_queue, p_by, p_reason)
    ON CONFLICT (queue) DO UPDATE SET reason = COALESCE(EXCLUDED.reason, p.reason)
    RETURNING paused_at INTO since;
    RETURN since;
END;
$$;

-- Resumes `p_queue`; returns since when it had been paused, or NULL when it was not.
CREATE FUNCTION resume_queue(p_queue text) RETURNS timestamptz
LANGUAGE sql
SET search_path FROM CURRENT
AS $$
    DELETE FROM queue_pauses WHERE queue = p_queue RETURNING paused_at;
$$;
