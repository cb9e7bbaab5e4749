-- Jobs per (queue, status), for the demo and tests.
SELECT queue, status, count(*) FROM jobs GROUP BY 1, 2 ORDER BY 1, 2
