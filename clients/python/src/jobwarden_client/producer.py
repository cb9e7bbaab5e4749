"""Publishing a job to NATS JetStream: the envelope the contract takes, on the subject of its
queue and priority, with the job id as Nats-Msg-Id, confirmed by the stream's ack."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from .contract import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    InvalidJobError,
    JobwardenError,
    check_envelope,
    check_node,
    check_payload,
    check_queue,
    is_traceparent,
    new_job_id,
    shown,
    to_json,
)
from .schema import ENVELOPE_KEYS, SCHEMA_DEFS

#: The envelope's fields a producer may set, in the contract's order (all but ``payload``,
#: and ``depends_on``, which a message may not carry).
FIELDS = tuple(
    f for f in ENVELOPE_KEYS if f not in ("payload", "depends_on") and f in SCHEMA_DEFS["envelope"]["properties"]
)
#: Options of publish() that are not envelope fields.
EXTRA = ("delay_ms", "traceparent", "headers")


@dataclass(frozen=True)
class Published:
    """A published job: its id, and where the stream stored it."""

    id: str
    subject: str
    stream: str
    seq: int
    #: True when the stream already had a message with this id (within its duplicate window).
    duplicate: bool


@dataclass(frozen=True)
class Message:
    """A message ready to publish."""

    id: str
    subject: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)


def check_subject_prefix(prefix: str) -> None:
    """Checks a subject prefix as the workers' config does."""
    if (
        not isinstance(prefix, str)
        or not prefix
        or re.search(r"[\s*>]", prefix)
        or prefix.startswith(".")
        or prefix.endswith(".")
        or ".." in prefix
    ):
        raise JobwardenError(
            f"jobwarden: subject prefix {shown(prefix)} is not a subject prefix: give the workers' "
            "nats.subject_prefix (default \"jobs\"): not empty, no '*', '>' or whitespace, no empty token"
        )


def build_message(
    queue: str,
    payload: Mapping[str, Any],
    *,
    subject_prefix: str = "jobs",
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    now_ms: int | None = None,
    **options: Any,
) -> Message:
    """Builds the message for a job without sending it: checks the queue, the payload and
    every option against the contract, and raises InvalidJobError naming the field otherwise."""
    check_subject_prefix(subject_prefix)
    check_queue(queue)
    check_payload(payload)
    fields: dict[str, Any] = {}
    for name, value in options.items():
        if value is None or name in EXTRA:
            continue
        if name == "depends_on":
            raise InvalidJobError(
                name, value,
                "is not taken by a published message: a job that waits for others must be stored first; "
                "enqueue it through SQL (enqueue(conn, queue, payload, depends_on=[...]))",
            )
        if name not in FIELDS:
            raise InvalidJobError(name, value, f"is not an option of publish(); the options are {', '.join(FIELDS + EXTRA)}")
        fields[name] = value
    delay = options.get("delay_ms")
    if delay is not None:
        check_node(SCHEMA_DEFS["thenJob"]["properties"]["delay_ms"], delay, "delay_ms", "delay_ms")
        if "run_at_ms" in fields:
            raise InvalidJobError("delay_ms", delay, "is given with run_at_ms; give one of them")
        fields["run_at_ms"] = (int(time.time() * 1000) if now_ms is None else now_ms) + delay
    job_id = fields["id"] if "id" in fields else new_job_id(now_ms)
    envelope = {"id": job_id, "payload": payload, **fields}
    check_envelope(envelope)

    priority = fields.get("priority")
    subject = f"{subject_prefix}.{queue}" if priority in (None, 5) else f"{subject_prefix}.{queue}.{priority}"

    headers: dict[str, str] = {}
    for name, value in (options.get("headers") or {}).items():
        if not isinstance(name, str) or not re.fullmatch(r"[!-9;-~]+", name):
            raise InvalidJobError(f"headers.{name}", value, "is not a header name: printable ASCII without ':' or spaces")
        if name.lower() == "nats-msg-id":
            raise InvalidJobError(f"headers.{name}", value, "is set by the client to the job id; give the option `id` instead")
        if not isinstance(value, str) or "\r" in value or "\n" in value:
            raise InvalidJobError(f"headers.{name}", value, "must be a string without line breaks")
        headers[name] = value
    tp = options.get("traceparent")
    if tp is not None:
        if not is_traceparent(tp):
            raise InvalidJobError(
                "traceparent", tp,
                "is not a W3C traceparent: 00-<32 lower-case hex>-<16 lower-case hex>-<2 hex>, ids not all zero (the worker would drop it)",
            )
        headers["traceparent"] = tp

    body = to_json(envelope).encode("utf-8")
    if len(body) > max_payload_bytes:
        raise InvalidJobError(
            "payload", None,
            f"is invalid: the message body is {len(body)} bytes, over the limit of {max_payload_bytes} bytes "
            "(worker.max_payload_bytes); store large data elsewhere and pass a reference",
        )
    return Message(id=job_id, subject=subject, body=body, headers=headers)


