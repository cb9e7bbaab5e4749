-- Sets up the pruner's own connection (closed when its round ends, never pooled again): plans
-- with PostgreSQL's defaults (the pooled connections forbid seq scans and nested loops), and
-- prints timestamps in UTC, so the text of two completed_at values sorts as their times do.
SELECT set_config('enable_seqscan', 'on', false),
       set_config('enable_nestloop', 'on', false),
       set_config('TimeZone', 'UTC', false)
