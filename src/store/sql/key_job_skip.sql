-- An operator lets an ordered key's dead head go (`skip_key_job()`, schema version 22): its
-- key's later jobs run on; recorded in key_skips. $1 job id; $2 who. Returns its key.
SELECT skip_key_job($1::text, $2::text)
