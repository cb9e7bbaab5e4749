-- One batch's progress (version 32's batch_progress()): size, members waiting, running,
-- completed, dead and cancelled; when it finished, its callbacks and outcome. $1 batch id.
SELECT size, waiting, running, completed, dead, cancelled,
       to_char(finished_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'), callbacks, outcome
FROM batch_progress($1::text)
