-- The per-key overrides (`key_limits`), of one queue ($1) or all (NULL), by queue and key.
SELECT o.queue, o.key, o.concurrency, o.rate_n, o.rate_ms, o.weight, o.set_by,
       extract(epoch FROM o.set_at)::float8
FROM key_limits o
WHERE $1::text IS NULL OR o.queue = $1
ORDER BY o.queue, o.key
LIMIT 10000
