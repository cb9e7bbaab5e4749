-- One step of the rollup (rollup_step(), migrations/V16): what finished since the mark is
-- added to its minutes and the mark moves on. Returns the new mark (seconds since the
-- epoch; NULL when another worker's step holds it), the finished rows read, how far the mark
-- is behind the clock (seconds), and whether it read all that is safe to read now.
SELECT extract(epoch FROM upto)::float8, rows_read,
       extract(epoch FROM clock_timestamp() - upto)::float8, caught_up
FROM rollup_step()
