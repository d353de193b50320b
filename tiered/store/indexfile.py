"""The broker's message index (``store/index/``): write it, and look keys up
as the broker does.

RocketMQ's ``IndexService`` (5.3.3) keeps a chain of files named by their
creation time, ``yyyyMMddHHmmssSSS`` in the broker's local time zone, each of
``40 + 4 * maxHashSlotNum + 20 * maxIndexNum`` bytes (defaults 5,000,000 and
20,000,000: 420,000,040 bytes, written sparse here). All numbers big-endian:

- header, 40 bytes (``HEADER``): beginTimestamp, endTimestamp (store times,
  ms), beginPhyOffset, endPhyOffset (CommitLog offsets), hashSlotCount (slots
  in use), indexCount (next entry number; entry 0 is never used, so a file
  holds ``maxIndexNum - 1`` entries and is full when indexCount reaches it);
- ``maxHashSlotNum`` slots of 4 bytes (``SLOT``): the newest entry number
  whose key hashes to the slot, 0 for none;
- ``maxIndexNum`` entries of 20 bytes (``ENTRY``): keyHash, phyOffset,
  timeDiff (seconds since the header's beginTimestamp, clamped to
  0..Integer.MAX_VALUE), and the entry number this one displaced from its
  slot, which chains every key of a slot newest first.

The key of an entry is ``topic + "#" + key``; its hash is Java's
``String.hashCode`` made non-negative by ``Math.abs`` (Integer.MIN_VALUE,
which ``abs`` leaves negative, becomes 0), and the slot is hash % slots.
Every dispatched CommitLog record except a transaction rollback is indexed:
first its ``UNIQ_KEY``, then each non-empty word of ``KEYS`` split on
spaces. When a file is full, the next one starts with the previous one's end
offset and time as its begin, and takes the keys still to be written.
"""

from __future__ import annotations

import mmap
import os
import sys
import time
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
import struct

from tiered.errors import CorruptRecordError

HEADER = struct.Struct(">qqqqii")
SLOT = struct.Struct(">i")
ENTRY = struct.Struct(">iqii")
HEADER_SIZE = HEADER.size  # 40
DEFAULT_HASH_SLOTS = 5_000_000  # MessageStoreConfig.maxHashSlotNum
DEFAULT_ENTRIES = 5_000_000 * 4  # MessageStoreConfig.maxIndexNum
DEFAULT_MAX_NUM = 64  # MessageStoreConfig.maxMsgsNumBatch caps every query
KEY_SEPARATOR = " "
_INT_MAX = 0x7FFFFFFF
_TRANSACTION_MASK = 0xC
_TRANSACTION_ROLLBACK = 0xC
_FLUSH_BYTES = 4 << 20
_SLOT_CHUNK = 4096  # a page: a lone used slot costs one page of disk


