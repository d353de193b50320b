"""Per-segment key index and bloom filter, for lookups by KEYS and UNIQ_KEY.

Index object layout (big-endian)::

    header  "TKIX" | version u16 | reserved u16 | count u32 | q_start u64     (20 bytes)
    entries count x [key hash u64 | queue offset - q_start u32], sorted

The key hash is the first 8 bytes of BLAKE2b(key): stable across processes
and machines (Python's ``hash`` is not). A hash hit is a candidate only:
the reader checks the record's keys, so collisions cost a read, never a
wrong answer.

The bloom filter travels in the manifest (base64: k u8 | bit array), so a
lookup skips segments that cannot hold the key without reading anything.
Its size is capped (``MAX_BLOOM_BYTES``); a huge segment's filter only gets
less selective, never wrong.
"""

from __future__ import annotations

import base64
import hashlib
import math
import struct
from collections.abc import Iterable
from bisect import bisect_left

from tiered.errors import CorruptRecordError

MAGIC = b"TKIX"
VERSION = 1
_HEADER = struct.Struct(">4sHHIQ")
_ENTRY = struct.Struct(">QI")
MAX_BLOOM_BYTES = 16 * 1024
BITS_PER_KEY = 10


def key_hash(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "big")


def _positions(key: str, m: int, k: int) -> Iterable[int]:
    d = hashlib.blake2b(key.encode("utf-8"), digest_size=16, person=b"tiered-bloom").digest()
    h1 = int.from_bytes(d[:8], "big")
    h2 = int.from_bytes(d[8:], "big") | 1
    return ((h1 + i * h2) % m for i in range(k))


# A segment indexed but holding no key: a filter with no bit set answers
# "certainly not" for every key, so lookups skip it instead of scanning it
# like an old, unindexed segment.
EMPTY_BLOOM = base64.b64encode(bytes([1]) + bytes(8)).decode("ascii")


def build_bloom(keys: Iterable[str]) -> str:
    unique = set(keys)
    if not unique:
        return EMPTY_BLOOM
    nbytes = min(MAX_BLOOM_BYTES, max(8, math.ceil(len(unique) * BITS_PER_KEY / 8)))
    m = nbytes * 8
    k = max(1, min(10, round(m / len(unique) * math.log(2))))
    bits = bytearray(nbytes)
    for key in unique:
        for p in _positions(key, m, k):
            bits[p >> 3] |= 1 << (p & 7)
    return base64.b64encode(bytes([k]) + bits).decode("ascii")


def bloom_may_contain(bloom: str | None, key: str) -> bool:
    """False only when the segment certainly holds no such key. A segment
    without a bloom (older archives) may hold anything."""
    if not bloom:
        return True
    raw = base64.b64decode(bloom)
    k, bits = raw[0], raw[1:]
    m = len(bits) * 8
    return all(bits[p >> 3] & (1 << (p & 7)) for p in _positions(key, m, k))


def build_index(q_start: int, keys_by_offset: Iterable[tuple[int, Iterable[str]]]) -> bytes:
    entries = sorted({(key_hash(key), off - q_start) for off, keys in keys_by_offset for key in keys})
    out = bytearray(_HEADER.pack(MAGIC, VERSION, 0, len(entries), q_start))
    for h, rel in entries:
        out += _ENTRY.pack(h, rel)
    return bytes(out)


def lookup(index: bytes, key: str, source: str = "<index>") -> list[int]:
    """Queue offsets whose record may hold ``key`` (hash matches)."""
    if len(index) < _HEADER.size:
        raise CorruptRecordError(source, 0, "key index shorter than its header")
    magic, version, _, count, q_start = _HEADER.unpack_from(index, 0)
    if magic != MAGIC or version > VERSION:
        raise CorruptRecordError(source, 0, f"not a key index (magic {magic!r}, version {version})")
    if len(index) != _HEADER.size + count * _ENTRY.size:
        raise CorruptRecordError(source, _HEADER.size, f"key index of {count} entries has {len(index)} bytes")
    h = key_hash(key)
    hashes = _HashView(index, count)
    i = bisect_left(hashes, h)
    out = []
    while i < count:
        eh, rel = _ENTRY.unpack_from(index, _HEADER.size + i * _ENTRY.size)
        if eh != h:
            break
        out.append(q_start + rel)
        i += 1
    return out


class _HashView:
    """The sorted hash column, indexable for ``bisect`` without copying."""

    def __init__(self, index: bytes, count: int) -> None:
        self.index = index
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> int:
        return _ENTRY.unpack_from(self.index, _HEADER.size + i * _ENTRY.size)[0]
