-- The database's clock (every due time and staleness comparison uses it: invariant 4).
SELECT now()
