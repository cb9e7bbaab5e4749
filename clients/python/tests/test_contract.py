"""The client's side of the contract, without servers: the generated types match the schema,
messages are built as docs/message-format.md says, and refusals name field, value and fix."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from jobwarden_client import InvalidJobError, JobwardenError, build_enqueue, build_message, new_job_id

from .conftest import REPO

PKG = Path(__file__).resolve().parents[1]


def generator(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "scripts/generate_types.py", "--check", *args], cwd=PKG, capture_output=True, text=True
    )


def test_the_generated_types_are_what_the_schema_generates():
    run = generator()
    assert run.returncode == 0, run.stderr + run.stdout


def schema_with(tmp_path: Path, change) -> str:
    schema = json.loads((REPO / "docs" / "message.schema.json").read_text())
    change(schema)
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    return str(path)


def test_a_schema_changed_without_regenerating_fails_the_check(tmp_path):
    path = schema_with(tmp_path, lambda s: s["$defs"]["envelope"]["properties"]["priority"].update(maximum=8))
    run = generator("--schema", path)
    assert run.returncode == 1
    assert "generate_types.py" in run.stderr


def test_a_schema_keyword_the_client_does_not_check_is_refused(tmp_path):
    path = schema_with(tmp_path, lambda s: s["$defs"]["envelope"]["properties"]["priority"].update(multipleOf=2))
    run = generator("--schema", path)
    assert run.returncode != 0
    assert "multipleOf" in run.stderr


def test_a_message_goes_to_its_queues_subject_with_the_job_id_as_its_id():
    m = build_message("email", {"to": "a@example.com"}, id="order-42", max_attempts=3)
    assert m.subject == "jobs.email"
    assert m.id == "order-42"
    assert json.loads(m.body) == {"id": "order-42", "payload": {"to": "a@example.com"}, "max_attempts": 3}
    assert build_message("email", {}, priority=0).subject == "jobs.email.0"
    assert build_message("email", {}, priority=5).subject == "jobs.email"
    assert build_message("email", {}, subject_prefix="acme.jobs").subject == "acme.jobs.email"


def test_a_job_without_an_id_gets_a_uuid7_in_the_body_and_as_msg_id():
    m = build_message("email", {"a": 1})
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", m.id)
    assert json.loads(m.body)["id"] == m.id
    assert new_job_id(1_000) < new_job_id(2_000)


def test_delay_becomes_run_at_and_headers_travel_as_headers():
    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    m = build_message("email", {}, delay_ms=30_000, traceparent=tp, headers={"X-Customer": "c-42"}, now_ms=1_000)
    assert json.loads(m.body)["run_at_ms"] == 31_000
    assert m.headers == {"X-Customer": "c-42", "traceparent": tp}


def refused(field: str, words: str, f, *args, **kwargs):
    with pytest.raises(InvalidJobError) as info:
        f(*args, **kwargs)
    err = info.value
    assert err.field == field, str(err)
    assert str(err).startswith(f"jobwarden: field `{field}`"), str(err)
    assert re.search(words, str(err)), str(err)


@pytest.mark.parametrize(
    "field, words, options",
    [
        ("priority", r"12 is not a whole number from 0 to 9", {"priority": 12}),
        ("priority", r"must be a whole number, found a boolean", {"priority": True}),
        ("max_attempts", r"0 is not a whole number from 1 to 1000", {"max_attempts": 0}),
        ("timeout_ms", r"must be a whole number, found a number \(1.5\)", {"timeout_ms": 1.5}),
        ("id", r"contains U\+0020; an id may not hold", {"id": "order 42"}),
        ("id", r"contains '/'", {"id": "a/b"}),
        ("id", r"is 202 bytes long, the limit is 200", {"id": "é" * 101}),
        ("id", r"cannot be an id", {"id": ".."}),
        ("key", r"must not be empty", {"key": ""}),
        ("expires_in", r'"soon" is not a duration; write numbers with units', {"expires_in": "soon"}),
        ("batch.size", r"0 is not a whole number from 1 to 100000000", {"batch": {"id": "b", "size": 0}}),
        ("batch.extra", r"is not a field of a batch; the fields are id, on_complete, on_success, size",
         {"batch": {"id": "b", "size": 2, "extra": 1}}),
        ("backoff.max", r"must not be below base", {"backoff": {"kind": "exponential", "base": "10s", "max": "1s"}}),
        ("backoff.base", r"above zero", {"backoff": {"kind": "linear", "base": "0s"}}),
        ("backoff.base", r"longer than 3650 days", {"backoff": {"kind": "fixed", "base": "3651d"}}),
        ("expires_in", r"give one of them", {"expires_in": "1h", "expires_at_ms": 1}),
        ("debounce_max_wait", r"without debounce", {"debounce_max_wait": "5s"}),
        ("debounce_max_wait", r"shorter than debounce", {"debounce": "5s", "debounce_max_wait": "1s"}),
        ("unique_for", r"needs an idempotency_key", {"unique_for": "1h"}),
        ("then[0].throttle", r"needs a key", {"then": [{"queue": "pdf", "payload": {}, "throttle": "1m"}]}),
        ("depends_on", r"enqueue it through SQL", {"depends_on": ["a"]}),
        ("prio", r"is not an option of publish\(\); the options are id, priority", {"prio": 1}),
        ("traceparent", r"not a W3C traceparent", {"traceparent": "00-xyz"}),
        ("headers.Nats-Msg-Id", r"give the option `id`", {"headers": {"Nats-Msg-Id": "x"}}),
    ],
)
def test_refusals_name_the_field_the_value_and_the_fix(field, words, options):
    refused(field, words, build_message, "email", {}, **options)


def test_the_queue_and_the_payload_are_checked():
    refused("queue", r'"e mail" contains U\+0020; a queue name is 1 to 64 ASCII letters', build_message, "e mail", {})
    refused("payload.s", r"NUL character", build_message, "email", {"s": "a\x00b"})
    refused("payload", r"must be an object, found an array", build_message, "email", [])
    refused("payload", r"is not JSON", build_message, "email", {"s": {1, 2}})
    refused("payload", r"over the limit of 64 bytes \(worker.max_payload_bytes\)",
            build_message, "email", {"big": "x" * 100}, max_payload_bytes=64)
    with pytest.raises(JobwardenError):
        build_message("email", {}, subject_prefix="jobs.>")


def test_a_messages_own_debounce_may_take_its_key_from_key_from():
    build_message("email", {}, debounce="5s")


def test_then_trees_are_bounded():
    deep = {"queue": "q", "payload": {}}
    for _ in range(8):
        deep = {"queue": "q", "payload": {}, "then": [deep]}
    refused("then" + "[0].then" * 8, r"nested more than 8 deep", build_message, "email", {}, then=[deep])
    wide = [{"queue": "q", "payload": {}, "then": [{"queue": "q", "payload": {}}]} for _ in range(51)]
    refused("then[50]", r"at most 100 jobs in all", build_message, "email", {}, then=wide)


def test_sql_enqueue_is_called_with_named_arguments_in_the_given_schema():
    text, params = build_enqueue(
        "payments", {"order": 42}, schema="billing_jobs", idempotency_key="order-42", priority=2, delay_ms=1000,
        then=[{"queue": "email", "payload": {}}], depends_on=["charge-42"],
    )
    assert text == (
        'SELECT "billing_jobs".enqueue(%s::text, %s::jsonb, idempotency_key => %s::text, priority => %s::integer, '
        "run_at => clock_timestamp() + %s::bigint * interval '1 millisecond', then_jobs => %s::jsonb, "
        "depends_on => %s::text[]) AS id"
    )
    assert params == ["payments", '{"order":42}', "order-42", 2, 1000, '[{"queue":"email","payload":{}}]', ["charge-42"]]
    refused("batch", r"enqueue_batch", build_enqueue, "payments", {}, batch={"id": "b", "size": 1})
    refused("depends_on[0]", r"contains U\+0020", build_enqueue, "payments", {}, depends_on=["a b"])
    with pytest.raises(JobwardenError, match="not a schema name"):
        build_enqueue("payments", {}, schema="Robert'); DROP")
