"""Segment layouts, and the one place readers reach a segment's parts through.

Layout v1 (manifest format 1.x): three objects per segment, each part its
own object (tiered/archive/manifest.py ``segment_keys``)::

    commitlog/{clStart:020d}-{clEnd:020d}       records, byte-identical
    consumequeue/{qStart:020d}-{qEnd:020d}      entries, then the descriptor trailer
    index/{qStart:020d}-{qEnd:020d}             key index (optional)

Layout v2 (manifest format 2.x): ONE object per segment, so a segment costs
one PUT plus the commit::

    segment/{qStart:020d}-{qEnd:020d}.{clStart:020d}-{clEnd:020d}[.zst]

    records      cl_end - cl_start bytes, byte-identical (a record's cold
                 CommitLog offset minus cl_start is its position here)
    entries      messages x 20 bytes, the cold ConsumeQueue
    key index    tiered/format/keyindex.py format, possibly empty
    descriptor   + footer, as in tiered/archive/segmeta.py (descriptor version 2)

With ``.zst`` the whole payload above is one zstd frame (``compression:
zstd``): offsets below always mean offsets into the decompressed payload.

A segment object may also *carry* manifest chunks (tiered/archive/chunks.py):
the chunks its commit sealed, read by the head with one ranged GET, so they
are never compressed. Uncompressed, they are a section between the key
index and the descriptor; with ``.zst`` they are a zstd *skippable frame*
(RFC 8878 3.1.2: magic 0x184D2A50, length, bytes every zstd decoder skips)
in front of the compressed frame, at stored offset 8. Their place is in the
descriptor and in the head's chunk references (offsets in the object as
stored).

A v2 segment's ``commitlog_key``, ``consumequeue_key`` and ``index_key`` in
the manifest are *sections* of that object, written ``{object}#{at}+{length}``.
Readers never parse them: ``read_range`` and ``read_part`` take a v1 key or a
section alike, so the reader, the scan and Spark read both layouts through
the same two calls (tiered/query/reader.py ``get_range``/``get_object``). A key
with ``#`` is v2; "#" never appears in a v1 key (offsets are digits).
"""

from __future__ import annotations

import struct
import threading
from collections import OrderedDict

from tiered.errors import CorruptRecordError
from tiered.archive.storage import ObjectStore

LAYOUT_V1 = 1
LAYOUT_V2 = 2
COMPRESSIONS = ("none", "zstd")
ZSTD_SUFFIX = ".zst"
_SECTION = "#"


def segment_object_key(prefix: str, q_start: int, q_end: int, cl_start: int, cl_end: int,
                       *, compression: str = "none") -> str:
    suffix = ZSTD_SUFFIX if compression == "zstd" else ""
    return f"{prefix}/segment/{q_start:020d}-{q_end:020d}.{cl_start:020d}-{cl_end:020d}{suffix}"


def section_key(obj: str, at: int, length: int) -> str:
    return f"{obj}{_SECTION}{at}+{length}"


def section_keys(obj: str, records: int, entries: int, index: int | None) -> tuple[str, str, str | None]:
    """(commitlog, consumequeue, index) keys of a v2 segment whose parts have these lengths."""
    ix = section_key(obj, records + entries, index) if index is not None else None
    return section_key(obj, 0, records), section_key(obj, records, entries), ix


def split(key: str) -> tuple[str, int, int | None]:
    """(object key, start of the part in the payload, its length or None for
    the whole object). Raises CorruptRecordError for a malformed section."""
    obj, sep, where = key.partition(_SECTION)
    if not sep:
        return key, 0, None
    at, plus, length = where.partition("+")
    if not (plus and at.isdigit() and length.isdigit()):
        raise CorruptRecordError(key, 0, "malformed segment section key (want object#at+length)")
    return obj, int(at), int(length)


def object_of(key: str) -> str:
    """The stored object a manifest key lives in (itself for v1)."""
    return key.partition(_SECTION)[0]


def is_v2(key: str) -> bool:
    return _SECTION in key


def compressed(obj: str) -> bool:
    return obj.endswith(ZSTD_SUFFIX)


# a zstd skippable frame's header: magic (0x184D2A50..5F), length; little-endian
SKIPPABLE = struct.Struct("<II")
SKIPPABLE_MAGIC = 0x184D2A50
CARRIED_AT_ZSTD = SKIPPABLE.size  # where a compressed object's carried chunks start


def compress(payload: bytes | bytearray, *, carried: bytes = b"") -> bytes:
    """One zstd frame of ``payload``; ``carried`` bytes in a skippable frame
    in front of it, uncompressed (offset ``CARRIED_AT_ZSTD``)."""
    import zstandard

    # level 3: zstd's default, about 300 MB/s per core; cold data is written once
    frame = zstandard.ZstdCompressor(level=3, write_content_size=True).compress(bytes(payload))
    if not carried:
        return frame
    return SKIPPABLE.pack(SKIPPABLE_MAGIC, len(carried)) + carried + frame


def decompress(data: bytes | memoryview, obj: str) -> bytes:
    """The payload of a compressed object (skippable frames in front of its
    frame, carried chunks, skipped as any zstd decoder does)."""
    import zstandard

    view = memoryview(data)
    at = 0
    while len(view) - at >= SKIPPABLE.size:
        magic, length = SKIPPABLE.unpack_from(view, at)
        if magic & 0xFFFFFFF0 != SKIPPABLE_MAGIC:
            break
        at += SKIPPABLE.size + length
    if at > len(view):
        raise CorruptRecordError(obj, 0, f"skippable frame runs past the object's end ({len(view)} bytes)")
    try:
        return zstandard.ZstdDecompressor().decompress(view[at:])
    except zstandard.ZstdError as exc:
        raise CorruptRecordError(obj, at, f"not a valid zstd frame: {exc}") from None


class _Inflated:
    """The last few decompressed objects. Objects are immutable and named by
    their content's range, so a cached payload never goes stale; a scan reads
    a compressed segment part by part and must not fetch it once per part."""

    def __init__(self, max_bytes: int = 256 << 20) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[tuple[str, str], bytes] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()

    def get(self, store: ObjectStore, obj: str) -> bytes:
        key = (store.url, obj)
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
                return hit
        payload = decompress(store.get(obj), obj)
        with self._lock:
            if key not in self._items and len(payload) <= self.max_bytes:
                self._items[key] = payload
                self._size += len(payload)
                while self._size > self.max_bytes:
                    _, old = self._items.popitem(last=False)
                    self._size -= len(old)
        return payload


_INFLATED = _Inflated()


def read_range(store: ObjectStore, key: str, start: int, end: int) -> bytes:
    """Bytes [start, end) of the part ``key`` names (a v1 object or a v2
    section); shorter when the part is (never bytes of the next section)."""
    obj, at, length = split(key)
    if length is not None:
        end = min(end, length)
    if end <= start:
        return b""
    if compressed(obj):
        return _INFLATED.get(store, obj)[at + start:at + end]
    return store.get_range(obj, at + start, at + end)


def read_part(store: ObjectStore, key: str) -> bytes:
    """The whole part ``key`` names."""
    obj, at, length = split(key)
    if compressed(obj):
        payload = _INFLATED.get(store, obj)
        return payload if length is None else payload[at:at + length]
    if length is None:
        return store.get(obj)
    return store.get_range(obj, at, at + length) if length else b""


def read_payload(store: ObjectStore, obj: str) -> bytes:
    """A v2 object's whole (decompressed) payload."""
    data = store.get(obj)
    return decompress(data, obj) if compressed(obj) else data
