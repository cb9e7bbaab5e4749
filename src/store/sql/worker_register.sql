-- $1 id; $2 hostname; $3 pid; $4 version; $5 boot id; $6 process start (clock ticks);
-- $7 pid namespace.
INSERT INTO workers (id, hostname, pid, version, boot_id, proc_start, pid_ns)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (id) DO UPDATE SET heartbeat_at = now(), stopped_at = NULL, stop_reason = NULL
