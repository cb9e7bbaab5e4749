-- Judges the members of batches among a group of messages before their rows are written
-- (schema version 34). A batch not known yet is declared by its first member here (in batch
-- id order: two groups that declare the same batches wait for each other in one order, never
-- in a cycle). Returns, per member (`n`, its position from 1): the batch its job joins (NULL:
-- the batch takes no member — enqueued whole through SQL, or finished) and why it is refused
-- (NULL: it is not), and whether the batch is open and declared as the member declares it.
-- A member whose job exists already is never refused (a redelivery: the
-- claim finds its row). A batch this statement declares, or another group declared while it
-- ran (its row is not in this statement's snapshot), takes the member as it is.
-- $1 the jobs' ids; $2 their batches' ids (NULL for a job of none); $3 each one's
-- declaration ({"size", "on_complete", "on_success"}, as contract::BatchDecl writes it).
WITH input AS (
    SELECT u.id, u.b, u.decl, u.n
    FROM unnest($1::text[], $2::text[], $3::jsonb[]) WITH ORDINALITY AS u(id, b, decl, n)
    WHERE u.b IS NOT NULL
),
declared AS (
    INSERT INTO batches (id, size, on_complete, on_success, sealed)
    SELECT DISTINCT ON (i.b) i.b, (i.decl ->> 'size')::int4, i.decl -> 'on_complete',
           i.decl -> 'on_success', false
    FROM input i
    ORDER BY i.b, i.n
    ON CONFLICT DO NOTHING
    RETURNING id
)
SELECT i.n,
       CASE WHEN x.sealed OR x.finished_at IS NOT NULL THEN NULL ELSE i.b END,
       CASE WHEN r.reason IS NOT NULL AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.id = i.id)
            THEN r.reason END,
       -- The batch is open and declared as this member declares it (the caller may take
       -- the next members that declare it so without asking again, for a moment).
       r.reason IS NULL AND x.id IS NOT NULL
FROM input i
     LEFT JOIN batches x ON x.id = i.b
     -- The batch as its first member declared it.
     CROSS JOIN LATERAL (
         SELECT jsonb_build_object('size', x.size)
                || CASE WHEN x.on_complete IS NULL THEN '{}'::jsonb
                        ELSE jsonb_build_object('on_complete', x.on_complete) END
                || CASE WHEN x.on_success IS NULL THEN '{}'::jsonb
                        ELSE jsonb_build_object('on_success', x.on_success) END AS declared) d
     CROSS JOIN LATERAL (
         SELECT CASE
             WHEN x.id IS NULL THEN NULL
             WHEN x.sealed THEN format('batch `%s` was enqueued whole through SQL (enqueue_batch(), `jobwarden enqueue-batch`, Client::enqueue_batch) and takes no member by message: give the batch of the messages another id', i.b)
             WHEN x.finished_at IS NOT NULL THEN format('batch `%s` has finished (at %s): its callbacks have run and it takes no more members; a new batch needs a new id', i.b, x.finished_at)
             WHEN i.decl IS DISTINCT FROM d.declared
             THEN format('batch `%s` was declared %s by its first member; this message declares %s: every member of a batch carries the same `batch` object. This member is kept as a dead member of the batch',
                         i.b, d.declared, i.decl)
         END AS reason) r
-- (The insert above runs to its end whatever this reads: a data-modifying CTE always does.)
ORDER BY i.n
