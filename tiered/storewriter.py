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

from tiered.codec import (
    BLANK_LENGTH,
    CQ_ENTRY,
    CQ_ENTRY_SIZE,
    CQ_FILLER_SIZE,
    Host,
    Message,
    Peek,
    encode_blank,
    cq_written_entries,
    encode_record,
    peek,
    tags_code,
)
from tiered.jsonfile import read_json, write_json

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
# The broker's default messageDelayLevel, in seconds.
DELAY_LEVELS = (1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200)

# queue offset and physical offset sit at byte 20 of every record
_OFFSETS = struct.Struct(">qq")
_OFFSETS_AT = 20

DEFAULT_COMMITLOG_FILE_SIZE = 1 << 30
DEFAULT_CQ_ENTRIES = 300_000


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
        self._fds: dict[Path, int] = {}
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

    def _fd(self, path: Path, size: int) -> int:
        fd = self._fds.get(path)
        if fd is None:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            if self.preallocate and os.fstat(fd).st_size < size:
                os.ftruncate(fd, size)  # sparse zeros, like the broker's preallocated files
            self._fds[path] = fd
        return fd

    def _write(self, path: Path, file_size: int, rel: int, data: bytes) -> None:
        os.pwrite(self._fd(path, file_size), data, rel)

    def _commitlog_path(self, start: int) -> Path:
        return self.root / "commitlog" / f"{start:020d}"

    def _cq_path(self, topic: str, queue_id: int, byte: int) -> tuple[Path, int]:
        start = byte - byte % self.cq_file_bytes
        return self.root / "consumequeue" / topic / str(queue_id) / f"{start:020d}", byte - start

    # --- appending -----------------------------------------------------------

    def append(self, msg: Message, *, cq_tags_code: int | None = None) -> Appended:
        """Append ``msg`` (its queue offset and physical offset are assigned
        here) and its ConsumeQueue entry."""
        queue_offset = self.next_queue_offset(msg.topic, msg.queue_id)
        # Offsets do not change the size: encode once, patch them in below.
        data = bytearray(encode_record(msg))
        size = len(data)
        file_start = self.position - self.position % self.commitlog_file_size
        rel = self.position - file_start
        if size > self.commitlog_file_size - BLANK_LENGTH:
            raise ValueError(f"record of {size} bytes does not fit a CommitLog file of {self.commitlog_file_size}")
        if rel + size + BLANK_LENGTH > self.commitlog_file_size:
            # The broker keeps room for the filler after the last record.
            remaining = self.commitlog_file_size - rel
            old = self._commitlog_path(file_start)
            self._write(old, self.commitlog_file_size, rel, encode_blank(remaining))
            os.close(self._fds.pop(old))
            self.position = file_start + self.commitlog_file_size
            file_start, rel = self.position, 0
        physical = self.position
        _OFFSETS.pack_into(data, _OFFSETS_AT, queue_offset, physical)
        self._write(self._commitlog_path(file_start), self.commitlog_file_size, rel, data)
        self.position += size
        tags = cq_tags_code if cq_tags_code is not None else tags_code(msg.properties.get("TAGS"))
        path, cq_rel = self._cq_path(msg.topic, msg.queue_id, queue_offset * CQ_ENTRY_SIZE)
        self._write(path, self.cq_file_bytes, cq_rel, CQ_ENTRY.pack(physical, size, tags))
        self._next_queue_offset[(msg.topic, msg.queue_id)] = queue_offset + 1
        self._register_topic(msg.topic, msg.queue_id)
        return Appended(msg.topic, msg.queue_id, queue_offset, physical, size)

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
        for off in range(first_file // CQ_ENTRY_SIZE, start_offset):
            path, rel = self._cq_path(topic, queue_id, off * CQ_ENTRY_SIZE)
            self._write(path, self.cq_file_bytes, rel, CQ_ENTRY.pack(0, CQ_FILLER_SIZE, 0))
        if start_offset * CQ_ENTRY_SIZE == first_file:
            self._fd(self._cq_path(topic, queue_id, first_file)[0], self.cq_file_bytes)
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
        now = int(time.time() * 1000)
        data = struct.pack(">qqqqq", now, now, now, self.position, confirm_offset).ljust(4096, b"\0")
        path = self.root / "checkpoint"
        tmp = path.with_name("checkpoint.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)

    def flush(self) -> None:
        for fd in self._fds.values():
            os.fsync(fd)

    def close(self) -> None:
        if self.fsync:
            self.flush()
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
