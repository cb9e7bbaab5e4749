-- $1 id. No row: this worker was declared stopped. Returns how long ago, on the database's
-- own clock, the heartbeat was stamped (statement start, which may be long after the beat
-- was sent if the server was stalled, or long before the answer if a lock held it).
UPDATE workers SET heartbeat_at = now() WHERE id = $1 AND stopped_at IS NULL
RETURNING extract(epoch FROM clock_timestamp() - now())::float8