def file_size(hash_slots: int, entries: int) -> int:
    return HEADER_SIZE + hash_slots * SLOT.size + entries * ENTRY.size


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode``: over UTF-16 code units, 32-bit signed."""
    units: Iterable[int]
    if text.isascii():
        units = text.encode("ascii")
    else:
        arr = array("H", text.encode("utf-16-le"))
        if sys.byteorder == "big":
            arr.byteswap()
        units = arr
    h = 0
    for unit in units:
        h = (31 * h + unit) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def key_hash(key: str) -> int:
    """``IndexFile.indexKeyHashMethod``: abs of the Java hash, MIN_VALUE as 0."""
    h = java_string_hash(key)
    return 0 if h == -(1 << 31) else abs(h)


def index_key(topic: str, key: str) -> str:
    return f"{topic}#{key}"


def file_name(timestamp_ms: int) -> str:
    """``UtilAll.timeMillisToHumanString``: local time, to the millisecond."""
    t = time.localtime(timestamp_ms // 1000)
    return time.strftime("%Y%m%d%H%M%S", t) + f"{timestamp_ms % 1000:03d}"


def record_keys(topic: str, properties: dict[str, str], sys_flag: int) -> list[str]:
    """The index keys the broker's ``IndexService.buildIndex`` puts for one
    record, in its order. Empty property values count as absent, as in
    ``MessageDecoder.string2messageProperties``."""
    if sys_flag & _TRANSACTION_MASK == _TRANSACTION_ROLLBACK:
        return []
    out = []
    uniq = properties.get("UNIQ_KEY")
    if uniq:
        out.append(index_key(topic, uniq))
    out.extend(index_key(topic, k) for k in properties.get("KEYS", "").split(KEY_SEPARATOR) if k)
    return out


@dataclass(frozen=True, kw_only=True, slots=True)
class IndexHeader:
    begin_timestamp: int
    end_timestamp: int
    begin_phy_offset: int
    end_phy_offset: int
    hash_slot_count: int
    index_count: int

    def pack(self) -> bytes:
        return HEADER.pack(self.begin_timestamp, self.end_timestamp, self.begin_phy_offset,
                           self.end_phy_offset, self.hash_slot_count, self.index_count)


@dataclass(frozen=True, kw_only=True, slots=True)
class WrittenFile:
    path: Path
    header: IndexHeader


# --- writing ------------------------------------------------------------------------


class _OpenFile:
    """One index file being filled: slots in memory, entries appended."""

    def __init__(self, path: Path, hash_slots: int, entries: int, end_phy: int, end_ts: int) -> None:
        self.path, self.hash_slots, self.entries = path, hash_slots, entries
        self.slots = array("i", bytes(SLOT.size * hash_slots))
        self.begin_ts = self.end_ts = end_ts if end_ts > 0 else 0
        self.begin_phy = self.end_phy = end_phy if end_phy > 0 else 0
        self.slot_count = 0
        self.count = 1
        self._buf = bytearray()
        self._buf_at = HEADER_SIZE + hash_slots * SLOT.size + ENTRY.size  # entry 1
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        os.ftruncate(self._fd, file_size(hash_slots, entries))  # sparse: only written ranges take disk

    @property
    def full(self) -> bool:
        return self.count >= self.entries

    def put(self, key: str, phy: int, store_ts: int) -> bool:
        """``IndexFile.putKey``: False when the file is full."""
        if self.full:
            return False
        h = key_hash(key)
        slot = h % self.hash_slots
        prev = self.slots[slot]
        if prev <= 0 or prev > self.count:
            prev = 0
        diff = (store_ts - self.begin_ts) // 1000 if store_ts >= self.begin_ts else 0
        if self.begin_ts <= 0:
            diff = 0
        self._buf += ENTRY.pack(h, phy, min(diff, _INT_MAX), prev)
        if len(self._buf) >= _FLUSH_BYTES:
            self._flush_entries()
        self.slots[slot] = self.count
        if self.count <= 1:
            self.begin_phy, self.begin_ts = phy, store_ts
        if prev == 0:
            self.slot_count += 1
        self.count += 1
        self.end_phy, self.end_ts = phy, store_ts
        return True

    def _flush_entries(self) -> None:
        os.pwrite(self._fd, self._buf, self._buf_at)
        self._buf_at += len(self._buf)
        self._buf.clear()

    def header(self) -> IndexHeader:
        return IndexHeader(begin_timestamp=self.begin_ts, end_timestamp=self.end_ts,
                           begin_phy_offset=self.begin_phy, end_phy_offset=self.end_phy,
                           hash_slot_count=self.slot_count, index_count=self.count)

    def close(self) -> WrittenFile:
        self._flush_entries()
        slots = array("i", self.slots)
        if sys.byteorder == "little":
            slots.byteswap()
        raw = memoryview(slots).cast("B")
        zero = bytes(_SLOT_CHUNK)
        for lo in range(0, len(raw), _SLOT_CHUNK):
            chunk = raw[lo:lo + _SLOT_CHUNK]
            if chunk != zero[:len(chunk)]:  # untouched slot pages stay holes
                os.pwrite(self._fd, chunk, HEADER_SIZE + lo)
        header = self.header()
        os.pwrite(self._fd, header.pack(), 0)
        os.fsync(self._fd)
        os.close(self._fd)
        return WrittenFile(path=self.path, header=header)


class IndexWriter:
    """Writes an ``index/`` directory as ``IndexService.buildIndex`` would
    have for the records given in CommitLog order. File names come from the
    store time of each file's first entry (strictly increasing), standing for
    the time the broker would have created it."""

    def __init__(self, directory: Path, *, hash_slots: int = DEFAULT_HASH_SLOTS,
                 entries: int = DEFAULT_ENTRIES) -> None:
        if hash_slots < 1 or entries < 2:
            raise ValueError("an index file needs at least 1 hash slot and 2 entries (entry 0 is never used)")
        self.directory, self.hash_slots, self.entries = directory, hash_slots, entries
        self.written: list[WrittenFile] = []
        self._file: _OpenFile | None = None
        self._last_name = ""

    def _next_file(self, store_ts: int) -> _OpenFile:
        prev = self._file
        end_phy = end_ts = 0
        if prev is not None:
            self.written.append(prev.close())
            end_phy, end_ts = prev.end_phy, prev.end_ts
        self.directory.mkdir(parents=True, exist_ok=True)
        ms = store_ts
        name = file_name(ms)
        while name <= self._last_name:
            ms += 1
            name = file_name(ms)
        self._last_name = name
        self._file = _OpenFile(self.directory / name, self.hash_slots, self.entries, end_phy, end_ts)
        return self._file

    def add(self, *, topic: str, properties: dict[str, str], sys_flag: int, phy: int, store_ts: int) -> int:
        """Index one record at CommitLog offset ``phy``; returns keys written."""
        f = self._file
        if f is None or f.full:  # buildIndex gets (or starts) the file before looking at the record
            f = self._next_file(store_ts)
        if phy < f.end_phy:
            return 0  # what the last file already covers
        keys = record_keys(topic, properties, sys_flag)
        for key in keys:
            while not f.put(key, phy, store_ts):
                f = self._next_file(store_ts)
        return len(keys)

    def close(self) -> list[WrittenFile]:
        if self._file is not None:
            self.written.append(self._file.close())
            self._file = None
        return self.written

    @property
    def end_timestamp(self) -> int:
        """Store time of the last entry of the last closed file (0 if none)."""
        return self.written[-1].header.end_timestamp if self.written else 0


# --- reading ------------------------------------------------------------------------


class IndexFile:
    """One index file read as ``IndexFile.selectPhyOffset`` reads it; the
    slot and entry counts are the broker's configuration, not in the file."""

    def __init__(self, path: Path, *, hash_slots: int = DEFAULT_HASH_SLOTS, entries: int = DEFAULT_ENTRIES) -> None:
        self.path, self.hash_slots, self.entries = path, hash_slots, entries
        expect = file_size(hash_slots, entries)
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size != expect:
                raise CorruptRecordError(str(path), min(size, expect),
                                         f"index file of {size} bytes, expected {expect} "
                                         f"({hash_slots} slots, {entries} entries)")
            self._map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        b_ts, e_ts, b_phy, e_phy, slot_count, count = HEADER.unpack_from(self._map, 0)
        self.header = IndexHeader(begin_timestamp=b_ts, end_timestamp=e_ts, begin_phy_offset=b_phy,
                                  end_phy_offset=e_phy, hash_slot_count=slot_count,
                                  index_count=count if count > 0 else 1)

    def close(self) -> None:
        self._map.close()

    def time_matched(self, begin: int, end: int) -> bool:
        b, e = self.header.begin_timestamp, self.header.end_timestamp
        return (begin < b and end > e) or b <= begin <= e or b <= end <= e

    def entry(self, number: int) -> tuple[int, int, int, int]:
        """(keyHash, phyOffset, timeDiff, prev) of entry ``number``."""
        return ENTRY.unpack_from(self._map, HEADER_SIZE + self.hash_slots * SLOT.size + number * ENTRY.size)

    def select(self, key: str, max_num: int, begin: int, end: int, found: list[int]) -> None:
        """Append to ``found`` the offsets of entries whose hash matches
        ``key`` and whose time is in [begin, end], newest first (hash
        collisions included, as the broker returns them)."""
        h = key_hash(key)
        count = self.header.index_count
        nxt = SLOT.unpack_from(self._map, HEADER_SIZE + (h % self.hash_slots) * SLOT.size)[0]
        if nxt <= 0 or nxt > count or count <= 1:
            return
        while len(found) < max_num:
            read_hash, phy, diff, prev = self.entry(nxt)
            if diff < 0:
                break
            when = self.header.begin_timestamp + diff * 1000
            if read_hash == h and begin <= when <= end:
                found.append(phy)
            if prev <= 0 or prev > count or prev == nxt or when < begin:
                break
            nxt = prev


