-- An operator sets a key's overrides (`set_key_limit()`, schema version 22): the values given
-- replace the key's, the others are kept. $1 queue; $2 key; $3 concurrency; $4 rate
-- ("5/1s"); $5 weight; $6 who.
SELECT o.queue, o.key, o.concurrency, o.rate_n, o.rate_ms, o.weight, o.set_by,
       extract(epoch FROM o.set_at)::float8
FROM set_key_limit($1::text, $2::text, $3::int4, $4::text, $5::float4, $6::text) o
