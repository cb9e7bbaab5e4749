"""enqueue() and enqueue_many() against PostgreSQL, in a jobwarden schema of this run's own:
the job is the caller's transaction's (committed with it, gone with a rollback), its options
reach enqueue()'s named arguments, and PostgreSQL's refusals come through as raised."""

from __future__ import annotations

import asyncio
import datetime as dt

import psycopg
import pytest

from jobwarden_client import InvalidJobError, enqueue, enqueue_async, enqueue_many, enqueue_many_async

from .conftest import DATABASE_URL


@pytest.fixture
def db():
    with psycopg.connect(DATABASE_URL) as conn:  # not autocommit: every statement is in a transaction
        yield conn


@pytest.fixture
def other():
    with psycopg.connect(DATABASE_URL, autocommit=True, row_factory=psycopg.rows.dict_row) as conn:
        yield conn


def row(other, schema: str, job_id: str):
    return other.execute(f'SELECT * FROM "{schema}".jobs WHERE id = %s', [job_id]).fetchone()


def test_a_job_enqueued_in_a_transaction_exists_once_it_commits_with_its_options(db, other, schema):
    db.execute("CREATE TEMP TABLE orders (id int) ON COMMIT DROP")
    db.execute("INSERT INTO orders VALUES (42)")
    job_id = enqueue(
        db, "payments", {"order": 42}, schema=schema,
        idempotency_key="order-42", priority=2, max_attempts=3, timeout_ms=60_000, key="customer-7",
        delay_ms=60_000, expires_in="1h", backoff={"kind": "fixed", "base": "2s"},
        then=[{"queue": "email", "payload": {"order": 42}}],
    )
    assert row(other, schema, job_id) is None, "visible before the commit"
    db.commit()
    r = row(other, schema, job_id)
    assert r is not None, "the committed job is there"
    assert (r["queue"], r["payload"], r["status"]) == ("payments", {"order": 42}, "scheduled")
    assert (r["priority"], r["max_attempts"], r["timeout_ms"]) == (2, 3, 60_000)
    assert (r["key"], r["idempotency_key"]) == ("customer-7", "order-42")
    assert r["then_jobs"] == [{"queue": "email", "payload": {"order": 42}}]
    now = dt.datetime.now(dt.timezone.utc)
    assert dt.timedelta(seconds=50) < r["scheduled_at"] - now <= dt.timedelta(seconds=60)
    assert dt.timedelta(minutes=58) < r["expires_at"] - now <= dt.timedelta(hours=1)
    # The same idempotency key and payload is the same job.
    assert enqueue(db, "payments", {"order": 42}, schema=schema, idempotency_key="order-42") == job_id
    db.commit()


def test_a_job_enqueued_in_a_transaction_that_rolls_back_never_exists(db, other, schema):
    with db.cursor() as cur:
        job_id = enqueue(cur, "payments", {"order": 43}, schema=schema, id="order-43-charge", run_at_ms=0)
    assert job_id == "order-43-charge"
    db.rollback()
    assert row(other, schema, job_id) is None


def test_postgresqls_refusal_is_raised_as_it_is(db, schema):
    with pytest.raises(psycopg.Error) as info:
        enqueue(db, "audit", {"order": 44}, schema=schema, depends_on=["no-such-parent"])
    assert "depends_on names job 'no-such-parent', which does not exist; enqueue the parents first" in str(info.value)
    assert info.value.sqlstate, "the SQLSTATE is kept"
    db.rollback()
    enqueue(db, "payments", {"a": 1}, schema=schema, idempotency_key="k-45")
    with pytest.raises(psycopg.Error, match=r"idempotency key 'k-45' of queue payments already belongs to job .* with another payload"):
        enqueue(db, "payments", {"a": 2}, schema=schema, idempotency_key="k-45")
    db.rollback()


def test_a_bad_field_is_refused_before_anything_is_sent(db, schema):
    with pytest.raises(InvalidJobError, match=r"12 is not a whole number from 0 to 9") as info:
        enqueue(db, "payments", {}, schema=schema, priority=12)
    assert info.value.field == "priority"
    with pytest.raises(InvalidJobError, match=r"is not an option of enqueue\(\)"):
        enqueue(db, "payments", {}, schema=schema, traceparent="00-x")


def test_enqueue_many_is_all_or_none_in_the_callers_transaction(db, other, schema):
    ids = enqueue_many(db, [
        {"queue": "email", "payload": {"to": "a@example.com"}, "id": "nl-7-a"},
        {"queue": "email", "payload": {"to": "b@example.com"}, "delay_ms": 60_000},
    ], schema=schema)
    assert len(ids) == 2 and ids[0] == "nl-7-a"
    db.rollback()
    assert row(other, schema, "nl-7-a") is None

    assert enqueue_many(db, [{"queue": "email", "payload": {}, "id": "nl-8-a"}, {"queue": "sms", "payload": {}, "id": "nl-8-b"}], schema=schema) == ["nl-8-a", "nl-8-b"]
    db.commit()
    assert row(other, schema, "nl-8-b")["queue"] == "sms"
    assert enqueue_many(db, [], schema=schema) == []

    with pytest.raises(InvalidJobError) as info:
        enqueue_many(db, [{"queue": "email", "payload": {}}, {"queue": "email", "payload": {}, "priority": 10}], schema=schema)
    assert info.value.field == "jobs[1].priority"
    with pytest.raises(psycopg.Error, match=r"jobs\[2\]\.id"):
        enqueue_many(db, [{"queue": "email", "payload": {}, "id": "dup"}, {"queue": "email", "payload": {}, "id": "dup"}], schema=schema)
    db.rollback()


def test_the_async_twins_work_on_an_async_connection(other, schema):
    async def main():
        async with await psycopg.AsyncConnection.connect(DATABASE_URL) as conn:
            one = await enqueue_async(conn, "payments", {"a": "async"}, schema=schema, priority=1)
            many = await enqueue_many_async(conn, [{"queue": "email", "payload": {"n": 1}}], schema=schema)
            await conn.rollback()
            gone = row(other, schema, one)
            two = await enqueue_async(conn, "payments", {"a": "async"}, schema=schema)
            await conn.commit()
            return one, many, gone, two

    one, many, gone, two = asyncio.run(main())
    assert gone is None and len(many) == 1
    assert row(other, schema, two)["payload"] == {"a": "async"}
