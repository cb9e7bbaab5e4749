"""Enqueueing through PostgreSQL: SQL ``jobwarden.enqueue(...)`` with named arguments, on the
caller's connection, so the job commits or rolls back with the caller's transaction (the
outbox). Takes a psycopg 3 ``Connection`` or ``Cursor`` (``enqueue``), or their async twins
(``enqueue_async``); it imports no driver itself, so any driver whose ``execute()`` takes
``%s`` parameters and returns a cursor works the same."""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping

from .contract import (
    InvalidJobError,
    JobwardenError,
    check_depends_on,
    check_envelope,
    check_node,
    check_payload,
    check_queue,
    shown,
    to_json,
)
from .schema import SCHEMA_DEFS

#: Each option: the argument of enqueue() it becomes, and the SQL expression of its parameter.
ARGS: dict[str, tuple[str, str]] = {
    "priority": ("priority", "%s::integer"),
    "run_at_ms": ("run_at", "to_timestamp(%s::float8 / 1000)"),
    "delay_ms": ("run_at", "clock_timestamp() + %s::bigint * interval '1 millisecond'"),
    "max_attempts": ("max_attempts", "%s::integer"),
    "idempotency_key": ("idempotency_key", "%s::text"),
    "id": ("id", "%s::text"),
    "timeout_ms": ("timeout_ms", "%s::integer"),
    "backoff": ("backoff", "%s::jsonb"),
    "depends_on": ("depends_on", "%s::text[]"),
    "then": ("then_jobs", "%s::jsonb"),
    "expires_at_ms": ("expires_at", "to_timestamp(%s::float8 / 1000)"),
    "expires_in": ("expires_in", "%s::text"),
    "key": ("key", "%s::text"),
    "debounce": ("debounce", "%s::text"),
    "debounce_max_wait": ("debounce_max_wait", "%s::text"),
    "throttle": ("throttle", "%s::text"),
    "unique_for": ("unique_for", "%s::text"),
}
_JSONB = {"backoff", "then"}


def quote_schema(schema: str) -> str:
    """The schema name, quoted; it must be a lowercase identifier, as ``database.schema`` is."""
    if not isinstance(schema, str) or not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", schema):
        raise JobwardenError(
            f"jobwarden: schema {shown(schema)} is not a schema name: give the workers' database.schema, "
            'a lowercase identifier (default "jobwarden")'
        )
    return f'"{schema}"'


def _check_fields(fields: Mapping[str, Any], at: str, allowed: Iterable[str], what: str) -> dict[str, Any]:
    """Checks one job's fields for the SQL door; ``at`` prefixes the field paths (``jobs[3]``)."""
    allowed = list(allowed)
    spec: dict[str, Any] = {}

    def path(f: str) -> str:
        return f"{at}.{f}" if at else f

    for name, value in fields.items():
        if value is None:
            continue
        if name == "batch":
            raise InvalidJobError(
                path(name), value,
                "is for published messages; enqueue a batch whole with SQL enqueue_batch() "
                "(its callbacks run when every member has ended)",
            )
        if name not in allowed:
            raise InvalidJobError(path(name), value, f"is not {what}; the fields are {', '.join(allowed)}")
        spec[name] = value
    check_depends_on(spec.get("depends_on"), path("depends_on"))
    if "delay_ms" in spec:
        check_node(SCHEMA_DEFS["thenJob"]["properties"]["delay_ms"], spec["delay_ms"], path("delay_ms"), "delay_ms")
        if "run_at_ms" in spec:
            raise InvalidJobError(path("delay_ms"), spec["delay_ms"], "is given with run_at_ms; give one of them")
    envelope = {k: v for k, v in spec.items() if k not in ("depends_on", "delay_ms", "queue")}
    check_envelope(envelope, at, "sql")
    return spec


