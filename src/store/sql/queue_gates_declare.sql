-- A worker declares the debounce, throttle and unique_for of the queues it serves (at start
-- and at every registration), for the jobs that come in through SQL, the CLI, the Rust
-- client, cron and `then` (`job_gate()` reads them); the last worker to declare wins. A queue
-- with none of them is declared too (its row says none), so a setting taken out of the
-- config stops applying once a worker with the new config starts.
-- $1 worker id; $2.. one array per column: queues, debounce, max wait, throttle, unique_for
-- (ms, NULL for none).
INSERT INTO queue_gates AS g (queue, debounce_ms, max_wait_ms, throttle_ms, unique_for_ms,
                              declared_by, declared_at)
SELECT q, d, m, t, u, $1, now()
FROM unnest($2::text[], $3::int8[], $4::int8[], $5::int8[], $6::int8[]) AS x(q, d, m, t, u)
ON CONFLICT (queue) DO UPDATE
SET debounce_ms = EXCLUDED.debounce_ms, max_wait_ms = EXCLUDED.max_wait_ms,
    throttle_ms = EXCLUDED.throttle_ms, unique_for_ms = EXCLUDED.unique_for_ms,
    declared_by = EXCLUDED.declared_by, declared_at = EXCLUDED.declared_at
WHERE (g.debounce_ms, g.max_wait_ms, g.throttle_ms, g.unique_for_ms)
      IS DISTINCT FROM (EXCLUDED.debounce_ms, EXCLUDED.max_wait_ms, EXCLUDED.throttle_ms,
                        EXCLUDED.unique_for_ms)
