"""Write a store in the broker's exact on-disk layout, without a broker.

Tests, the demo and the benchmarks need real stores: CommitLog files that
roll with the end-of-file filler, preallocated ConsumeQueue files, and the
config JSON persisted with the tmp/bak/rename protocol. A record is written
before its ConsumeQueue entry, as the broker's reput does, so a concurrent
reader never sees an entry for a record that is not there yet.

Reopening an existing store recovers the append position (walking the last
CommitLog file) and every queue's next offset.
"""

from __future__ import annotations

import mmap
import os
import struct
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tiered.format import batch
from tiered.format.codec import (
    BLANK_LENGTH,
    CRC_MASK,
    MAX_PROPERTIES,
    CQ_ENTRY,
    CQ_ENTRY_SIZE,
    CQ_FILLER_SIZE,
    Host,
    Message,
    Peek,
    body_crc,
    crc32,
    encode_blank,
    cq_written_entries,
    encode_properties,
    encode_record,
    peek,
    tags_code,
)
from tiered.format.jsonfile import read_json, write_json

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
# The broker's default messageDelayLevel, in seconds.
DELAY_LEVELS = (1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200)

# queue offset and physical offset sit at byte 20 of every record
_OFFSETS = struct.Struct(">qq")
_OFFSETS_AT = 20

DEFAULT_COMMITLOG_FILE_SIZE = 1 << 30
DEFAULT_CQ_ENTRIES = 300_000

_HEAD = struct.Struct(">iIiiiqqiq")  # size, magic, body CRC, queue, flag, queue/physical offsets, sys flag, born
_I64 = struct.Struct(">q")
_I16 = struct.Struct(">h")
_RECON_PREP_BODYLEN = struct.Struct(">iqi")


class RecordTemplate:
    """``encode_record`` for many messages of one topic sharing hosts, flags
    and reconsume times: everything but the queue, body, properties and
    timestamps is encoded once. ``encode`` gives the same bytes as
    ``encode_record`` of the equivalent Message (offsets left 0)."""

    def __init__(self, topic: str, *, born_host: Host, store_host: Host, flag: int = 0, sys_flag: int = 0,
                 reconsume_times: int = 0) -> None:
        probe = encode_record(Message(topic=topic, queue_id=0, body=b"", flag=flag, sys_flag=sys_flag,
                                      born_host=born_host, store_host=store_host,
                                      reconsume_times=reconsume_times))
        # the probe's parts that do not vary, cut where the varying fields sit
        _size, magic, _crc, _q, flag_, _qo, _po, sys_flag_, _born = _HEAD.unpack_from(probe)
        self._magic, self._flag, self._sys_flag = magic, flag_, sys_flag_
        born_len = len(born_host.packed())
        store_len = len(store_host.packed())
        at = _HEAD.size
        self._born = bytes(probe[at:at + born_len])
        self._store = bytes(probe[at + born_len + 8:at + born_len + 8 + store_len])
        self._reconsume = reconsume_times
        topic_at = at + born_len + 8 + store_len + _RECON_PREP_BODYLEN.size
        self._topic = bytes(probe[topic_at:len(probe) - 2])  # topic length + topic, before the props length
        self._fixed = len(probe) - 2  # all but the props length, with an empty body

    def size(self, body: bytes, props: bytes) -> int:
        return self._fixed + 2 + len(body) + len(props)

    def encode(self, queue_id: int, body: bytes, props: bytes, born_ms: int, store_ms: int, *,
               queue_offset: int = 0, physical_offset: int = 0) -> bytes:
        if len(props) > MAX_PROPERTIES:
            raise ValueError(f"properties of {len(props)} bytes exceed {MAX_PROPERTIES}")
        return b"".join((
            _HEAD.pack(self._fixed + 2 + len(body) + len(props), self._magic, body_crc(body), queue_id, self._flag,
                       queue_offset, physical_offset, self._sys_flag, born_ms),
            self._born, _I64.pack(store_ms), self._store, _RECON_PREP_BODYLEN.pack(self._reconsume, 0, len(body)),
            body, self._topic, _I16.pack(len(props)), props,
        ))


