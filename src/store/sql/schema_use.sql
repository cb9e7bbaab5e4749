-- {schema} is the configured schema, quoted (see `store::in_schema`).
SET search_path TO {schema}
