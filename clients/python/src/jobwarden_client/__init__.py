"""jobwarden-client: a thin producer for jobwarden.

Publish a job to NATS JetStream (``Producer.publish``) or enqueue it through PostgreSQL inside
your own transaction (``enqueue``, ``enqueue_many`` and their ``_async`` twins). Both check the
job against the contract of docs/message.schema.json first (``InvalidJobError`` names the
field, the value and the fix).
"""

from .contract import InvalidJobError, JobwardenError, check_envelope, is_traceparent, new_job_id
from .producer import Message, Producer, Published, build_message
from .schema import Backoff, Batch, Envelope, JobMessage, ThenJob
from .sql import build_enqueue, enqueue, enqueue_async, enqueue_many, enqueue_many_async

__all__ = [
    "Backoff",
    "Batch",
    "Envelope",
    "InvalidJobError",
    "JobMessage",
    "JobwardenError",
    "Message",
    "Producer",
    "Published",
    "ThenJob",
    "build_enqueue",
    "build_message",
    "check_envelope",
    "enqueue",
    "enqueue_async",
    "enqueue_many",
    "enqueue_many_async",
    "is_traceparent",
    "new_job_id",
]
