"""Finding a record by its message id without scanning the archive.

RocketMQ's offset message id is the storing broker's address and the
record's physical offset in its CommitLog, as hex::

    IPv4: host (4) + port (4) + physical offset (8)   = 16 bytes, 32 hex digits
    IPv6: host (16) + port (4) + physical offset (8)  = 28 bytes, 56 hex digits

(``tiered.format.codec.offset_msg_id`` writes it.) Manifests know cold
CommitLog ranges, not the broker's physical offsets, but within a queue the
physical offsets grow with the queue offsets (the broker appends), so a
binary search over the queue's archived records finds the one record: each
probe is two small ranged GETs, the ConsumeQueue entry (its cold offset) and
the record header (its physical offset), about ``2 * log2(records)``
requests per queue and no data read. The store host in the id is checked on
the row the scan returns (two brokers of a cluster may use the same offset).

The client's message id (the ``UNIQ_KEY`` property, also 32 hex digits) is
found through the segments' key indexes (``plan(key=...)``); callers look up
both, as ``tiered find --msg-id`` does.
"""

from __future__ import annotations

import bisect
import logging
import struct
from dataclasses import dataclass, replace

from tiered.errors import CorruptRecordError, StorageError
from tiered.format.codec import CQ_ENTRY_SIZE, MAGIC_V1, MAGIC_V2, Host, parse_offset_msg_id
from tiered.format.lmq import is_lmq
from tiered.query.reader import ReadStats, first_at_or_after, get_range
from tiered.query.scan import Slice
from tiered.archive.storage import ObjectStore

log = logging.getLogger(__name__)

# record header up to the physical offset: total size (4), magic (4), body CRC
# (4), queue id (4), flag (4), queue offset (8), physical offset (8)
_HEAD = struct.Struct(">iIiiiqq")
_CQ_OFFSET = struct.Struct(">q")


@dataclass(frozen=True, kw_only=True)
class MessageId:
    """A message id as given: ``offset`` is set when it can be a broker
    offset id (a port in 1..65535 and a non-negative offset); any 32-digit id
    may also be a client UNIQ_KEY id."""

    text: str
    store_host: Host | None = None
    physical_offset: int | None = None

    @property
    def is_offset_id(self) -> bool:
        return self.store_host is not None and self.physical_offset is not None


def parse_message_id(text: str) -> MessageId:
    """``text`` as a message id; ValueError when it is not 32 or 56 hex digits."""
    t = text.strip()
    if len(t) not in (32, 56) or any(c not in "0123456789abcdefABCDEF" for c in t):
        raise ValueError("a message id is 32 hex digits (IPv4 store host, or a client UNIQ_KEY id) "
                         "or 56 (IPv6 store host)")
    host, offset = parse_offset_msg_id(t)
    if offset < 0 or not 0 < host.port < 65536:
        return MessageId(text=t)
    return MessageId(text=t, store_host=host, physical_offset=offset)


class _Probe:
    """Physical offsets of a queue's archived records, by position in its
    slices (concatenated in queue-offset order), read one header at a time."""

    def __init__(self, store: ObjectStore, slices: list[Slice], stats: ReadStats | None) -> None:
        self.store, self.slices, self.stats = store, slices, stats
        self.starts: list[int] = []
        total = 0
        for sl in slices:
            self.starts.append(total)
            total += sl.messages
        self.total = total

    def at(self, i: int) -> tuple[Slice, int]:
        """(slice, queue offset) of position ``i``."""
        k = bisect.bisect_right(self.starts, i) - 1
        sl = self.slices[k]
        return sl, sl.q_start + i - self.starts[k]

    def physical(self, i: int) -> int:
        sl, q = self.at(i)
        at = (q - sl.seg_q_start) * CQ_ENTRY_SIZE
        entry = get_range(self.store, sl.consumequeue_key, at, at + CQ_ENTRY_SIZE, self.stats)
        if len(entry) < CQ_ENTRY_SIZE:
            raise CorruptRecordError(sl.consumequeue_key, at, "ConsumeQueue entry beyond the end of the object")
        cold = _CQ_OFFSET.unpack_from(entry, 0)[0]
        pos = cold - sl.seg_cl_start
        if not 0 <= pos < sl.seg_cl_end - sl.seg_cl_start:
            raise CorruptRecordError(sl.consumequeue_key, at, f"entry points outside the segment ({cold})")
        head = get_range(self.store, sl.commitlog_key, pos, pos + _HEAD.size, self.stats)
        if len(head) < _HEAD.size:
            raise CorruptRecordError(sl.commitlog_key, pos, "record header beyond the end of the object")
        _size, magic, _crc, _qid, _flag, queue_offset, physical = _HEAD.unpack_from(head, 0)
        # an LMQ queue holds its parents' records, with their queue offsets; a
        # BatchCQ record's queue offset is its first message's, inside the segment's range
        in_place = (queue_offset == q or is_lmq(sl.topic)) if not sl.batch else \
            (sl.msg_start or 0) <= queue_offset < (sl.msg_end or 0)
        if magic not in (MAGIC_V1, MAGIC_V2) or not in_place:
            raise CorruptRecordError(sl.commitlog_key, pos, f"no record of queue offset {q} here")
        return physical


def locate(store: ObjectStore, slices: list[Slice], physical_offset: int, *,
           stats: ReadStats | None = None) -> list[Slice]:
    """What to read for the record at broker CommitLog ``physical_offset`` in
    one queue whose ``slices`` are given in queue-offset order: one slice of
    one record, nothing when the queue does not hold it, or every slice when
    the archive cannot be searched (a corrupt or missing object: the scan then
    reads them and reports the damage as any scan does)."""
    if not slices:
        return []
    probe = _Probe(store, slices, stats)
    cache: dict[int, int] = {}

    def physical(i: int) -> int:
        if i not in cache:
            cache[i] = probe.physical(i)
        return cache[i]

    try:
        i = first_at_or_after(probe.total, physical, physical_offset)
        if i >= probe.total or physical(i) != physical_offset:
            return []
    except (CorruptRecordError, StorageError) as exc:
        log.warning("message id search in %s unusable, reading the queue instead: %s", slices[0].ref, exc)
        return list(slices)
    sl, q = probe.at(i)
    return [replace(sl, q_start=q, q_end=q + 1)]

