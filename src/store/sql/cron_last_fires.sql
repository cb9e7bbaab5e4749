-- When each schedule last fired (ms since the epoch), for `jobwarden cron list`.
SELECT name, (extract(epoch FROM last_fire_at) * 1000)::int8 FROM cron_state
