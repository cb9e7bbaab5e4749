-- Pauses a queue (pause_queue(), migrations/V15): since when, as seconds since the epoch.
-- $1 queue; $2 who; $3 why (or NULL); $4 even when no running worker serves it.
SELECT extract(epoch FROM pause_queue($1, $2, $3, $4))::float8