def index_files(directory: Path) -> list[Path]:
    """The files ``IndexService.load`` opens, in its (name) order."""
    if not directory.is_dir():
        return []
    return sorted((p for p in directory.iterdir() if p.is_file()), key=lambda p: str(p))


def query_offsets(directory: Path, topic: str, key: str, *, max_num: int = DEFAULT_MAX_NUM, begin: int = 0,
                  end: int = (1 << 63) - 1, hash_slots: int = DEFAULT_HASH_SLOTS,
                  entries: int = DEFAULT_ENTRIES) -> list[int]:
    """``IndexService.queryOffset``: newest file first, at most ``max_num``
    (the broker caps it at maxMsgsNumBatch, 64) CommitLog offsets."""
    max_num = min(max_num, DEFAULT_MAX_NUM)
    found: list[int] = []
    for path in reversed(index_files(directory)):
        f = IndexFile(path, hash_slots=hash_slots, entries=entries)
        try:
            if f.time_matched(begin, end):
                f.select(index_key(topic, key), max_num, begin, end, found)
            if f.header.begin_timestamp < begin or len(found) >= max_num:
                break
        finally:
            f.close()
    return found


def iter_entries(f: IndexFile) -> Iterator[tuple[int, int, int, int]]:
    """Every written entry (1 .. indexCount-1) in write order."""
    for n in range(1, f.header.index_count):
        yield f.entry(n)


__all__ = ["DEFAULT_ENTRIES", "DEFAULT_HASH_SLOTS", "ENTRY", "HEADER", "IndexFile", "IndexHeader", "IndexWriter",
           "SLOT", "WrittenFile", "file_name", "file_size", "index_files", "index_key", "iter_entries",
           "java_string_hash", "key_hash", "query_offsets", "record_keys"]
