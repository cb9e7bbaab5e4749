-- Drops the whole schema (tests, `jobwarden demo` clean-up). {schema}: see `store::in_schema`.
DROP SCHEMA IF EXISTS {schema} CASCADE
