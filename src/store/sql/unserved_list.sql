-- Subjects with messages no pod serves, as the janitors last saw them (`jobwarden stats`).
SELECT subject, queue, messages, extract(epoch FROM now() - oldest_at)::float8,
       extract(epoch FROM dead_letter_at - now())::float8,
       extract(epoch FROM now() - seen_at)::float8
FROM unserved_subjects ORDER BY subject
