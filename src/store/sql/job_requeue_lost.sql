-- Broker-loss repair: `queued` jobs of one lane of a queue (the jobs of one priority: they
-- are published to that lane's subject) that waited longer than the deadline and
-- whose message cannot be in the stream any more. The caller reads the queue's consumer and
-- the stream: every sequence up to $4 has been delivered (or purged), none above $5 exists,
-- and the stream was created at $6. A job is lost when its publish was never confirmed
-- (no sequence), its sequence was delivered or purged (a live fetcher would have claimed
-- it), lies beyond the stream's end, or belongs to an earlier incarnation of the stream.
-- Such jobs become `scheduled` now, so the scheduler republishes them with a new message id.
-- A keyed queue's parked jobs (schema version 21) have no message by design: never lost.
-- This works under any backlog: messages still waiting in the stream are never touched.
-- $1 queue; $2 deadline (ms); $3 limit; $4 highest sequence delivered or purged;
-- $5 the stream's last sequence; $6 the stream's creation time; $7 the lane's priority.
WITH lost AS (
    SELECT id FROM jobs
    WHERE status = 'queued' AND queue = $1 AND priority = $7::int2 AND NOT parked
      AND updated_at < now() - $2::int8 * interval '1 millisecond'
      AND (stream_seq IS NULL OR stream_seq <= $4 OR stream_seq > $5 OR updated_at < $6)
    LIMIT $3
    FOR UPDATE SKIP LOCKED
),
r AS (
    UPDATE jobs j SET status = 'scheduled', scheduled_at = now(), updated_at = now()
    FROM lost WHERE j.id = lost.id
    RETURNING j.id, j.lease, j.attempts
),
history AS (
    INSERT INTO job_attempt_log (job_id, lease, attempt, outcome, error)
    SELECT id, lease, attempts, 'broker_lost',
           'queued but its message is no longer in the stream; republished' FROM r
)
SELECT id FROM r
