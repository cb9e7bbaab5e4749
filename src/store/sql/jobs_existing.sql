-- Which of these ids have a row. $1 ids.
SELECT id FROM jobs WHERE id = ANY($1::text[])
