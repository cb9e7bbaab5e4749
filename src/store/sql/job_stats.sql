-- The job_stats view (migrations/V2), as `jobwarden stats` prints it.
SELECT queue, queued, scheduled, processing, completed_24h, dead_24h,
       extract(epoch FROM oldest_queued_age)::float8, p50_run_seconds, p95_run_seconds,
       retry_rate, awaiting
FROM job_stats ORDER BY queue
