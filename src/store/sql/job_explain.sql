-- Why a job is not running, in numbers (`jobwarden jobs show`). $1 id.
-- due_in_ms: how long until its run_at or retry is due (0 when due); the counts are of
-- jobs of its queue: queued with a higher priority, queued at its priority before it, and
-- running; how many workers are alive; and the queue's cluster-wide limits as the workers
-- last declared them, with what holds them now (grants running, starts in the window); and,
-- when its queue is paused, for how long (seconds) and by whom.
-- For a job with a key (schema version 22): whether it is parked, and its key's limits as
-- the queue's workers last declared them (flow_queues.key_*) with the key's overrides
-- (key_limits): its running jobs, its starts that count in the rate's window, the job of an
-- ordered key that goes first (a retry, a dead job, a running one, an earlier parked one),
-- how many keys' first jobs come before its own and how many parked jobs of its key; the
-- record of a skip (key_skips); and for a dead job, how many of its key's later jobs have
-- started (an ordered key starts them only once it is out of the way: their start times may
-- precede its end by a take's wait, so they are not compared).
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
       (SELECT COALESCE(sum(CASE WHEN g.per_batch THEN g.held + g.running ELSE 1 END), 0)
        FROM flow_grants g JOIN workers w ON w.id = g.worker_id
        WHERE g.queue = j.queue AND NOT g.done AND w.stopped_at IS NULL)::int8 AS cap_held,
       (SELECT COALESCE(sum(CASE WHEN g.per_batch THEN g.started ELSE 1 END), 0)
        FROM flow_grants g
        WHERE g.queue = j.queue
          AND g.started_at > now() - f.window_ms * interval '1 millisecond')::int8 AS rate_used,
       extract(epoch FROM now() - p.paused_at)::float8 AS paused_for, p.paused_by,
       j.key, j.parked,
       CASE WHEN f.key_ordered THEN 1 ELSE COALESCE(o.concurrency, f.key_cap) END AS key_cap,
       (SELECT count(*) FROM jobs r
        WHERE j.key IS NOT NULL AND r.queue = j.queue AND r.key = j.key
          AND r.status = 'processing') AS key_running,
       kr.n AS key_rate_n, kr.ms AS key_rate_ms,
       (SELECT count(*) FROM key_starts s LEFT JOIN jobs x ON x.id = s.job_id
        WHERE kr.n IS NOT NULL AND s.queue = j.queue AND s.key = j.key
          AND (s.at > now() - kr.ms * interval '1 millisecond'
               OR (x.status = 'processing' AND x.lease = s.lease)
               OR x.updated_at > now() - kr.ms * interval '1 millisecond')) AS key_rate_used,
       COALESCE(f.key_ordered, false) AS key_ordered,
       ahead.id AS ahead_id, ahead.status AS ahead_status,
       (SELECT count(*) FROM job_keys k
        WHERE j.parked AND k.queue = j.queue AND k.head_turn IS NOT NULL
          AND k.key <> COALESCE(j.key, '')
          -- With fair turns a job has no turn of its own: its key's next turn (version 24).
          AND (k.head_priority, k.head_turn)
              < (j.priority, COALESCE(j.turn, (SELECT h.head_turn FROM job_keys h
                                               WHERE h.queue = j.queue
                                                 AND h.key = COALESCE(j.key, ''))))) AS keys_ahead,
       (SELECT count(*) FROM jobs b
        WHERE j.parked AND b.queue = j.queue AND COALESCE(b.key, '') = COALESCE(j.key, '')
          AND b.status = 'queued' AND b.parked
          AND (b.priority, b.seq) < (j.priority, j.seq)) AS key_before,
       ks.skipped_by, extract(epoch FROM ks.skipped_at)::float8 AS skipped_at,
       COALESCE(f.key_dead_blocks, true) AS key_dead_blocks,
       (SELECT count(*) FROM jobs l
        WHERE j.status = 'dead' AND j.key IS NOT NULL AND COALESCE(j.seq, ks.seq) IS NOT NULL
          AND l.queue = j.queue AND l.key = j.key AND l.seq > COALESCE(j.seq, ks.seq)
          AND l.attempts > 0) AS later_started
FROM jobs j
LEFT JOIN flow_queues f ON f.queue = j.queue
LEFT JOIN queue_pauses p ON p.queue = j.queue
LEFT JOIN key_limits o ON o.queue = j.queue AND o.key = j.key
LEFT JOIN key_skips ks ON ks.job_id = j.id
CROSS JOIN LATERAL (SELECT COALESCE(o.rate_n, f.key_rate_n) AS n,
                           COALESCE(o.rate_ms, f.key_rate_ms) AS ms) kr
-- An ordered key's job that goes first: one on its way again, dead (when dead jobs hold the
-- key), running, or parked before it.
LEFT JOIN LATERAL (
    SELECT b.id, CASE WHEN b.status = 'processing' THEN 'running'
                      WHEN b.status = 'dead' THEN 'dead'
                      WHEN b.parked THEN 'parked' ELSE 'retrying' END AS status
    FROM jobs b
    WHERE f.key_ordered AND j.parked AND b.queue = j.queue AND b.key = j.key
      AND b.id <> j.id AND b.seq IS NOT NULL
      AND ((NOT b.parked AND (b.status IN ('scheduled', 'queued', 'processing')
                              OR (COALESCE(f.key_dead_blocks, true) AND b.status = 'dead')))
           OR (b.parked AND b.status = 'queued' AND b.seq < j.seq))
    ORDER BY b.parked, b.seq
    LIMIT 1) ahead ON true
WHERE j.id = $1
