-- Jobs by queue and status for /metrics: one count per status, each over its partial index
-- (terminal `completed` rows, the bulk of the table, are never counted here).
SELECT queue, 'queued'::text, count(*)::int8 FROM jobs WHERE status = 'queued' GROUP BY queue
UNION ALL
SELECT queue, 'scheduled', count(*) FROM jobs WHERE status = 'scheduled' GROUP BY queue
UNION ALL
SELECT queue, 'processing', count(*) FROM jobs WHERE status = 'processing' GROUP BY queue
UNION ALL
SELECT queue, 'dead', count(*) FROM jobs WHERE status = 'dead' GROUP BY queue
