-- The jobs the database says this worker owns. $1 worker id.
SELECT id, lease FROM jobs WHERE status = 'processing' AND worker_id = $1
