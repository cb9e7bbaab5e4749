-- jobwarden schema, version 28: results flow down a chain. A job that a parent's `then`
-- created, or that waited for its `depends_on` parents, carries their results when the chain
-- round makes it due: `parent_results`, {"<parent id>": <its result>, ...} (null for a
-- parent that completed without one). Its claim hands them to the handler with the payload
-- (an http handler's request `parents`, an exec command's JOB_PARENTS, a Rust handler's
-- `JobContext::parents`), on every attempt; `jobs show` and `jobs pipeline` show them.
--
-- Bounded: at most 65,536 bytes of results (as JSON text) in all, the smallest first; a
-- result that does not fit is passed as {"omitted": "<its size, and where to read it>"}.
ALTER TABLE jobs ADD COLUMN parent_results jsonb;

-- The results of `parents` as a child receives them (NULL: none of them exists).
CREATE FUNCTION job_parent_results(parents text[]) RETURNS jsonb
LANGUAGE sql STABLE
SET search_path FROM CURRENT
AS $$
    SELECT jsonb_object_agg(r.id, CASE WHEN r.total <= 65536 THEN r.result ELSE
               jsonb_build_object('omitted', format(
                   'the result of job %s (%s bytes) is over the 65536 bytes of parents'' '
                   'results passed to a job; read it with `jobwarden jobs show %s`',
                   r.id, r.bytes, r.id)) END)
    FROM (SELECT p.id, p.result, octet_length(p.result::text) AS bytes,
                 sum(COALESCE(octet_length(p.result::text), 0))
                     OVER (ORDER BY octet_length(p.result::text) NULLS FIRST, p.id) AS total
          FROM jobs p
          WHERE p.id = ANY (parents)) r
$$;
