-- A schedule's last fire and the database's now (ms since the epoch), locked for this tick;
-- no row when another worker holds it this moment. $1 name.
SELECT (extract(epoch FROM last_fire_at) * 1000)::int8,
       (extract(epoch FROM now()) * 1000)::int8
FROM cron_state WHERE name = $1 FOR UPDATE SKIP LOCKED
