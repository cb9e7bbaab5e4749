-- The schema version applied (highest migration).
SELECT max(version)::int4 FROM jobwarden_migrations
