-- The stream confirmed the publish of a job enqueued through PostgreSQL: remember the
-- sequence, so broker-loss repair can tell whether its message is still in the stream.
-- $1 id; $2 generation published; $3 stream sequence.
UPDATE jobs SET stream_seq = $3, updated_at = now()
WHERE id = $1 AND generation = $2 AND status = 'queued'
