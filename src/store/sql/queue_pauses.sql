-- The paused queues: name, since when (seconds since the epoch), for how long, who paused
-- and why.
SELECT queue, extract(epoch FROM paused_at)::float8,
       extract(epoch FROM now() - paused_at)::float8, paused_by, reason
FROM queue_pauses ORDER BY queue
