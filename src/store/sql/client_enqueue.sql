-- The Rust client's enqueue inside the caller's own transaction (the outbox), through the
-- schema's `enqueue()` like any other language. Qualified by {schema} (see
-- `store::in_schema`): the caller's connection has its own search_path.
-- $1 queue; $2 payload; $3 priority; $4 delay (ms); $5 max attempts; $6 idempotency key;
-- $7 id; $8 timeout (ms); $9 backoff; $10 depends on; $11 then jobs; $12 expires at (Unix
-- ms); $13 expires in (a duration, e.g. "3600000000000ns"); $14 the key; $15 debounce; $16
-- debounce_max_wait; $17 throttle; $18 unique_for (durations, e.g. "5000ms"; NULL for none).
SELECT {schema}.enqueue(queue => $1, payload => $2, priority => $3::int2::int4,
       run_at => now() + $4::int8 * interval '1 millisecond', max_attempts => $5,
       idempotency_key => $6, id => $7, timeout_ms => $8, backoff => $9,
       depends_on => $10, then_jobs => $11,
       expires_at => to_timestamp($12::int8 / 1000.0), expires_in => $13::text,
       key => $14::text, debounce => $15::text, debounce_max_wait => $16::text,
       throttle => $17::text, unique_for => $18::text)
