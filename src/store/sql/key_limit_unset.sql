-- An operator drops a key's overrides (`unset_key_limit()`): true when it had some.
-- $1 queue; $2 key.
SELECT unset_key_limit($1::text, $2::text)
