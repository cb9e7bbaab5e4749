-- When the named cron schedules ($1, one dashboard page of them) last fired, as milliseconds
-- since the epoch.
SELECT name, (extract(epoch FROM last_fire_at) * 1000)::int8
FROM cron_state
WHERE name = ANY($1::text[])
