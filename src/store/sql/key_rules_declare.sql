-- A worker declares a keyed queue's key rules as it runs them (at its first take), so that
-- `jobwarden jobs show` can say why a parked job waits. $1 queue; $2 each key's limit;
-- $3 starts per $4 ms per key; $5 ordered; $6 a dead job holds its key; $7 fair turns.
INSERT INTO flow_queues AS f (queue, key_cap, key_rate_n, key_rate_ms, key_ordered,
                              key_dead_blocks, key_fair, key_declared_at)
VALUES ($1::text, $2::int4, $3::int4, $4::int8, $5::bool, $6::bool, $7::bool, now())
ON CONFLICT (queue) DO UPDATE
SET key_cap = EXCLUDED.key_cap, key_rate_n = EXCLUDED.key_rate_n,
    key_rate_ms = EXCLUDED.key_rate_ms, key_ordered = EXCLUDED.key_ordered,
    key_dead_blocks = EXCLUDED.key_dead_blocks, key_fair = EXCLUDED.key_fair,
    key_declared_at = now()
