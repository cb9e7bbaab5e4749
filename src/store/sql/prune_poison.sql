-- Deletes up to $2 poison messages received more than $1 ms ago, oldest first. Returns how
-- many (as the statement's row count).
WITH v AS (
    SELECT id FROM poison_messages
    WHERE received_at < now() - $1::int8 * interval '1 millisecond'
    ORDER BY id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
DELETE FROM poison_messages p USING v WHERE p.id = v.id
