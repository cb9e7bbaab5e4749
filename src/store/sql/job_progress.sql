-- Records a progress report, fenced by owner and lease. Zero rows: ownership lost.
-- The stale deadline moves to now() + the queue's stale_after as the owner declares it.
-- $1 id; $2 worker id; $3 lease; $4 stage; $5 progress; $6 message; $7 stale_after (ms).
UPDATE jobs
SET last_activity_at = now(),
    stale_at = now() + $7::int8 * interval '1 millisecond',
    stage = COALESCE($4, stage),
    progress = COALESCE($5, progress),
    message = COALESCE($6, message),
    updated_at = now()
WHERE id = $1 AND worker_id = $2 AND lease = $3 AND status = 'processing'
