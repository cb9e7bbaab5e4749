-- A bulk action discards dead or cancelled jobs (their rows go). $1 ids. Returns how many.
DELETE FROM jobs WHERE id = ANY($1::text[]) AND status IN ('dead', 'cancelled')
