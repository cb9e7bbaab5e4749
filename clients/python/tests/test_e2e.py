"""End to end: a real ``jobwarden run`` worker (exec handler) runs to completion a job this
client published through NATS and one it enqueued through SQL, and never one whose
transaction rolled back."""

from __future__ import annotations

import asyncio

import nats
import psycopg
import pytest

from jobwarden_client import JobwardenError, Producer, enqueue

from .conftest import DATABASE_URL, Worker, drop_schema, migrate_schema, wait_for


@pytest.fixture
def e2e(nats_url):
    schema = migrate_schema("jw_py_e2e")
    worker = Worker(schema, nats_url, ["py-nats", "py-sql"])
    try:
        yield schema, worker
    finally:
        worker.stop()
        drop_schema(schema)


def test_a_worker_runs_a_job_published_through_nats_and_one_enqueued_through_sql(nats_url, e2e):
    schema, worker = e2e

    async def publish():
        nc = await nats.connect(nats_url)
        try:
            js = nc.jetstream()
            # The worker creates the stream and then its queues' consumers at start-up: once
            # its consumer is there, it is done provisioning.
            for _ in range(600):
                try:
                    await js.consumer_info("JOBS", "jobwarden-py-nats")
                    break
                except Exception:
                    await asyncio.sleep(0.05)
            else:
                pytest.fail(f"the worker never created its consumer; its log:\n{worker.log()}")
            # A stream just created may not answer its subjects for a moment: publishing
            # again with the same id is safe (the stream drops a duplicate).
            for attempt in range(20):
                try:
                    return await Producer(nc).publish(
                        "py-nats", {"via": "nats"}, id="py-e2e-nats", max_attempts=2
                    )
                except JobwardenError as e:
                    if "no response from stream" not in str(e) or attempt == 19:
                        raise
                    await asyncio.sleep(0.1)
        finally:
            await nc.close()

    published = asyncio.run(publish())
    assert not published.duplicate

    with psycopg.connect(DATABASE_URL) as db:
        sql_id = enqueue(db, "py-sql", {"via": "sql"}, schema=schema)
        db.commit()
        rolled_back = enqueue(db, "py-sql", {"via": "rolled back"}, schema=schema)
        db.rollback()

    with psycopg.connect(DATABASE_URL, autocommit=True, row_factory=psycopg.rows.dict_row) as db:
        def job(job_id):
            return db.execute(f'SELECT status, queue, result, last_error FROM "{schema}".jobs WHERE id = %s', [job_id]).fetchone()

        for job_id, queue, via in ((published.id, "py-nats", "nats"), (sql_id, "py-sql", "sql")):
            done = wait_for(lambda: (job(job_id) or {}).get("status") == "completed", 30)
            j = job(job_id)
            assert done, f"job {job_id} ({via}) did not complete: {j}; worker log:\n{worker.log()}"
            assert j["queue"] == queue
            assert j["result"] == {"ran": job_id, "payload": {"via": via}}
        assert job(rolled_back) is None
