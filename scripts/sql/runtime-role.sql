-- The least-privilege PostgreSQL role for jobwarden workers and producers.
--
-- Run it with psql as the role that runs the migrations (the owner of jobwarden's schema),
-- after `jobwarden migrate`:
--
--   psql "$MIGRATE_DATABASE_URL" -v ON_ERROR_STOP=1 \
--        -v schema=jobwarden -v role=jobwarden_worker -f scripts/sql/runtime-role.sql
--
-- then give the role a password (`\password jobwarden_worker`) or a client certificate, and
-- run the workers with that role in database.url and `worker.migrate = false`.
--
-- The role may read and write jobwarden's rows and call its functions (enqueue() and the
-- ones the worker uses); it may not create, alter or drop anything, so a compromised worker
-- cannot change the schema, and `jobwarden migrate` under it fails. Run again after
-- migrations that add tables: the default privileges below already cover tables and
-- functions the migrating role creates later in this schema, the explicit grants cover
-- what exists now. It is idempotent.

\if :{?schema}
\else
  \set schema jobwarden
\endif
\if :{?role}
\else
  \set role jobwarden_worker
\endif

SELECT format('CREATE ROLE %I LOGIN', :'role')
 WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'role') \gexec

SELECT format('GRANT CONNECT ON DATABASE %I TO %I', current_database(), :'role') \gexec
GRANT USAGE ON SCHEMA :"schema" TO :"role";
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA :"schema" TO :"role";
GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA :"schema" TO :"role";
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA :"schema" TO :"role";

ALTER DEFAULT PRIVILEGES IN SCHEMA :"schema"
  GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO :"role";
ALTER DEFAULT PRIVILEGES IN SCHEMA :"schema"
  GRANT USAGE, SELECT, UPDATE ON SEQUENCES TO :"role";
ALTER DEFAULT PRIVILEGES IN SCHEMA :"schema"
  GRANT EXECUTE ON FUNCTIONS TO :"role";

-- Nothing else: no CREATE on the schema or the database, no ownership.
REVOKE CREATE ON SCHEMA :"schema" FROM :"role";
