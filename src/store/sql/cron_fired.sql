-- The newest fire enqueued this tick. $1 name; $2 fire time (ms).
UPDATE cron_state SET last_fire_at = to_timestamp($2::float8 / 1000), updated_at = now()
WHERE name = $1
