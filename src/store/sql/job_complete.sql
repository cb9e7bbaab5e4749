-- Completes an awaiting job from outside (version 31's complete()). $1 id; $2 token; $3 result.
SELECT complete($1::text, $2::text, $3::jsonb)