@dataclass(frozen=True, slots=True)
class Appended:
    topic: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    size: int


class StoreWriter:
    """Appends messages to a store directory. Not thread-safe; one writer per store."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        commitlog_file_size: int = DEFAULT_COMMITLOG_FILE_SIZE,
        cq_entries_per_file: int = DEFAULT_CQ_ENTRIES,
        store_host: Host = Host("127.0.0.1", 10911),  # noqa: B008 - Host is immutable
        preallocate: bool = True,
        fsync: bool = False,
        buffer_bytes: int = 0,
    ) -> None:
        if commitlog_file_size < 4096:
            raise ValueError("CommitLog files must hold at least 4096 bytes")
        self.root = Path(root)
        self.commitlog_file_size = commitlog_file_size
        self.cq_file_bytes = cq_entries_per_file * CQ_ENTRY_SIZE
        self.store_host = store_host
        self.preallocate = preallocate
        self.fsync = fsync
        (self.root / "commitlog").mkdir(parents=True, exist_ok=True)
        (self.root / "consumequeue").mkdir(parents=True, exist_ok=True)
        (self.root / "config").mkdir(parents=True, exist_ok=True)
        self._fds: dict[tuple[object, ...], int] = {}
        # buffer_bytes > 0: records and entries are held and written in large
        # writes (write_pending, close); readers see them only then
        self._buffer_bytes = buffer_bytes
        self._cl_pending = bytearray()
        self._cl_at = (0, 0)  # (file start, offset in file) of _cl_pending
        self._cq_pending: dict[tuple[object, ...], tuple[int, bytearray]] = {}
        self._next_queue_offset: dict[tuple[str, int], int] = {}
        self.position = self._recover_position()
        self._recover_cq_file_bytes()
        self._topics: dict[str, dict[str, Any]] = (read_json(self.root / "config" / "topics.json") or {}).get(
            "topicConfigTable", {}
        )

    # --- recovery ----------------------------------------------------------

    def _recover_position(self) -> int:
        names = sorted(int(n) for n in os.listdir(self.root / "commitlog") if n.isdigit() and len(n) == 20)
        if not names:
            return 0
        start = names[-1]
        path = self.root / "commitlog" / f"{start:020d}"
        # Mapped, not read: a default CommitLog file is 1 GiB.
        with open(path, "rb") as fh:
            length = os.fstat(fh.fileno()).st_size
            mm = mmap.mmap(fh.fileno(), length, access=mmap.ACCESS_READ) if length else None
        data = memoryview(mm) if mm is not None else memoryview(b"")
        try:
            # An existing store keeps its file size: derived from the files, not from the argument.
            if len(names) > 1:
                self.commitlog_file_size = names[1] - names[0]
            elif len(data) >= 4096:
                self.commitlog_file_size = len(data)
            pos = 0
            while pos < len(data):
                kind, size = peek(data, pos, str(path))
                if kind is Peek.UNWRITTEN:
                    break
                if kind is Peek.BLANK:
                    return start + self.commitlog_file_size
                pos += size
            return start + pos
        finally:
            data.release()
            if mm is not None:
                mm.close()

    def _recover_cq_file_bytes(self) -> None:
        """An existing store keeps its ConsumeQueue file size (one broker
        setting for every queue): from two consecutive file names, else from
        the length of a preallocated file. Appending with another size would
        write entries into the wrong file."""
        base = self.root / "consumequeue"
        single: set[int] = set()
        for topic_dir in sorted(os.scandir(base), key=lambda e: e.name):
            if not topic_dir.is_dir():
                continue
            for queue_dir in os.scandir(topic_dir.path):
                if not queue_dir.is_dir():
                    continue
                names = sorted(int(n) for n in os.listdir(queue_dir.path) if len(n) == 20 and n.isdigit())
                if len(names) > 1:
                    self.cq_file_bytes = names[1] - names[0]
                    return
                if names and self.preallocate:
                    length = os.path.getsize(os.path.join(queue_dir.path, f"{names[0]:020d}"))
                    if length and length % CQ_ENTRY_SIZE == 0 and names[0] % length == 0:
                        single.add(length)
        if len(single) == 1:
            self.cq_file_bytes = single.pop()

    def next_queue_offset(self, topic: str, queue_id: int) -> int:
        key = (topic, queue_id)
        if key not in self._next_queue_offset:
            self._next_queue_offset[key] = self._recover_queue(topic, queue_id)
        return self._next_queue_offset[key]

    def _recover_queue(self, topic: str, queue_id: int) -> int:
        directory = self.root / "consumequeue" / topic / str(queue_id)
        try:
            names = sorted(int(n) for n in os.listdir(directory) if n.isdigit())
        except FileNotFoundError:
            return 0
        for start in reversed(names):
            lo = cq_written_entries((directory / f"{start:020d}").read_bytes())
            if lo:
                return start // CQ_ENTRY_SIZE + lo
        return names[0] // CQ_ENTRY_SIZE if names else 0

    # --- low-level file access ----------------------------------------------

    def _fd(self, key: tuple[object, ...], size: int) -> int:
        """The open file for ``key``: ("cl", start) or (topic, queue_id, start).
        Keyed by tuples, not paths: building a Path per record was most of
        what appending cost."""
        fd = self._fds.get(key)
        if fd is None:
            path = (self._commitlog_path(key[1]) if key[0] == "cl" and len(key) == 2 and isinstance(key[1], int)
                    else self._cq_file(*key))
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            if self.preallocate and os.fstat(fd).st_size < size:
                os.ftruncate(fd, size)  # sparse zeros, like the broker's preallocated files
            self._fds[key] = fd
        return fd

    def _commitlog_path(self, start: int) -> Path:
        return self.root / "commitlog" / f"{start:020d}"

    def _cq_file(self, topic: object, queue_id: object, start: object) -> Path:
        return self.root / "consumequeue" / str(topic) / str(queue_id) / f"{start:020d}"

    def _write_cl(self, start: int, rel: int, data: bytes | bytearray | memoryview) -> None:
        if not self._buffer_bytes:
            os.pwrite(self._fd(("cl", start), self.commitlog_file_size), data, rel)
            return
        if self._cl_pending and (self._cl_at[0] != start or self._cl_at[1] + len(self._cl_pending) != rel):
            self.write_pending()
        if len(data) >= min(self._buffer_bytes, _LARGE_WRITE):
            # already a large write: what is pending first, then this, without copying it
            self.write_pending()
            os.pwrite(self._fd(("cl", start), self.commitlog_file_size), data, rel)
            return
        if not self._cl_pending:
            self._cl_at = (start, rel)
        self._cl_pending += data
        if len(self._cl_pending) >= self._buffer_bytes:
            self.write_pending()

    def _write_cq(self, topic: str, queue_id: int, byte: int, entry: bytes) -> None:
        start = byte - byte % self.cq_file_bytes
        key = (topic, queue_id, start)
        if not self._buffer_bytes:
            os.pwrite(self._fd(key, self.cq_file_bytes), entry, byte - start)
            return
        pending = self._cq_pending.get(key)
        if pending is None:
            self._cq_pending[key] = pending = (byte - start, bytearray())
        pending[1].extend(entry)

    def write_pending(self) -> None:
        """Write what a buffered writer holds: the records first, then their
        ConsumeQueue entries, as the broker's reput orders them, so a reader
        never sees an entry whose record is not there yet."""
        if self._cl_pending:
            start, rel = self._cl_at
            os.pwrite(self._fd(("cl", start), self.commitlog_file_size), self._cl_pending, rel)
            self._cl_pending = bytearray()
        for key, (rel, entries) in self._cq_pending.items():
            os.pwrite(self._fd(key, self.cq_file_bytes), entries, rel)
        self._cq_pending.clear()

    def _write_cq_run(self, topic: str, queue_id: int, queue_offset: int, entries: bytes) -> None:
        """Consecutive entries from ``queue_offset``, split where ConsumeQueue files roll."""
        byte = queue_offset * CQ_ENTRY_SIZE
        done = 0
        while done < len(entries):
            room = self.cq_file_bytes - byte % self.cq_file_bytes
            piece = entries[done:done + room]
            self._write_cq(topic, queue_id, byte, piece)
            byte += len(piece)
            done += len(piece)

    def _close_fd(self, key: tuple[object, ...]) -> None:
        self.write_pending()
        fd = self._fds.pop(key, None)
        if fd is not None:
            os.close(fd)

    # --- appending -----------------------------------------------------------

    def append(self, msg: Message, *, cq_tags_code: int | None = None) -> Appended:
        """Append ``msg`` (its queue offset and physical offset are assigned
        here) and its ConsumeQueue entry."""
        tags = cq_tags_code if cq_tags_code is not None else tags_code(msg.properties.get("TAGS"))
        return self.append_encoded(msg.topic, msg.queue_id, bytearray(encode_record(msg)), tags)

    def _reserve(self, size: int) -> tuple[int, int]:
        """(file start, offset in it) where a record of ``size`` bytes goes:
        at ``position``, or at the next file after the end-of-file filler."""
        file_start = self.position - self.position % self.commitlog_file_size
        rel = self.position - file_start
        if size > self.commitlog_file_size - BLANK_LENGTH:
            raise ValueError(f"record of {size} bytes does not fit a CommitLog file of {self.commitlog_file_size}")
        if rel + size + BLANK_LENGTH > self.commitlog_file_size:
            # The broker keeps room for the filler after the last record.
            self._write_cl(file_start, rel, encode_blank(self.commitlog_file_size - rel))
            self._close_fd(("cl", file_start))
            self.position = file_start + self.commitlog_file_size
            file_start, rel = self.position, 0
        return file_start, rel

    def append_encoded(self, topic: str, queue_id: int, data: bytearray, tags: int) -> Appended:
        """Append a record encoded by ``encode_record`` for ``topic``/``queue_id``
        (its two offsets are patched in here) and its ConsumeQueue entry."""
        queue_offset = self.next_queue_offset(topic, queue_id)
        size = len(data)
        physical = self.append_record(data, queue_offset)
        self._write_cq(topic, queue_id, queue_offset * CQ_ENTRY_SIZE, CQ_ENTRY.pack(physical, size, tags))
        self._next_queue_offset[(topic, queue_id)] = queue_offset + 1
        self.register_topic(topic, queue_id)
        return Appended(topic, queue_id, queue_offset, physical, size)

    def append_record(self, data: bytearray, queue_offset: int) -> int:
        """Write one encoded record at the append position (past the
        end-of-file filler into the next CommitLog file when it does not fit),
        its queue offset and physical offset patched in; returns the physical
        offset. No ConsumeQueue entry: ``append_encoded`` writes one, a
        BatchConsumeQueue's writer (tiered.store.batchwriter) its own."""
        file_start, rel = self._reserve(len(data))
        physical = self.position
        _OFFSETS.pack_into(data, _OFFSETS_AT, queue_offset, physical)
        self._write_cl(file_start, rel, data)
        self.position += len(data)
        return physical

    def append_rows(self, topic: str, rows: np.ndarray, first: int, queues: int, offsets: list[int],
                    code: int) -> Iterator[int]:
        """Append records of one size, a row each of ``rows`` (uint8, queue ids
        and offsets not yet set): message ``first + i`` of a round robin over
        ``queues`` queues of ``topic`` that started at queue offsets
        ``offsets``, tags code ``code``. Places them as ``append`` would
        (rolling files), sets their queue ids and offsets, writes them, then
        their entries; yields how many each span (the records up to a file's
        end) appended, its queues' next offsets advanced by then."""
        size = rows.shape[1]
        done = 0
        while done < len(rows):
            file_start, rel = self._reserve(size)
            fit = min(len(rows) - done, (self.commitlog_file_size - BLANK_LENGTH - rel) // size)
            span = rows[done:done + fit]
            g = first + done + np.arange(fit, dtype=np.int64)  # message numbers of this call
            queue = g % queues
            queue_offset = np.asarray(offsets, np.int64)[queue] + g // queues
            phys = self.position + np.arange(fit, dtype=np.int64) * size
            _put_be(span, 12, ">i4", queue)
            _put_be(span, _OFFSETS_AT, ">i8", queue_offset)
            _put_be(span, _OFFSETS_AT + 8, ">i8", phys)
            self._write_cl(file_start, rel, span.reshape(-1).data)
            self.position += fit * size
            entries = np.empty(fit, _ENTRY_DTYPE)
            entries["phys"], entries["size"], entries["tags"] = phys, size, code
            reached = range(min(queues, fit))  # the span's first message of each queue it reaches
            for j in reached:
                self._write_cq_run(topic, int(queue[j]), int(queue_offset[j]), entries[j::queues].tobytes())
            for j in reached:  # a span counts once all its entries are written
                self._next_queue_offset[(topic, int(queue[j]))] = int(queue_offset[j]) + len(range(j, fit, queues))
            done += fit
            yield fit

    def put(
        self,
        topic: str,
        queue_id: int,
        body: bytes,
        *,
        tags: str | None = None,
        keys: list[str] | None = None,
        unique_key: str | None = None,
        properties: Mapping[str, str] | None = None,
        born_timestamp: int | None = None,
        store_timestamp: int | None = None,
        born_host: Host | None = None,
        store_host: Host | None = None,
        delay_level: int | None = None,
        reconsume_times: int = 0,
        flag: int = 0,
        sys_flag: int = 0,
    ) -> Appended:
        """Append one message the way a producer's send reaches the broker.

        ``delay_level`` parks it in ``SCHEDULE_TOPIC_XXXX`` queue level-1 with
        ``REAL_TOPIC``/``REAL_QID``/``DELAY`` and the delivery time as tags code.
        """
        now = int(time.time() * 1000)
        store_ts = store_timestamp if store_timestamp is not None else now
        born_ts = born_timestamp if born_timestamp is not None else store_ts
        props: dict[str, str] = {}
        if keys:
            props["KEYS"] = " ".join(keys)
        if tags:
            props["TAGS"] = tags
        if unique_key:
            props["UNIQ_KEY"] = unique_key
        props.update(properties or {})
        cq_tags: int | None = None
        if delay_level:
            if not 1 <= delay_level <= len(DELAY_LEVELS):
                raise ValueError(f"delay level {delay_level} outside 1..{len(DELAY_LEVELS)}")
            props["DELAY"] = str(delay_level)
            props["REAL_TOPIC"] = topic
            props["REAL_QID"] = str(queue_id)
            topic, queue_id = SCHEDULE_TOPIC, delay_level - 1
            cq_tags = store_ts + DELAY_LEVELS[delay_level - 1] * 1000
        if topic.startswith("%RETRY%") or topic.startswith("%DLQ%"):
            props.setdefault("RECONSUME_TIME", str(reconsume_times))
        msg = Message(
            topic=topic, queue_id=queue_id, body=body, properties=props, flag=flag, sys_flag=sys_flag,
            born_timestamp=born_ts, born_host=born_host or Host("127.0.0.1", 50000),
            store_timestamp=store_ts, store_host=store_host or self.store_host,
            reconsume_times=reconsume_times,
        )
        return self.append(msg, cq_tags_code=cq_tags)

    def put_multi(self, topic: str, queue_id: int, body: bytes, lmq: list[str], *, enable_lmq: bool = True,
                  **kw: Any) -> Appended:
        """``put`` with multi-dispatch to the LMQ queues ``lmq``, as
        ``LmqDispatch.wrapLmqDispatch`` and ``ConsumeQueue.multiDispatchLmqQueue``
        do it: the record lists them and their next offsets in
        ``INNER_MULTI_DISPATCH``/``INNER_MULTI_QUEUE_OFFSET`` and each gets an
        entry for it, in queue 0 (in the parent's queue id without ``enable_lmq``).
        LMQ queues are never registered in topics.json."""
        lmq_qid = 0 if enable_lmq else queue_id
        offsets = [self.next_queue_offset(name, lmq_qid) for name in lmq]
        props = dict(kw.pop("properties", None) or {})
        props.update({"INNER_MULTI_DISPATCH": ",".join(lmq), "INNER_MULTI_QUEUE_OFFSET": ",".join(map(str, offsets))})
        done = self.put(topic, queue_id, body, properties=props, **kw)
        tags = tags_code(kw.get("tags"))
        for name, offset in zip(lmq, offsets):
            self._write_cq(name, lmq_qid, offset * CQ_ENTRY_SIZE, CQ_ENTRY.pack(done.commitlog_offset, done.size, tags))
            self._next_queue_offset[(name, lmq_qid)] = offset + 1
        return done

    def fill_queue_head(self, topic: str, queue_id: int, start_offset: int) -> None:
        """Start an empty queue at ``start_offset`` with the broker's filler
        entries before it (what a queue created above offset 0 looks like)."""
        if self.next_queue_offset(topic, queue_id) != 0:
            raise ValueError(f"{topic}/{queue_id} already holds entries")
        first_file = (start_offset * CQ_ENTRY_SIZE) // self.cq_file_bytes * self.cq_file_bytes
        filler = CQ_ENTRY.pack(0, CQ_FILLER_SIZE, 0)
        for off in range(first_file // CQ_ENTRY_SIZE, start_offset):
            self._write_cq(topic, queue_id, off * CQ_ENTRY_SIZE, filler)
        if start_offset * CQ_ENTRY_SIZE == first_file:
            self._fd((topic, queue_id, first_file), self.cq_file_bytes)
        self._next_queue_offset[(topic, queue_id)] = start_offset
        self.register_topic(topic, queue_id)

    # --- config --------------------------------------------------------------

    def register_topic(self, topic: str, queue_id: int) -> None:
        """List ``topic`` in topics.json with at least ``queue_id + 1`` read and
        write queues, as the broker's auto-create does on a first message;
        written only when that changes it."""
        cfg = self._topics.get(topic)
        if cfg is not None and cfg.get("readQueueNums", 0) > queue_id:
            return
        nums = max(queue_id + 1, cfg.get("readQueueNums", 0) if cfg else 0)
        merged = dict(cfg or {})
        merged.update({
            "topicName": topic, "readQueueNums": nums, "writeQueueNums": nums, "perm": 6,
            "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": False,
        })
        merged.setdefault("attributes", {})
        self._topics[topic] = merged
        self.write_topics()

    def set_topic_attribute(self, topic: str, name: str, value: str | None) -> None:
        """Set (or with None remove) a topic attribute such as ``reserve.time``."""
        cfg = self._topics.setdefault(topic, {"topicName": topic, "readQueueNums": 0, "writeQueueNums": 0,
                                               "perm": 6, "attributes": {}})
        attrs = cfg.setdefault("attributes", {})
        if value is None:
            attrs.pop(name, None)
        else:
            attrs[name] = value
        self.write_topics()

    def write_topics(self) -> None:
        write_json(self.root / "config" / "topics.json",
                   {"topicConfigTable": self._topics, "dataVersion": {"counter": len(self._topics),
                                                                        "timestamp": int(time.time() * 1000)}},
                   fsync=self.fsync)

    def write_checkpoint(self, confirm_offset: int = 0) -> None:
        """``checkpoint``: physic/logics/index timestamps, master flushed
        offset, confirmed CommitLog offset (used in controller mode)."""
        self.write_pending()
        now = int(time.time() * 1000)
        data = struct.pack(">qqqqq", now, now, now, self.position, confirm_offset).ljust(4096, b"\0")
        path = self.root / "checkpoint"
        tmp = path.with_name("checkpoint.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)

    def flush(self) -> None:
        self.write_pending()
        for fd in self._fds.values():
            os.fsync(fd)

    def close(self) -> None:
        self.write_pending()
        if self.fsync:
            self.flush()
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# messages encoded at once by produce_messages: about this many bytes of records
_CHUNK_BYTES = 4 << 20
# a buffered writer writes data this large at once, not through its buffer (a copy)
_LARGE_WRITE = 1 << 20
# each byte's two hex digits, as one 2-byte item: one lookup a byte
_HEX_PAIRS = np.frombuffer(b"".join(b"%02X" % b for b in range(256)), np.uint16)
_ENTRY_DTYPE = np.dtype([("phys", ">i8"), ("size", ">i4"), ("tags", ">i8")])  # a ConsumeQueue entry


class MessageDraws:
    """The unique keys and bodies of ``tiered produce --seed``: one SFC64
    stream (numpy), ``ceil((16 + body_size) / 8)`` 64-bit words per message,
    little-endian bytes: the unique key is the first 16 (upper-case hex),
    the body the next ``body_size``. Drawn in bulk, ~5x faster than
    ``random.randbytes``; a run of ``take`` calls draws the same messages
    however it is split."""

    def __init__(self, seed: int, body_size: int) -> None:
        self._gen = np.random.SFC64(seed)
        self.body_size = body_size
        self._words = (16 + body_size + 7) // 8

    def take(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        """(unique key bytes (count, 16), bodies (count, body_size)), uint8."""
        words = self._gen.random_raw(count * self._words)
        raw = (words if sys.byteorder == "little" else words.byteswap()).view(np.uint8)
        rows = raw.reshape(count, self._words * 8)
        return rows[:, :16], rows[:, 16:16 + self.body_size]

    def messages(self, count: int) -> Iterator[tuple[str, bytes]]:
        """(unique key, body) of each of the next ``count`` messages."""
        for _ in range(count):
            uid, body = self.take(1)
            yield uid.tobytes().hex().upper(), body.tobytes()


def _hex_columns(raw: np.ndarray) -> np.ndarray:
    """Upper-case hex of each row of ``raw`` (uint8), as ASCII (rows, 2 x width):
    one lookup of each byte's two digits."""
    return _HEX_PAIRS.take(raw).view(np.uint8)


def _put_be(rows: np.ndarray, at: int, dtype: str, values: np.ndarray | int) -> None:
    """Big-endian ``values`` into columns ``at``.. of every row."""
    width = np.dtype(dtype).itemsize
    rows[:, at:at + width] = np.asarray(values, dtype).reshape(-1, 1).view(np.uint8)


@dataclass(frozen=True, kw_only=True)
class _Layout:
    """Where the varying fields of one produce chunk's records sit: every
    record of a chunk has the same size (same body size, same key digits)."""

    size: int
    store_ts_at: int
    body_at: int
    digits_at: int  # the key-<i> digits
    digits: int
    uid_at: int  # the unique key's 32 hex digits


def produce_messages(
    writer: StoreWriter, topic: str, *, queues: int, messages: int, body_size: int, keys: bool,
    tags: str | None, seed: int, start_ms: int | None, interval_ms: int, born_host: Host,
) -> None:
    """What ``tiered produce`` appends: ``messages`` messages round robin over
    ``queues`` queues, random bodies and unique keys drawn from ``seed``
    (``MessageDraws``). The same bytes ``writer.put`` would write for each
    (a test holds them equal), at about a microsecond a message instead of
    tens: records of a chunk share one size, so the chunk is one 2-D array
    filled column by column (head, body, key digits, unique key), and its
    records and ConsumeQueue entries go out in a few large writes."""
    template = RecordTemplate(topic, born_host=born_host, store_host=writer.store_host, reconsume_times=0)
    # put() orders the properties KEYS, TAGS, UNIQ_KEY, then RECONSUME_TIME for retry/DLQ topics
    tags_part = encode_properties({"TAGS": tags}) if tags else b""
    retry = topic.startswith("%RETRY%") or topic.startswith("%DLQ%")
    tail = encode_properties({"RECONSUME_TIME": "0"}) if retry else b""
    code = tags_code(tags)
    # every queue that gets a message registered in the order appends would
    # register them; the writer advances their offsets span by span
    offsets = [writer.next_queue_offset(topic, q) for q in range(queues)]
    for q in range(min(queues, messages)):
        writer.register_topic(topic, q)
    draws = MessageDraws(seed, body_size)
    per_chunk = max(1, _CHUNK_BYTES // (template.size(b"", b"") + body_size + 100))
    done = 0
    while done < messages:
        # one chunk: at most per_chunk messages, all with as many key digits
        count = min(per_chunk, messages - done, 10 ** len(str(done)) - done if keys else messages)
        props = b"".join((b"KEYS\x01key-%d\x02" % done if keys else b"", tags_part,
                          b"UNIQ_KEY\x01" + b"0" * 32 + b"\x02", tail))
        proto = template.encode(0, bytes(body_size), props, 0, 0)
        size = len(proto)
        props_at = size - len(props)
        uid_at = props_at + (len(b"KEYS\x01key-\x02") + len(str(done)) if keys else 0) + len(tags_part) + 9
        layout = _Layout(size=size, store_ts_at=_HEAD.size + len(template._born), body_at=size - len(props) - 2
                         - len(template._topic) - body_size, digits_at=props_at + 9, digits=len(str(done)),
                         uid_at=uid_at)
        rows = _chunk_rows(np.frombuffer(proto, np.uint8), layout, draws, done, count, keys,
                           start_ms, interval_ms)
        for appended in writer.append_rows(topic, rows, done, queues, offsets, code):
            done += appended


def _chunk_rows(proto: np.ndarray, layout: _Layout, draws: MessageDraws, first: int, count: int, keys: bool,
                start_ms: int | None, interval_ms: int) -> np.ndarray:
    """The records of messages ``first``.. ``first + count - 1``, offsets not
    yet set: ``proto`` repeated, the varying columns filled in."""
    rows = np.empty((count, layout.size), np.uint8)
    uids, bodies = draws.take(count)
    at, end = layout.body_at, layout.body_at + draws.body_size
    rows[:, :at] = proto[:at]  # the prototype around the body, the body drawn
    rows[:, at:end] = bodies
    rows[:, end:] = proto[end:]
    _put_be(rows, 8, ">i4", _body_crcs(rows, at, draws.body_size))
    if start_ms is not None:
        ts = start_ms + (first + np.arange(count, dtype=np.int64)) * interval_ms
    else:
        ts = np.full(count, int(time.time() * 1000), np.int64)
    _put_be(rows, 40, ">i8", ts)  # born
    _put_be(rows, layout.store_ts_at, ">i8", ts)
    if keys:
        numbers = first + np.arange(count, dtype=np.int64)
        for k in range(layout.digits):
            rows[:, layout.digits_at + k] = (numbers // 10 ** (layout.digits - 1 - k)) % 10 + 48
    rows[:, layout.uid_at:layout.uid_at + 32] = _hex_columns(uids)
    return rows


def _body_crcs(rows: np.ndarray, at: int, length: int) -> np.ndarray:
    """The masked CRC of each row's ``length`` bytes at ``at``: in one call of
    the compiled loop where it is built, else one zlib-ng call a row."""
    count, size = rows.shape
    native = batch._native
    out = np.empty(count, np.int64)
    if native is not None:
        native.crc32_rows(rows, at, size, length, out)
    else:
        view = rows.reshape(-1).data
        starts = range(at, count * size, size)
        out[:] = np.fromiter(map(crc32, map(view.__getitem__, map(slice, starts, range(at + length, count * size + 1,
                                                                                       size)))), np.int64, count=count)
    return out & CRC_MASK
