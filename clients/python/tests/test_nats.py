"""Producer.publish against a throwaway nats-server with a work-queue stream like the one
jobwarden workers create: each message is read back from the stream (subject, headers, body),
a second publish of one id is reported duplicate, and no stream is a clear error."""

from __future__ import annotations

import asyncio
import json

import nats
import pytest
from nats.js.api import RetentionPolicy

from jobwarden_client import InvalidJobError, JobwardenError, Producer


def run(nats_url, body):
    """Runs ``body(nc, js)`` with a connection and the JOBS and ACME streams in place."""

    async def main():
        nc = await nats.connect(nats_url)
        try:
            js = nc.jetstream()
            await js.add_stream(name="JOBS", subjects=["jobs.>"], retention=RetentionPolicy.WORK_QUEUE, duplicate_window=120)
            await js.add_stream(name="ACME", subjects=["acme.jobs.>"], retention=RetentionPolicy.WORK_QUEUE)
            return await body(nc, js)
        finally:
            await nc.close()

    return asyncio.run(main())


def test_a_published_job_lands_on_its_subject_with_its_id_as_msg_id_and_the_envelope_as_body(nats_url):
    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

    async def body(nc, js):
        got = await Producer(nc).publish(
            "email", {"to": "a@example.com"}, id="order-42-receipt", max_attempts=3, key="customer-7",
            traceparent=tp, headers={"X-Customer": "c-7"},
        )
        return got, await js.get_msg("JOBS", got.seq)

    got, m = run(nats_url, body)
    assert (got.id, got.stream, got.subject, got.duplicate) == ("order-42-receipt", "JOBS", "jobs.email", False)
    assert m.subject == "jobs.email"
    assert m.headers["Nats-Msg-Id"] == "order-42-receipt"
    assert m.headers["traceparent"] == tp
    assert m.headers["X-Customer"] == "c-7"
    assert json.loads(m.data) == {"id": "order-42-receipt", "payload": {"to": "a@example.com"}, "max_attempts": 3, "key": "customer-7"}


def test_a_job_without_an_id_gets_one_used_as_msg_id(nats_url):
    async def body(nc, js):
        got = await Producer(nc).publish("email", {"to": "b@example.com"})
        return got, await js.get_msg("JOBS", got.seq)

    got, m = run(nats_url, body)
    assert m.headers["Nats-Msg-Id"] == got.id
    assert json.loads(m.data) == {"id": got.id, "payload": {"to": "b@example.com"}}


def test_the_same_id_published_again_is_reported_duplicate(nats_url):
    async def body(nc, js):
        producer = Producer(nc)
        return await producer.publish("email", {"n": 1}, id="dup-1"), await producer.publish("email", {"n": 1}, id="dup-1")

    first, again = run(nats_url, body)
    assert (first.duplicate, again.duplicate) == (False, True)
    assert again.seq == first.seq and again.id == "dup-1"


def test_a_priority_picks_the_band_and_the_prefix_is_the_workers_subject_prefix(nats_url):
    async def body(nc, js):
        urgent = await Producer(nc).publish("email", {}, priority=0)
        acme = await Producer(nc, subject_prefix="acme.jobs").publish("email", {})
        return urgent, await js.get_msg("JOBS", urgent.seq), acme, await js.get_msg("ACME", acme.seq)

    urgent, um, acme, am = run(nats_url, body)
    assert um.subject == "jobs.email.0" and json.loads(um.data)["priority"] == 0
    assert acme.stream == "ACME" and am.subject == "acme.jobs.email"


def test_a_refused_job_is_never_sent(nats_url):
    async def body(nc, js):
        before = (await js.stream_info("JOBS")).state.messages
        with pytest.raises(InvalidJobError):
            await Producer(nc).publish("email", {}, max_attempts=1001)
        with pytest.raises(InvalidJobError, match="over the limit of 1000 bytes"):
            await Producer(nc, max_payload_bytes=1000).publish("email", {"s": "x" * 2000})
        return before, (await js.stream_info("JOBS")).state.messages

    before, after = run(nats_url, body)
    assert before == after


def test_no_stream_for_the_subject_is_an_error_saying_so(nats_url):
    async def body(nc, js):
        with pytest.raises(JobwardenError, match=r"got no ack from JetStream: .*is a stream capturing nostream\.> there"):
            await Producer(nc, subject_prefix="nostream", ack_timeout=1).publish("email", {})

    run(nats_url, body)
