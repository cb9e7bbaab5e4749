-- Other live-looking incarnations on this hostname (start-up reconciliation).
-- $1 hostname; $2 this worker's id.
SELECT id, pid, boot_id, proc_start, pid_ns FROM workers
WHERE hostname = $1 AND id <> $2 AND stopped_at IS NULL
