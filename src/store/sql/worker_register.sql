-- $1 id; $2 hostname; $3 pid; $4 version; $5 boot id; $6 process start (clock ticks);
-- $7 pid namespace; $8 heartbeat_every (ms); $9 dead_after (ms): what others judge this
-- worker's heartbeat by; $10 the largest payload it decodes (SQL enqueue() refuses larger);
-- $11 the queues it serves.
INSERT INTO workers (id, hostname, pid, version, boot_id, proc_start, pid_ns,
                     heartbeat_every_ms, dead_after_ms, max_payload_bytes, queues)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
ON CONFLICT (id) DO UPDATE SET heartbeat_at = now(), stopped_at = NULL, stop_reason = NULL,
    heartbeat_every_ms = EXCLUDED.heartbeat_every_ms, dead_after_ms = EXCLUDED.dead_after_ms,
    max_payload_bytes = EXCLUDED.max_payload_bytes, queues = EXCLUDED.queues
