-- Deletes up to $1 flow grants that can count for nothing any more: done (or of a worker
-- that stopped or is gone), and started (or granted) longer ago than their queue's rate
-- window and at least an hour. flow_take() deletes its worker's rows once they count for
-- nothing; these are what is left (a worker that stopped, rows of earlier versions).
WITH v AS (
    SELECT g.id FROM flow_grants g
    LEFT JOIN flow_queues q ON q.queue = g.queue
    LEFT JOIN workers w ON w.id = g.worker_id
    WHERE (g.done OR w.id IS NULL OR w.stopped_at IS NOT NULL)
      AND COALESCE(g.started_at, g.granted_at)
          < now() - greatest(interval '1 hour', COALESCE(q.window_ms, 0) * interval '1 millisecond')
    ORDER BY g.id
    LIMIT $1
    FOR UPDATE OF g SKIP LOCKED
)
DELETE FROM flow_grants g USING v WHERE g.id = v.id
