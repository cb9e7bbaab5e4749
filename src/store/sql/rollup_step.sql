-- One step of the rollup (rollup_step(), migrations/V16): what finished since the mark is
-- added to its minutes and the mark moves on. Returns the new mark (seconds since the
-- epoch; NULL when another worker's step holds it), the finished rows read, and how far the
-- mark is behind the clock (seconds).
SELECT extract(epoch FROM upto)::float8, rows_read,
       extract(epoch FROM clock_timestamp() - upto)::float8
FROM rollup_step()
