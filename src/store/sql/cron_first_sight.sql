-- First sight of a schedule: it fires from now on (nothing before it existed). $1 name.
INSERT INTO cron_state (name, last_fire_at) VALUES ($1, now())
ON CONFLICT (name) DO NOTHING
