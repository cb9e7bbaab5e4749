-- Marks due jobs whose message was published as queued, with their new generation.
-- $1 ids.
UPDATE jobs
SET status = 'queued', generation = generation + 1, updated_at = now()
WHERE id = ANY($1::text[]) AND status = 'scheduled'
