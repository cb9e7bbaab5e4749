-- Deletes up to $2 rows of workers that stopped more than $1 ms ago and own no running job
-- (a row a running job names stays, so the reaper can still tell why it is stuck). Workers
-- that never said they stopped are marked stopped by the reaper first.
WITH v AS (
    SELECT w.id FROM workers w
    WHERE w.stopped_at < now() - $1::int8 * interval '1 millisecond'
      AND NOT EXISTS (SELECT 1 FROM jobs j
                      WHERE j.status = 'processing' AND j.worker_id = w.id)
    ORDER BY w.stopped_at
    LIMIT $2
    FOR UPDATE OF w SKIP LOCKED
)
DELETE FROM workers w USING v WHERE w.id = v.id
