"""LMQ queues: which record a ``%LMQ%`` ConsumeQueue entry may point at.

With ``enableMultiDispatch`` (and ``enableLmq``) the broker writes a record
once, in its parent topic's queue, and adds one ConsumeQueue entry for it
to every queue its ``INNER_MULTI_DISPATCH`` property lists (comma-separated,
``MixAll.LMQ_DISPATCH_SEPARATOR``), at the offset the same index of
``INNER_MULTI_QUEUE_OFFSET`` gives (``ConsumeQueue.multiDispatchLmqQueue``).
The record keeps its parent's topic, queue id and queue offset, so an LMQ
entry is checked against those two properties instead; an ``%LMQ%`` queue
is queue 0 (``MixAll.LMQ_QUEUE_ID``), and only when ``enableLmq`` is off
does the broker file it under the parent's queue id.
"""

from __future__ import annotations

from collections.abc import Mapping

LMQ_PREFIX = "%LMQ%"
LMQ_PREFIX_RAW = LMQ_PREFIX.encode()
LMQ_QUEUE_ID = 0
DISPATCH_SEPARATOR = ","
PROPERTY_DISPATCH = "INNER_MULTI_DISPATCH"
PROPERTY_OFFSETS = "INNER_MULTI_QUEUE_OFFSET"


def is_lmq(topic: str | bytes | memoryview) -> bool:
    """Whether ``topic`` names an LMQ queue (``MixAll.isLmq``)."""
    if isinstance(topic, str):
        return topic.startswith(LMQ_PREFIX)
    return bytes(topic[:len(LMQ_PREFIX_RAW)]) == LMQ_PREFIX_RAW


def lmq_offset(properties: Mapping[str, str], topic: str) -> int | None:
    """The offset the record's properties give it in LMQ queue ``topic``;
    None when they do not dispatch it there (or are malformed)."""
    queues = properties.get(PROPERTY_DISPATCH)
    offsets = properties.get(PROPERTY_OFFSETS)
    if not queues or not offsets:
        return None
    names = queues.split(DISPATCH_SEPARATOR)
    values = offsets.split(DISPATCH_SEPARATOR)
    if len(names) != len(values) or topic not in names:
        return None  # the broker dispatches nothing then ("[bug] queues.length!=queueOffsets.length")
    try:
        return int(values[names.index(topic)])
    except ValueError:
        return None


def lmq_problem(properties: Mapping[str, str], record_queue_id: int, *, topic: str, queue_id: int,
                queue_offset: int) -> str | None:
    """Why a record (its properties and own queue id) is not entry
    ``queue_offset`` of LMQ queue ``topic``/``queue_id``; None when it is."""
    if queue_id != LMQ_QUEUE_ID and record_queue_id != queue_id:
        return f"queue id {record_queue_id} != {queue_id}"
    offset = lmq_offset(properties, topic)
    if offset is None:
        return f"{PROPERTY_DISPATCH}/{PROPERTY_OFFSETS} do not dispatch it to {topic!r}"
    if offset != queue_offset:
        return f"{PROPERTY_OFFSETS} gives {topic!r} offset {offset} != {queue_offset}"
    return None
