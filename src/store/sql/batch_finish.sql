-- The scheduler's batch round (version 32's batch_finish()): finishes up to $1 open batches
-- whose members have all ended, enqueueing their callbacks. Returns each one's id and callbacks.
SELECT id, callbacks FROM batch_finish($1::int4)
