-- Records a progress report, fenced by owner and lease. Zero rows: ownership lost.
-- $1 id; $2 worker id; $3 lease; $4 stage; $5 progress; $6 message.
UPDATE jobs
SET last_activity_at = now(),
    stage = COALESCE($4, stage),
    progress = COALESCE($5, progress),
    message = COALESCE($6, message),
    updated_at = now()
WHERE id = $1 AND worker_id = $2 AND lease = $3 AND status = 'processing'
