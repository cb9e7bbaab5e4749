-- A connection check.
SELECT 1
