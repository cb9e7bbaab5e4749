-- {schema} is the configured schema, quoted (see `store::in_schema`).
CREATE SCHEMA IF NOT EXISTS {schema}
