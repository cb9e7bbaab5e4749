-- An operator discards dead jobs (their rows and attempts go). $1 ids (NULL: every dead job
-- of queue $2); $2 queue (NULL: any).
DELETE FROM jobs
WHERE status = 'dead'
  AND ($1::text[] IS NULL OR id = ANY($1::text[]))
  AND ($2::text IS NULL OR queue = $2)
RETURNING id
