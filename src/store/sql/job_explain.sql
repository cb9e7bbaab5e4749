-- Why a job is not running, in numbers (`jobwarden jobs show`). $1 id.
-- due_in_ms: how long until its run_at or retry is due (0 when due); the counts are of
-- jobs of its queue: queued with a higher priority, queued at its priority before it, and
-- running; how many workers are alive; and the queue's cluster-wide limits as the workers
-- last declared them, with what holds them now (grants running, starts in the window); and,
-- when its queue is paused, for how long (seconds) and by whom.
SELECT j.status, j.attempts,
       GREATEST(0, extract(epoch FROM j.scheduled_at - now()) * 1000)::int8 AS due_in_ms,
       (SELECT count(*) FROM jobs o
        WHERE o.queue = j.queue AND o.status = 'queued' AND o.priority < j.priority) AS ahead_higher,
       (SELECT count(*) FROM jobs o
        WHERE o.queue = j.queue AND o.status = 'queued' AND o.priority = j.priority
          AND o.updated_at < j.updated_at) AS ahead_same,
       (SELECT count(*) FROM jobs o
        WHERE o.queue = j.queue AND o.status = 'processing') AS running,
       (SELECT count(*) FROM workers w WHERE w.stopped_at IS NULL) AS workers_alive,
       f.cap, f.rate_n, f.window_ms,
       (SELECT count(*) FROM flow_grants g JOIN workers w ON w.id = g.worker_id
        WHERE g.queue = j.queue AND NOT g.done AND w.stopped_at IS NULL) AS cap_held,
       (SELECT count(*) FROM flow_grants g
        WHERE g.queue = j.queue
          AND g.started_at > now() - f.window_ms * interval '1 millisecond') AS rate_used,
       extract(epoch FROM now() - p.paused_at)::float8 AS paused_for, p.paused_by
FROM jobs j
LEFT JOIN flow_queues f ON f.queue = j.queue
LEFT JOIN queue_pauses p ON p.queue = j.queue
WHERE j.id = $1
