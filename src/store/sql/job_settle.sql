-- Settles a batch of finished attempts in one statement, fenced by owner and lease: a row
-- whose lease moved on (reclaimed by someone else) is not touched. Each settled attempt that
-- did not complete its job leaves a row in job_attempt_log; a completion is read from the
-- job's own row (the job_attempts view shows both). Returns the positions (1-based) in the
-- batch of the attempts it settled, not their ids (a number per row is cheaper to send and to
-- read); the caller records the rest as late results (job_settle_late.sql), the rare case,
-- in a statement of their own. (After a retry, job_settled_check finds the ones an earlier
-- try already settled whose commit answer was lost.)
-- $1 worker id; $2 ids; $3 leases; $4 new statuses; $5 retry delays (ms); $6 errors;
-- $7 results; $8 attempt outcomes; $9 attempts refunded (1 for a graceful release); $10 retry
-- delays (ms) of the attempts settled `awaiting` (version 31), whose $5 is their deadline: the
-- row keeps its owner and lease, and its attempt is logged when it ends (complete(), fail(),
-- the deadline sweep), not now. $11 the traced runs' contexts of completions (traceparent,
-- else NULL): kept as the job's, which its `then` jobs inherit.
WITH input AS (
    SELECT *
    FROM unnest($2::text[], $3::int8[], $4::text[], $5::int8[], $6::text[], $7::jsonb[],
                $8::text[], $9::int4[], $10::int8[], $11::text[])
         WITH ORDINALITY AS t(id, lease, status, delay_ms, error, result, outcome, refund,
                              retry_ms, trace, n)
),
done AS (
    UPDATE jobs j
    SET status = i.status,
        attempts = j.attempts - i.refund,
        completed_at = CASE WHEN i.status IN ('completed', 'dead') THEN now() END,
        scheduled_at = CASE WHEN i.status = 'scheduled'
                            THEN now() + i.delay_ms * interval '1 millisecond'
                            ELSE j.scheduled_at END,
        last_error = COALESCE(i.error, j.last_error),
        result = i.result,
        traceparent = COALESCE(i.trace, j.traceparent),
        stale_at = NULL,
        await_until = CASE WHEN i.status = 'awaiting'
                           THEN now() + i.delay_ms * interval '1 millisecond' END,
        await_retry_ms = CASE WHEN i.status = 'awaiting' THEN i.retry_ms END,
        last_activity_at = CASE WHEN i.status = 'awaiting' THEN now() ELSE j.last_activity_at END,
        -- Dependents (or a `then`) to resolve: the scheduler's chain round does it.
        chain_pending = i.status IN ('completed', 'dead')
            AND (j.then_jobs IS NOT NULL OR j.has_dependents),
        updated_at = now()
    FROM input i
    -- The ids select the rows (primary key). The status test is written so that no partial
    -- index over processing rows can drive the lookup instead: those hold every job this
    -- worker runs (and rows settled but not yet vacuumed), hundreds for a group of ten.
    WHERE j.id = ANY($2::text[]) AND j.id = i.id AND j.worker_id = $1 AND j.lease = i.lease
      AND (j.status = 'processing') IS TRUE
    RETURNING i.n, j.id, j.lease, j.attempts + i.refund AS attempt, j.started_at, i.outcome,
              i.error, j.queue
),
history AS (
    INSERT INTO job_attempt_log (job_id, lease, attempt, worker_id, started_at, outcome, error, queue)
    SELECT id, lease, attempt, $1, started_at, outcome, error, queue FROM done
    WHERE outcome NOT IN ('completed', 'deferred')
)
SELECT n::int4 FROM done
