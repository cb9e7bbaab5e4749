-- Fails an awaiting job from outside (version 31's fail()). $1 id; $2 token; $3 error;
-- $4 permanent; $5 retry after (ms, NULL for the backoff its worker computed).
SELECT fail($1::text, $2::text, $3::text, $4::bool, $5::int8)
