-- A message that could not even become a dead job.
-- $1 worker id; $2 subject; $3 stream sequence; $4 reason; $5 body (truncated); $6 body size.
INSERT INTO poison_messages (worker_id, subject, stream_seq, reason, body, body_bytes)
VALUES ($1, $2, $3, $4, $5, $6)
