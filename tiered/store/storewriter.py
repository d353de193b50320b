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
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tiered.format.codec import (
    BLANK_LENGTH,
    MAX_PROPERTIES,
    CQ_ENTRY,
    CQ_ENTRY_SIZE,
    CQ_FILLER_SIZE,
    Host,
    Message,
    Peek,
    body_crc,
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

    def _write_cl(self, start: int, rel: int, data: bytes | bytearray) -> None:
        if not self._buffer_bytes:
            os.pwrite(self._fd(("cl", start), self.commitlog_file_size), data, rel)
            return
        if self._cl_pending and (self._cl_at[0] != start or self._cl_at[1] + len(self._cl_pending) != rel):
            self.write_pending()
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
        file_start, rel = self._reserve(size)
        physical = self.position
        _OFFSETS.pack_into(data, _OFFSETS_AT, queue_offset, physical)
        self._write_cl(file_start, rel, data)
        self.position += size
        self._write_cq(topic, queue_id, queue_offset * CQ_ENTRY_SIZE, CQ_ENTRY.pack(physical, size, tags))
        self._next_queue_offset[(topic, queue_id)] = queue_offset + 1
        self._register_topic(topic, queue_id)
        return Appended(topic, queue_id, queue_offset, physical, size)

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
        self._register_topic(topic, queue_id)

    # --- config --------------------------------------------------------------

    def _register_topic(self, topic: str, queue_id: int) -> None:
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


def produce_messages(
    writer: StoreWriter, topic: str, *, queues: int, messages: int, body_size: int, keys: bool,
    tags: str | None, seed: int, start_ms: int | None, interval_ms: int, born_host: Host,
) -> None:
    """What ``tiered produce`` appends: ``messages`` messages round robin over
    ``queues`` queues, random bodies and unique keys drawn from ``seed``.
    The same bytes ``writer.put`` would write for each (a test holds them
    equal), at a few microseconds a message instead of tens: one template,
    properties joined as bytes, records written in large writes."""
    import random
    rng = random.Random(seed)
    template = RecordTemplate(topic, born_host=born_host, store_host=writer.store_host,
                              reconsume_times=0)
    # put() orders the properties KEYS, TAGS, UNIQ_KEY, then RECONSUME_TIME for retry/DLQ topics
    tags_part = encode_properties({"TAGS": tags}) if tags else b""
    retry = topic.startswith("%RETRY%") or topic.startswith("%DLQ%")
    tail = encode_properties({"RECONSUME_TIME": "0"}) if retry else b""
    code = tags_code(tags)
    # every queue that gets a message registered in the order appends would
    # register them; queue offsets kept here, handed back at the end
    offsets = [writer.next_queue_offset(topic, q) for q in range(queues)]
    for q in range(min(queues, messages)):
        writer._register_topic(topic, q)
    keys_fmt = b"KEYS\x01key-%d\x02" if keys else b""
    try:
        for i in range(messages):
            q = i % queues
            ts = start_ms + i * interval_ms if start_ms is not None else int(time.time() * 1000)
            uid = rng.getrandbits(128)
            body = rng.randbytes(body_size)
            props = b"".join((keys_fmt % i if keys else b"", tags_part, b"UNIQ_KEY\x01%032X\x02" % uid, tail))
            size = template.size(body, props)
            file_start, rel = writer._reserve(size)
            physical = writer.position
            offset = offsets[q]
            writer._write_cl(file_start, rel, template.encode(q, body, props, ts, ts, queue_offset=offset,
                                                              physical_offset=physical))
            writer.position = physical + size
            writer._write_cq(topic, q, offset * CQ_ENTRY_SIZE, CQ_ENTRY.pack(physical, size, code))
            offsets[q] = offset + 1
    finally:
        for q in range(queues):
            writer._next_queue_offset[(topic, q)] = offsets[q]
