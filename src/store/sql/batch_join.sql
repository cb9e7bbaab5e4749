-- Judges the members of batches among a group of messages before their rows are written
-- (version 34's batch_join(): a batch not known yet is declared by its first member): per
-- member, from 1, the batch its job joins (NULL: none) and why it is refused (NULL: it is
-- not). $1 the jobs' ids; $2 their batches' ids (NULL for a job of none); $3 each one's
-- declaration ({"size", "on_complete", "on_success"}).
SELECT n, joins, refused FROM batch_join($1::text[], $2::text[], $3::jsonb[])
