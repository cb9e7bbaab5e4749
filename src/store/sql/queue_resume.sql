-- Resumes a queue (resume_queue(), migrations/V15): since when it had been paused (seconds
-- since the epoch), NULL when it was not paused. $1 queue.
SELECT extract(epoch FROM resume_queue($1))::float8
