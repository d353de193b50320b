"""A BatchCQ topic's queues: ``{store}/batchconsumequeue/{topic}/{queueId}/``.

A topic whose ``config/topics.json`` entry has ``"attributes":
{"queue.type": "BatchCQ"}`` keeps its queue entries there instead of under
``consumequeue/``. Files are named by their 20-digit start byte and
preallocated (RocketMQ's ``MappedFileQueue`` refuses to load a file of
another length). Each entry is 46 bytes, big-endian, as RocketMQ 5.3.3's
``BatchConsumeQueue.putBatchMessagePositionInfo`` writes it::

    offset  size  field
         0     8  CommitLog offset of the record
         8     4  record size
        12     8  tags code
        20     8  store timestamp, ms
        28     8  base offset: queue offset of the record's first message
        36     2  batch size: messages in the record (1 for a single message)
        38     4  compacted offset (written as -1)
        42     4  reserved (0)

An entry is written when its CommitLog offset and base offset are >= 0 and
its size and batch size > 0 (``BatchConsumeQueue.recover`` stops at the
first that is not). The queue's min offset is the base offset of the first
file's first entry, its max offset the last entry's base + batch size.

tiered numbers a BatchCQ queue's *entries* (entry i sits at byte i * 46 of
the queue's file space): ``BatchQueueFiles`` shows the entries to
``LocalStore`` as 20-byte ConsumeQueue entries at those offsets, so reading,
archiving and verifying a batch queue is reading a queue of its records;
``tiered.format.innerbatch`` turns a record into messages at queue offsets
base + index (see docs/batchcq.md).
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from tiered.format.codec import CQ_ENTRY_SIZE, Record
from tiered.format.innerbatch import unwrap
from tiered.store.mappedfiles import QueueFiles

BATCH_DIR = "batchconsumequeue"
BCQ_ENTRY = struct.Struct(">qiqqqhii")
BCQ_ENTRY_SIZE = BCQ_ENTRY.size  # 46
BCQ_INVALID_POS = -1  # the compacted offset putBatchMessagePositionInfo writes
BCQ_DTYPE = np.dtype([("phys", ">i8"), ("size", ">i4"), ("tags", ">i8"), ("time", ">i8"), ("base", ">i8"),
                      ("batch", ">i2"), ("compacted", ">i4"), ("reserved", ">i4")])
_CQ_OUT = np.dtype([("phys", ">i8"), ("size", ">i4"), ("tags", ">i8")])
assert BCQ_DTYPE.itemsize == BCQ_ENTRY_SIZE and _CQ_OUT.itemsize == CQ_ENTRY_SIZE
_BATCH_AT = 36
_I16 = struct.Struct(">h")
QUEUE_TYPE_KEYS = ("queue.type", "+queue.type")


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchEntry:
    """One BatchConsumeQueue entry."""

    commitlog_offset: int
    size: int
    tags_code: int
    store_timestamp: int
    base_offset: int
    batch_size: int
    compacted_offset: int = BCQ_INVALID_POS
    reserved: int = 0

    @classmethod
    def unpack(cls, buf: Any, at: int = 0) -> BatchEntry:
        phys, size, tags, stamp, base, batch, compacted, reserved = BCQ_ENTRY.unpack_from(buf, at)
        return cls(commitlog_offset=phys, size=size, tags_code=tags, store_timestamp=stamp, base_offset=base,
                   batch_size=batch, compacted_offset=compacted, reserved=reserved)

    def pack(self) -> bytes:
        return BCQ_ENTRY.pack(self.commitlog_offset, self.size, self.tags_code, self.store_timestamp,
                              self.base_offset, self.batch_size, self.compacted_offset, self.reserved)

    @property
    def written(self) -> bool:
        return self.commitlog_offset >= 0 and self.size > 0 and self.base_offset >= 0 and self.batch_size > 0


def queue_type(config: Any) -> str | None:
    """A topic config's ``queue.type`` attribute (None when not set)."""
    attrs = config.get("attributes") if isinstance(config, dict) else None
    if not isinstance(attrs, dict):
        return None
    for key in QUEUE_TYPE_KEYS:
        if isinstance(attrs.get(key), str):
            return str(attrs[key])
    return None


