-- Deletes up to $7 finished jobs of status $1 whose time is up (older than their keep, or
-- past their queue's keep_count), oldest first, and returns
-- each one's queue and completed_at (their attempt-log rows go by the jobs_delete_attempts
-- trigger, their job_deps rows by ON DELETE CASCADE). A job is kept: while its chain is not
-- resolved (chain_pending), while it is the parent of a job that has not finished, and while
-- its batch has not finished.
-- $1 status ('completed', 'cancelled' or 'dead'), $2 how long jobs of queues without an
-- override are kept (ms), $3 queues with an override, $4 how long each is kept (ms), $5 the
-- completed_at (as text) below which each loses jobs to its keep_count (NULL: no cap), $6 completed_at
-- (as text) to resume from (rows before it were looked at earlier in this round), $7 batch size.
-- Rows another transaction holds are skipped (the next round takes them).
WITH policy AS (
    SELECT p.queue,
           greatest(now() - p.keep_ms * interval '1 millisecond', p.floor::timestamptz) AS cut
    FROM unnest($3::text[], $4::int8[], $5::text[]) AS p(queue, keep_ms, floor)
),
victims AS (
    SELECT j.id
    FROM jobs j
    LEFT JOIN policy p ON p.queue = j.queue
    WHERE j.status = $1
      AND j.completed_at >= $6::text::timestamptz
      AND j.completed_at < greatest(now() - $2::int8 * interval '1 millisecond',
                                    (SELECT max(cut) FROM policy))
      AND j.completed_at < COALESCE(p.cut, now() - $2::int8 * interval '1 millisecond')
      AND NOT j.chain_pending
      -- A member of a batch published over NATS that has not finished (version 34): it is
      -- counted when the batch finishes.
      AND NOT (j.batch IS NOT NULL AND EXISTS (
          SELECT 1 FROM batches b WHERE b.id = j.batch AND b.finished_at IS NULL))
      AND NOT (j.has_dependents AND EXISTS (
          SELECT 1 FROM job_deps d JOIN jobs c ON c.id = d.child
          WHERE d.parent = j.id AND c.status NOT IN ('completed', 'dead', 'cancelled')))
    ORDER BY j.completed_at
    LIMIT $7
    FOR UPDATE OF j SKIP LOCKED
)
DELETE FROM jobs j USING victims v
WHERE j.id = v.id
RETURNING j.queue, j.completed_at::text
