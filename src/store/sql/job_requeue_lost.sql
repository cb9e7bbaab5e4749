-- Broker-loss reconciliation: `queued` jobs of a queue whose consumer has nothing left to
-- deliver, and that waited longer than the deadline, have no message any more (lost by
-- the broker, purged, or the publish failed after commit). They become `scheduled` now, so
-- the scheduler republishes them with a new message id.
-- $1 queue; $2 deadline (ms); $3 limit.
WITH lost AS (
    SELECT id FROM jobs
    WHERE status = 'queued' AND queue = $1 AND updated_at < now() - $2::int8 * interval '1 millisecond'
    LIMIT $3
    FOR UPDATE SKIP LOCKED
),
r AS (
    UPDATE jobs j SET status = 'scheduled', scheduled_at = now(), updated_at = now()
    FROM lost WHERE j.id = lost.id
    RETURNING j.id, j.lease, j.attempts
),
history AS (
    INSERT INTO job_attempts (job_id, lease, attempt, outcome, error)
    SELECT id, lease, attempts, 'broker_lost',
           'queued but no message left in the stream; republished' FROM r
)
SELECT id FROM r