def batch_topics(root: str | os.PathLike[str], configs: dict[str, Any], cq_topics: set[str]) -> set[str]:
    """Topics read from ``batchconsumequeue/``: those with a directory there
    that topics.json marks BatchCQ, or that have no ``consumequeue/`` one."""
    try:
        names = {e.name for e in os.scandir(os.path.join(root, BATCH_DIR)) if e.is_dir()}
    except FileNotFoundError:
        return set()
    return {t for t in names if queue_type(configs.get(t)) == "BatchCQ" or t not in cq_topics}


class BatchQueueFiles(QueueFiles):
    """A BatchConsumeQueue directory seen as a ConsumeQueue of its entries.

    File ``start`` (bytes, a multiple of 46) appears at ``start / 46 * 20``;
    its view holds the (CommitLog offset, size, tags code) of each written
    entry, zeros after, filled in as the broker writes more (checked at each
    ``view``). The view is a copy kept in step with the file, so ``release``
    and ``populate`` have nothing to do; the real entries are read by ``unit``.
    """

    is_batch = True
    unit_size = BCQ_ENTRY_SIZE

    def __init__(self, directory: str | os.PathLike[str], topic: str, queue_id: int) -> None:
        self._real: dict[int, int] = {}  # shown start -> the file's start byte
        self._units: dict[int, tuple[mmap.mmap | None, memoryview, bytearray, int]] = {}
        super().__init__(directory, topic, queue_id)

    def refresh(self) -> None:
        try:
            names = os.listdir(self._directory)
        except FileNotFoundError:
            names = []
        real = sorted(int(n) for n in names if len(n) == 20 and n.isascii() and n.isdigit())
        # a file off the 46-byte grid cannot be RocketMQ's: it is not shown (status names it)
        self._real = {r // BCQ_ENTRY_SIZE * CQ_ENTRY_SIZE: r for r in real if r % BCQ_ENTRY_SIZE == 0}
        self.starts = sorted(self._real)
        for start in list(self._units):
            if start not in self._real:
                del self._units[start]
                self._maps.pop(start, None)

    def real_start(self, start: int) -> int:
        return self._real[start]

    def name(self, start: int) -> str:
        return f"{self._prefix}{self._real.get(start, start // CQ_ENTRY_SIZE * BCQ_ENTRY_SIZE):020d}"

    def file_size(self, start: int) -> int:
        return os.stat(self.name(start)).st_size

    def view(self, start: int, need_end: int = 0) -> memoryview:
        cached = self._units.get(start)
        if cached is None or need_end > len(cached[2]):
            cached = self._map(start)
        self._sync(start, cached)
        view = self._maps[start][1]
        return view

    def _map(self, start: int) -> tuple[mmap.mmap | None, memoryview, bytearray, int]:
        fd = os.open(self.name(start), os.O_RDONLY)  # FileNotFoundError: expired
        try:
            length = os.fstat(fd).st_size
            mm = mmap.mmap(fd, length, access=mmap.ACCESS_READ) if length else None
        finally:
            os.close(fd)
        real = memoryview(mm) if mm is not None else memoryview(b"")
        shown = bytearray(length // BCQ_ENTRY_SIZE * CQ_ENTRY_SIZE)
        entry = (mm, real, shown, 0)
        self._units[start] = entry
        self._maps[start] = (None, memoryview(shown))
        return entry

    def _sync(self, start: int, cached: tuple[mmap.mmap | None, memoryview, bytearray, int]) -> None:
        """Copy the entries written since the last look into the shown view."""
        mm, real, shown, done = cached
        n = len(shown) // CQ_ENTRY_SIZE
        if done >= n or _I16.unpack_from(real, done * BCQ_ENTRY_SIZE + _BATCH_AT)[0] == 0:
            return
        hi = _bisect_written(real, done, n)
        units = np.frombuffer(real, BCQ_DTYPE, count=hi - done, offset=done * BCQ_ENTRY_SIZE)
        ok = (units["phys"] >= 0) & (units["size"] > 0) & (units["base"] >= 0) & (units["batch"] > 0)
        k = int(np.argmin(ok)) if not ok.all() else len(ok)  # the first entry RocketMQ's recover stops at
        out = np.frombuffer(shown, _CQ_OUT, count=k, offset=done * CQ_ENTRY_SIZE)
        out.setflags(write=True)
        for name in ("phys", "size", "tags"):
            out[name] = units[name][:k]
        self._units[start] = (mm, real, shown, done + k)

    def unit(self, offset: int) -> BatchEntry:
        """The BatchConsumeQueue entry at (entry) offset ``offset``."""
        byte = offset * CQ_ENTRY_SIZE
        start = self.locate(byte)
        if start is None:
            raise FileNotFoundError(byte)
        cached = self._units.get(start) or self._map(start)
        return BatchEntry.unpack(cached[1], (byte - start) // CQ_ENTRY_SIZE * BCQ_ENTRY_SIZE)

    def read(self, start: int, lo: int, n: int) -> tuple[bytes, int]:
        view = self.view(start)
        return bytes(view[lo:lo + n]), len(view)

    def read_bytes(self, start: int, lo: int, n: int) -> bytes:
        return bytes(self.view(start)[lo:lo + n])

    def written_count(self, start: int, n: int) -> int:
        return self._units[start][3] if start in self._units else 0

    def _drop(self, start: int) -> None:
        self._maps.pop(start, None)
        self._units.pop(start, None)

    def close(self) -> None:
        for start in list(self._units):
            self._drop(start)


def _bisect_written(real: memoryview, lo: int, hi: int) -> int:
    """The first entry in [lo, hi) whose batch size is 0 (hi: none), by
    bisection: entries are written in order, zeros follow the last."""
    size_at = _I16.unpack_from
    if size_at(real, (hi - 1) * BCQ_ENTRY_SIZE + _BATCH_AT)[0] != 0:
        return hi
    while lo < hi:
        mid = (lo + hi) // 2
        if size_at(real, mid * BCQ_ENTRY_SIZE + _BATCH_AT)[0] != 0:
            lo = mid + 1
        else:
            hi = mid
    return lo


def entry_of(files: BatchQueueFiles, queue_offset: int, lo: int, hi: int) -> int:
    """The entry in [lo, hi) whose messages hold ``queue_offset`` (base <=
    queue_offset < base + batch size), by bisection over base offsets
    (they grow with the entries); ``hi`` when every entry lies below it,
    ``lo`` when above."""
    while lo < hi:
        mid = (lo + hi) // 2
        unit = files.unit(mid)
        if unit.base_offset + unit.batch_size <= queue_offset:
            lo = mid + 1
        else:
            hi = mid
    return lo


def batch_record_dict(rec: Record, entry: BatchEntry | None) -> dict[str, Any]:
    """What ``tiered inspect --json`` prints for a BatchCQ record: the record,
    its entry, and its messages unwrapped (``innerbatch.unwrap``)."""
    d = rec.to_dict()
    if entry is not None:
        d.update(cq_type="batch", cq_offset=entry.base_offset, cq_batch_num=entry.batch_size,
                 cq_tags_code=entry.tags_code, cq_store_timestamp=entry.store_timestamp,
                 cq_compacted_offset=entry.compacted_offset)
    d["inner_messages"] = [
        {"queue_offset": m.queue_offset, "flag": m.flag, "msg_id": m.msg_id, "tags": m.properties.get("TAGS"),
         "keys": [k for k in m.properties.get("KEYS", "").split(" ") if k], "properties": m.properties,
         "body_length": len(m.body)}
        for m in unwrap(rec)
    ]
    return d
