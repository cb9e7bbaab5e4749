-- The scheduler's deadline round: ends up to $1 awaiting jobs whose deadline passed, retried
-- or dead-lettered by their policy (version 31's job_await_expire()). Returns each one's id,
-- queue and new status.
SELECT id, queue, status FROM job_await_expire($1::int4)
