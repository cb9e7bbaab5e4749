"""Real servers for the tests: a throwaway nats-server (free port, temp store, killed at the
end), a jobwarden schema of its own in the test database (migrated by the built binary,
dropped at the end), and ``jobwarden run`` worker processes with a TOML config."""

from __future__ import annotations

import atexit
import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

import psycopg
import pytest

REPO = Path(__file__).resolve().parents[3]
DATABASE_URL = os.environ.get("JOBWARDEN_TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test")
JOBWARDEN_BIN = Path(os.environ.get("JOBWARDEN_BIN", REPO / "target" / "debug" / "jobwarden"))


def wait_for(check: Callable[[], bool], timeout: float = 20.0) -> bool:
    """Polls ``check`` until it is true or ``timeout`` seconds passed."""
    end = time.monotonic() + timeout
    while True:
        if check():
            return True
        if time.monotonic() > end:
            return False
        time.sleep(0.05)


def _nats_server_binary() -> str:
    if os.environ.get("NATS_SERVER"):
        return os.environ["NATS_SERVER"]
    for d in ("/usr/sbin", "/usr/bin", "/usr/local/bin"):
        if (Path(d) / "nats-server").exists():
            return str(Path(d) / "nats-server")
    found = shutil.which("nats-server")
    if not found:
        pytest.fail("nats-server not found (scripts/ensure-servers.sh installs it; or set NATS_SERVER)")
    return found


def _stop(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    atexit.unregister(proc.kill)
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def nats_url() -> Iterator[str]:
    """A nats-server with JetStream on a free port, its store in a temp dir."""
    tmp = Path(tempfile.mkdtemp(prefix="jobwarden-py-nats-"))
    proc = subprocess.Popen(
        [_nats_server_binary(), "-js", "-sd", str(tmp), "-a", "127.0.0.1", "-p", "-1",
         "--ports_file_dir", str(tmp), "-l", str(tmp / "nats.log")],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    atexit.register(proc.kill)  # no orphan if pytest dies first
    url: list[str] = []

    def up() -> bool:
        for f in tmp.glob("*.ports"):
            try:
                url.append(json.loads(f.read_text())["nats"][0])
                return True
            except (ValueError, KeyError, IndexError):
                return False  # being written
        return False

    try:
        if not wait_for(up, 10):
            pytest.fail(f"nats-server did not start (log: {tmp / 'nats.log'})")
        yield url[0]
    finally:
        _stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)


def migrate_schema(prefix: str = "jw_py") -> str:
    """A jobwarden schema of its own: created and migrated by ``jobwarden migrate``."""
    if not JOBWARDEN_BIN.exists():
        pytest.fail(f"{JOBWARDEN_BIN} is missing: build it first (cargo build; scripts/test.sh does) or set JOBWARDEN_BIN")
    schema = f"{prefix}_{os.getpid()}_{secrets.token_hex(4)}"
    env = {**os.environ, "JOBWARDEN_DATABASE__URL": DATABASE_URL, "JOBWARDEN_DATABASE__SCHEMA": schema}
    run = subprocess.run([str(JOBWARDEN_BIN), "migrate"], env=env, capture_output=True, text=True, timeout=120)
    if run.returncode != 0:
        pytest.fail(f"jobwarden migrate (schema {schema}) exited {run.returncode}: {run.stderr}{run.stdout}")
    return schema


def drop_schema(schema: str) -> None:
    with psycopg.connect(DATABASE_URL, autocommit=True) as c:
        c.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture(scope="module")
def schema() -> Iterator[str]:
    name = migrate_schema()
    try:
        yield name
    finally:
        drop_schema(name)


class Worker:
    """A ``jobwarden run`` process serving ``queues`` with an exec handler that returns the
    job's id and payload as its result."""

    def __init__(self, schema: str, nats_url: str, queues: list[str]) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="jobwarden-py-worker-"))
        script = 'payload=$(cat); printf \'{"result":{"ran":"%s","payload":%s}}\\n\' "$JOB_ID" "$payload"'
        sections = "\n".join(
            f'[queues.{q}]\nconcurrency = 2\nmax_attempts = 2\nbackoff = {{ kind = "fixed", base = "100ms" }}\n'
            for q in queues
        )
        config = f"""[database]
url = {json.dumps(DATABASE_URL)}
schema = {json.dumps(schema)}
pool_size = 4

[nats]
url = {json.dumps(nats_url)}

[worker]
api_listen = "127.0.0.1:0"
ops_listen = "127.0.0.1:0"
scheduler_every = "100ms"

[handler]
kind = "exec"
command = ["/bin/sh", "-c", {json.dumps(script)}]

{sections}"""
        path = self.dir / "jobwarden.toml"
        path.write_text(config)
        self.log_path = self.dir / "worker.log"
        env = {**os.environ, "JOBWARDEN_WORKER__HOSTNAME": f"py-client-{os.getpid()}", "RUST_LOG": "warn"}
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [str(JOBWARDEN_BIN), "--config", str(path), "run"],
                env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
            )
        atexit.register(self.proc.kill)  # no orphan if pytest dies first

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def stop(self) -> None:
        _stop(self.proc, signal.SIGTERM)
        shutil.rmtree(self.dir, ignore_errors=True)
