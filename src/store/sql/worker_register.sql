-- $1 id; $2 hostname; $3 pid; $4 version.
INSERT INTO workers (id, hostname, pid, version) VALUES ($1, $2, $3, $4)
ON CONFLICT (id) DO UPDATE SET heartbeat_at = now(), stopped_at = NULL
