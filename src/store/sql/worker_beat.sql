-- $1 id. Zero rows: this worker was declared stopped.
UPDATE workers SET heartbeat_at = now() WHERE id = $1 AND stopped_at IS NULL
