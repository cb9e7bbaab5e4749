-- Jobs by queue and status for /metrics: one count per status, each over its partial index
-- (terminal `completed` rows, the bulk of the table, are never counted here). Keyed queues
-- (schema version 22) add two pseudo-statuses: `parked` (their queued jobs waiting in
-- PostgreSQL for their key's turn, over the parked index) and `keys_waiting` (how many keys
-- have parked jobs, over job_keys' head index): no per-key series.
SELECT queue, 'queued'::text, count(*)::int8 FROM jobs WHERE status = 'queued' GROUP BY queue
UNION ALL
SELECT queue, 'scheduled', count(*) FROM jobs WHERE status = 'scheduled' GROUP BY queue
UNION ALL
SELECT queue, 'processing', count(*) FROM jobs WHERE status = 'processing' GROUP BY queue
UNION ALL
SELECT queue, 'awaiting', count(*) FROM jobs WHERE status = 'awaiting' GROUP BY queue
UNION ALL
SELECT queue, 'dead', count(*) FROM jobs WHERE status = 'dead' GROUP BY queue
UNION ALL
SELECT queue, 'parked', count(*) FROM jobs WHERE status = 'queued' AND parked GROUP BY queue
UNION ALL
SELECT queue, 'keys_waiting', count(*) FROM job_keys WHERE head_turn IS NOT NULL GROUP BY queue
