"""The README's two five-line examples run as written, against real servers: only the server
addresses, the schema (the test's own) and a temp ``orders`` table are filled in."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path

import nats
import psycopg

from .conftest import DATABASE_URL

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()
NATS_EXAMPLE, SQL_EXAMPLE = re.findall(r"```python\n(.*?)```", README, re.S)[:2]


def replaced(text: str, old: str, new: str) -> str:
    assert old in text, f"the README example no longer has {old}: update this test with it"
    return text.replace(old, new)


def run(code: str) -> str:
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, f"{code}\n{r.stderr}"
    return r.stdout


def test_the_readme_examples_are_five_lines_each():
    assert len(NATS_EXAMPLE.strip().splitlines()) == 5, NATS_EXAMPLE
    assert len(SQL_EXAMPLE.strip().splitlines()) == 5, SQL_EXAMPLE


def test_the_readme_nats_example_publishes_a_job(nats_url):
    async def stream():
        nc = await nats.connect(nats_url)
        await nc.jetstream().add_stream(name="JOBS", subjects=["jobs.>"])
        await nc.close()

    asyncio.run(stream())
    out = run(replaced(NATS_EXAMPLE, "nats://127.0.0.1:4222", nats_url))
    assert "Published(id='order-42-receipt', subject='jobs.email', stream='JOBS', seq=1, duplicate=False)" in out


def test_the_readme_sql_example_enqueues_a_job_in_its_transaction(schema):
    code = replaced(SQL_EXAMPLE, "postgresql://app@127.0.0.1:5432/app", DATABASE_URL)
    code = replaced(code, 'conn.execute("INSERT INTO orders',
                    'conn.execute("CREATE TEMP TABLE orders (id int, amount int)"); conn.execute("INSERT INTO orders')
    code = replaced(code, 'idempotency_key="order-42")', f'idempotency_key="order-42", schema="{schema}")')
    run(code)
    with psycopg.connect(DATABASE_URL) as db:
        rows = db.execute(f"SELECT queue, payload FROM \"{schema}\".jobs WHERE idempotency_key = 'order-42'").fetchall()
    assert rows == [("payments", {"order": 42})]
