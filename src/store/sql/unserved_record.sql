-- What one janitor round saw waiting on subjects no consumer serves: replaces the whole
-- table (rows of subjects served or emptied since disappear).
-- $1 subjects; $2 queues; $3 message counts; $4 oldest stored times; $5 dead-letter times.
WITH gone AS (
    DELETE FROM unserved_subjects WHERE subject <> ALL($1::text[])
)
INSERT INTO unserved_subjects (subject, queue, messages, oldest_at, dead_letter_at, seen_at)
SELECT * , now() FROM unnest($1::text[], $2::text[], $3::int8[], $4::timestamptz[], $5::timestamptz[])
ON CONFLICT (subject) DO UPDATE
SET queue = EXCLUDED.queue, messages = EXCLUDED.messages, oldest_at = EXCLUDED.oldest_at,
    dead_letter_at = EXCLUDED.dead_letter_at, seen_at = now()
