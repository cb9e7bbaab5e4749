-- jobwarden schema, version 1. Tables are created in the configured schema (the migration
-- runs with search_path set to it), so several installations can share a database.

-- One row per job: the truth about it. JetStream only rings the doorbell.
CREATE TABLE jobs (
    id               text        PRIMARY KEY,
    queue            text        NOT NULL,
    priority         smallint    NOT NULL DEFAULT 5 CHECK (priority BETWEEN 0 AND 9),
    payload          jsonb       NOT NULL,
    status           text        NOT NULL CHECK (status IN
                         ('queued', 'scheduled', 'processing', 'completed', 'dead', 'cancelled')),
    attempts         integer     NOT NULL DEFAULT 0,   -- counted at claim: a crash costs one
    max_attempts     integer     NOT NULL CHECK (max_attempts >= 1),
    last_error       text,
    scheduled_at     timestamptz NOT NULL DEFAULT now(), -- when a scheduled job becomes due
    started_at       timestamptz,                        -- start of the current/last attempt
    completed_at     timestamptz,                        -- when it became terminal
    worker_id        text,                               -- owner of the current/last attempt
    lease            bigint      NOT NULL DEFAULT 0,     -- fencing token, bumped by every claim
    last_activity_at timestamptz,                        -- claim or latest progress report
    stage            text,
    progress         real,
    message          text,
    timeout_ms       integer,                            -- NULL: the queue's timeout
    idempotency_key  text,
    result           jsonb,
    generation       integer     NOT NULL DEFAULT 0,     -- publish count: Nats-Msg-Id <id>:<generation>
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now()
);

-- The stale sweep: processing jobs by last activity (the seed design's index).
CREATE INDEX jobs_processing_activity ON jobs (status, last_activity_at) WHERE status = 'processing';
-- Jobs held by one owner (heartbeat reaper, start-up reconciliation).
CREATE INDEX jobs_processing_owner ON jobs (worker_id) WHERE status = 'processing';
-- The scheduler: due delayed jobs and retries.
CREATE INDEX jobs_scheduled_due ON jobs (scheduled_at) WHERE status = 'scheduled';
-- Queued jobs by age (broker-loss reconciliation, oldest-queued stats).
CREATE INDEX jobs_queued_age ON jobs (queue, updated_at) WHERE status = 'queued';
-- The dead-letter queue by queue and age. (No index covers every status: each would be
-- rewritten by every state change on the hot path.)
CREATE INDEX jobs_dead ON jobs (queue, completed_at) WHERE status = 'dead';
-- Enqueueing twice with one key returns the first job.
CREATE UNIQUE INDEX jobs_idempotency ON jobs (queue, idempotency_key) WHERE idempotency_key IS NOT NULL;

-- One row per finished attempt, per attempt taken away from its owner (with the reason),
-- and per late result an old owner tried to write, so "why did this job run three times?"
-- is one query. outcome: completed, retry, dead, released (graceful shutdown, attempt not
-- counted), restarted, owner_dead, stale, self_fenced, lost_ownership, broker_lost.
CREATE TABLE job_attempts (
    id          bigint      GENERATED ALWAYS AS IDENTITY,
    job_id      text        NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    lease       bigint      NOT NULL,       -- the claim this attempt ran under
    attempt     integer     NOT NULL,
    worker_id   text,
    started_at  timestamptz,
    finished_at timestamptz NOT NULL DEFAULT now(),
    outcome     text        NOT NULL,
    error       text
);
CREATE INDEX job_attempts_job ON job_attempts (job_id, id);

-- Every worker process that ever ran, with its heartbeat.
CREATE TABLE workers (
    id           text        PRIMARY KEY,   -- <hostname>-<pid>-<8 hex>
    hostname     text        NOT NULL,
    pid          integer     NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now(),
    stopped_at   timestamptz,
    stop_reason  text,                      -- shutdown, owner_dead, restarted
    version      text        NOT NULL,
    boot_id      text,                      -- the machine's boot id and the process start time
    proc_start   bigint                     -- (clock ticks since boot) identify one process
);
CREATE INDEX workers_hostname ON workers (hostname);

-- Messages that could not even become a dead job (no usable id, or the row insert failed).
CREATE TABLE poison_messages (
    id          bigserial   PRIMARY KEY,
    received_at timestamptz NOT NULL DEFAULT now(),
    worker_id   text        NOT NULL,
    subject     text        NOT NULL,
    stream_seq  bigint,
    reason      text        NOT NULL,
    body        bytea,                      -- first 64 KiB
    body_bytes  integer     NOT NULL
);
