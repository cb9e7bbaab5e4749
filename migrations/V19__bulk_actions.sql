-- jobwarden schema, version 19: bulk actions by filter, and who did them.
--
-- An operator cancels, retries or discards every job matching a filter (queue, status, when
-- it was enqueued, text in its id or last error) from the CLI (`jobwarden jobs bulk`) or the
-- dashboard. The count is shown first; the action then takes at most that many jobs, in
-- batches of its own transactions. Each action is one row here: who (`cli:<user>@<host>`
-- or `dashboard:<token name>`), what, the filter, how many matched and how many changed.
CREATE TABLE bulk_actions (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    started_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    by          text        NOT NULL,
    action      text        NOT NULL CHECK (action IN ('cancel', 'retry', 'discard')),
    filter      jsonb       NOT NULL,
    matched     int8        NOT NULL,
    changed     int8        NOT NULL DEFAULT 0
);