class Producer:
    """Publishes jobs to JetStream over a nats-py connection the caller owns (and closes)::

        producer = Producer(nc)
        job = await producer.publish("email", {"to": "a@example.com"}, max_attempts=3)
    """

    def __init__(
        self,
        nc: Any,
        *,
        subject_prefix: str = "jobs",
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        ack_timeout: float = 5.0,
    ) -> None:
        """``subject_prefix`` is the workers' ``nats.subject_prefix``; ``max_payload_bytes``
        their ``worker.max_payload_bytes``; ``ack_timeout`` how long (s) to wait for the ack."""
        check_subject_prefix(subject_prefix)
        self._nc = nc
        self._js = nc.jetstream()
        self.subject_prefix = subject_prefix
        self.max_payload_bytes = max_payload_bytes
        self.ack_timeout = ack_timeout

    async def publish(self, queue: str, payload: Mapping[str, Any], **options: Any) -> Published:
        """Publishes one job and waits for the stream's ack. The job id (``id=``, or a new
        UUIDv7) is the envelope's ``id`` and the ``Nats-Msg-Id``: publishing it again is safe
        (the stream reports ``duplicate``, the worker runs it once).

        Options: the envelope's fields (``id``, ``priority``, ``max_attempts``, ``timeout_ms``,
        ``idempotency_key``, ``run_at_ms``, ``backoff``, ``then``, ``expires_at_ms``,
        ``expires_in``, ``key``, ``debounce``, ``debounce_max_wait``, ``throttle``,
        ``unique_for``, ``batch``), ``delay_ms`` (sets ``run_at_ms`` from this machine's
        clock), ``traceparent`` and ``headers``."""
        msg = build_message(
            queue, payload, subject_prefix=self.subject_prefix, max_payload_bytes=self.max_payload_bytes, **options
        )
        server_max = getattr(self._nc, "max_payload", None)
        if isinstance(server_max, int) and server_max > 0 and len(msg.body) > server_max:
            raise InvalidJobError(
                "payload", None,
                f"is invalid: the message body is {len(msg.body)} bytes, over the NATS server's max_payload of "
                f"{server_max} bytes; store large data elsewhere and pass a reference",
            )
        headers = {"Nats-Msg-Id": msg.id, **msg.headers}
        try:
            ack = await self._js.publish(msg.subject, msg.body, timeout=self.ack_timeout, headers=headers)
        except Exception as err:  # nats-py raises several kinds; all mean "not confirmed"
            raise JobwardenError(
                f"jobwarden: publishing job {msg.id} to {msg.subject} got no ack from JetStream: "
                f"{type(err).__name__}: {err}; is a stream capturing {self.subject_prefix}.> there "
                "(jobwarden workers create it at start-up)? Publishing again with the same id is safe"
            ) from err
        return Published(id=msg.id, subject=msg.subject, stream=ack.stream, seq=ack.seq, duplicate=bool(ack.duplicate))
