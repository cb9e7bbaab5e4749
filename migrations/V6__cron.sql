-- jobwarden schema, version 6: cron schedules. Every worker runs every schedule; a fire is
-- enqueued by whichever worker locks the schedule's row first (the others skip it), in the
-- transaction that moves `last_fire_at` past it, under the job id `cron:<name>:<fire time>`
-- — so each fire is one job across any number of pods, restarts and crashes.
CREATE TABLE cron_state (
    name         text        PRIMARY KEY,
    last_fire_at timestamptz NOT NULL,       -- fires up to here are enqueued (or skipped)
    updated_at   timestamptz NOT NULL DEFAULT now()
);