def build_enqueue(queue: str, payload: Mapping[str, Any], *, schema: str = "jobwarden", **fields: Any) -> tuple[str, list[Any]]:
    """The statement and parameters enqueue() runs (``%s`` placeholders)."""
    qualified = quote_schema(schema)
    check_queue(queue)
    check_payload(payload)
    spec = _check_fields({"payload": payload, **fields}, "", ["payload", *ARGS], "an option of enqueue()")
    params: list[Any] = [queue, to_json(payload)]
    args = ["%s::text", "%s::jsonb"]
    for name, value in spec.items():
        if name not in ARGS:
            continue  # payload
        arg, expr = ARGS[name]
        params.append(to_json(value, name) if name in _JSONB else list(value) if name == "depends_on" else value)
        args.append(f"{arg} => {expr}")
    return f"SELECT {qualified}.enqueue({', '.join(args)}) AS id", params


def build_enqueue_many(jobs: Iterable[Mapping[str, Any]], *, schema: str = "jobwarden") -> tuple[str, list[Any]] | None:
    """The statement and parameter enqueue_many() runs, or None for no jobs."""
    qualified = quote_schema(schema)
    jobs = list(jobs)
    if not jobs:
        return None
    allowed = ["queue", "payload", *ARGS]
    for i, job in enumerate(jobs):
        if not isinstance(job, Mapping):
            raise InvalidJobError(f"jobs[{i}]", job, "must be a dict with queue and payload")
        check_queue(job.get("queue"), f"jobs[{i}].queue")
        check_payload(job.get("payload"), f"jobs[{i}].payload")
        _check_fields(job, f"jobs[{i}]", allowed, "a field of a job")
    body = to_json([{k: v for k, v in job.items() if v is not None} for job in jobs], "jobs")
    return f"SELECT n, id FROM {qualified}.enqueue_many(%s::jsonb) ORDER BY n", [body]


def _column(row: Any, index: int, name: str) -> Any:
    """A column of a row, whether the connection's row factory makes tuples or dicts."""
    return row[name] if isinstance(row, Mapping) else row[index]


def enqueue(conn: Any, queue: str, payload: Mapping[str, Any], *, schema: str = "jobwarden", **fields: Any) -> str:
    """Enqueues one job through SQL ``enqueue()`` on ``conn`` (a psycopg Connection or
    Cursor), inside whatever transaction it is in (roll it back and the job is gone; commit
    and the workers publish it). Returns the job id. A refusal by PostgreSQL (a missing
    parent, an idempotency key held with another payload) is raised as psycopg raised it.

    Fields: ``id``, ``priority``, ``max_attempts``, ``timeout_ms``, ``idempotency_key``,
    ``run_at_ms`` or ``delay_ms`` (from the database's clock), ``backoff``, ``then``,
    ``depends_on``, ``expires_at_ms`` or ``expires_in``, ``key``, ``debounce``,
    ``debounce_max_wait``, ``throttle``, ``unique_for``; ``schema`` is ``database.schema``."""
    query, params = build_enqueue(queue, payload, schema=schema, **fields)
    return _column(conn.execute(query, params).fetchone(), 0, "id")


async def enqueue_async(conn: Any, queue: str, payload: Mapping[str, Any], *, schema: str = "jobwarden", **fields: Any) -> str:
    """``enqueue()`` on a psycopg AsyncConnection or AsyncCursor."""
    query, params = build_enqueue(queue, payload, schema=schema, **fields)
    cur = await conn.execute(query, params)
    return _column(await cur.fetchone(), 0, "id")


def enqueue_many(conn: Any, jobs: Iterable[Mapping[str, Any]], *, schema: str = "jobwarden") -> list[str]:
    """Enqueues many jobs (dicts with ``queue``, ``payload`` and any field of ``enqueue()``) in
    one call of SQL ``enqueue_many()``, all or none, inside the caller's transaction. Returns
    their ids in order."""
    built = build_enqueue_many(jobs, schema=schema)
    if built is None:
        return []
    return [_column(row, 1, "id") for row in conn.execute(*built).fetchall()]


async def enqueue_many_async(conn: Any, jobs: Iterable[Mapping[str, Any]], *, schema: str = "jobwarden") -> list[str]:
    """``enqueue_many()`` on a psycopg AsyncConnection or AsyncCursor."""
    built = build_enqueue_many(jobs, schema=schema)
    if built is None:
        return []
    cur = await conn.execute(*built)
    return [_column(row, 1, "id") for row in await cur.fetchall()]
