-- $1 id; $2 reason.
UPDATE workers SET stopped_at = now(), stop_reason = $2 WHERE id = $1
