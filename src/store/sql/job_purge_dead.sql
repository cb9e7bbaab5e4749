-- Deletes dead jobs (and their attempts) that died before the cutoff. $1 age (ms).
DELETE FROM jobs WHERE status = 'dead' AND completed_at < now() - $1::int8 * interval '1 millisecond'
