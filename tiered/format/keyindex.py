"""Per-segment key index and bloom filter, for lookups by KEYS and UNIQ_KEY.

Index object layout (big-endian)::

    header  "TKIX" | version u16 | reserved u16 | count u32 | q_start u64     (20 bytes)
    entries count x [key hash u64 | queue offset - q_start u32], sorted

The key hash (version 2) is ``hash_spans`` below: a 64-bit multiply-rotate
hash of the key's UTF-8 bytes, 8 at a time, with the SplitMix64 finalizer,
computed for a whole segment's keys at once with numpy. Version 1 indexes
(the first 8 bytes of BLAKE2b, one call per key) stay readable. A hash hit
is a candidate only: the reader checks the record's keys, so collisions
cost a read, never a wrong answer.

The bloom filter travels in the manifest (base64: k u8 | bit array), so a
lookup skips segments that cannot hold the key without reading anything.
Its bit positions are ``h1 + i * h2 (mod m)`` for i < k, with h1 and h2 the
low and high halves of the version 2 key hash, marked by the top bit of the
k byte; filters written before (top bit clear) took h1 and h2 from a
separate BLAKE2b and stay readable. Its size is capped (``MAX_BLOOM_BYTES``);
a huge segment's filter only gets less selective, never wrong.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import math
import struct
from bisect import bisect_left
from collections.abc import Iterable
from types import ModuleType

import numpy as np

from tiered import native
from tiered.format.batch import gather, join_spans
from tiered.errors import BadProperties, CorruptRecordError
from tiered.format.segbuffer import SegmentBuffer

log = logging.getLogger(__name__)

MAGIC = b"TKIX"
VERSION = 2
_HEADER = struct.Struct(">4sHHIQ")
_ENTRY = struct.Struct(">QI")
_ENTRY_DTYPE = np.dtype([("hash", ">u8"), ("rel", ">u4")])
MAX_BLOOM_BYTES = 16 * 1024
BITS_PER_KEY = 10
_FROM_KEY_HASH = 0x80  # in the bloom's k byte: positions from the version 2 key hash

_U64 = np.uint64
_SEED = _U64(0xC2B2AE3D27D4EB4F)
_LEN_MUL = _U64(0x9E3779B97F4A7C15)
_WORD_MUL = _U64(0x87C37B91114253D5)
_ROUND_MUL = _U64(0x4CF5AD432745937F)
_FIN1 = _U64(0xBF58476D1CE4E5B9)
_FIN2 = _U64(0x94D049BB133111EB)


def _rotl31(h: np.ndarray) -> np.ndarray:
    return (h << _U64(31)) | (h >> _U64(33))


def hash_spans(buf: bytes, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The version 2 key hash of each ``buf[starts[i]:ends[i]]``, as uint64.

    h = len * C0 ^ SEED; for each little-endian 8-byte word w (the last one
    zero-padded): h = rotl(h ^ w * C1, 31) * C2; then SplitMix64's finalizer.
    All arithmetic mod 2**64. Keys are processed in groups of equal word
    count, each group as one array.
    """
    starts = np.asarray(starts, np.int64)
    lengths = np.asarray(ends, np.int64) - starts
    out = np.empty(len(starts), _U64)
    if not len(starts):
        return out
    words = (lengths + 7) // 8
    width = int(words.max()) * 8
    padded = buf + bytes(width)
    h0 = (lengths.astype(_U64) * _LEN_MUL) ^ _SEED
    with np.errstate(over="ignore"):
        for w in np.flatnonzero(np.bincount(words)).tolist():  # np.unique would import numpy.ma
            group = np.flatnonzero(words == w)
            h = h0[group]
            if w:
                block = gather(padded, np.dtype(f"V{8 * w}"), starts[group]).view(np.uint8).reshape(len(group), 8 * w)
                block[np.arange(8 * w)[None, :] >= lengths[group][:, None]] = 0  # bytes past the key
                cols = block.view("<u8").astype(_U64)
                for j in range(w):
                    h = _rotl31(h ^ (cols[:, j] * _WORD_MUL)) * _ROUND_MUL
            h ^= h >> _U64(30)
            h *= _FIN1
            h ^= h >> _U64(27)
            h *= _FIN2
            h ^= h >> _U64(31)
            out[group] = h
    return out


_KEYS, _UNIQ = np.void(b"KEYS\x01"), np.void(b"UNIQ_KEY\x01")


def batch_keys(
    buf: bytes | memoryview | SegmentBuffer, starts: np.ndarray, ends: np.ndarray
) -> tuple[np.ndarray, bytes, np.ndarray, np.ndarray]:
    """The keys records are indexed by, given their properties
    ``buf[starts[i]:ends[i]]``, read as ``Record.keys`` and
    ``Record.unique_key`` read them: each space-separated KEYS entry and the
    UNIQ_KEY, the last occurrence of a property counting. Returns (record
    index, buffer, start, end) arrays: key j is ``buffer[start[j]:end[j]]``,
    of record ``record[j]``.

    Properties are ``name \x01 value \x02 ...``: the records' are joined
    behind one more \x02, so every property starts after a \x02 and every
    value ends at the next one; all the rest is array work. Raises
    BadProperties for the first record whose properties are not UTF-8.
    """
    blob = join_spans(buf, starts, ends, b"\x02")
    lengths = ends - starts + 1
    bounds = np.cumsum(lengths) - lengths  # the separator before record i's properties
    if not blob.isascii():
        try:
            blob.decode("utf-8")  # the separators are ASCII: valid as a whole iff each is
        except UnicodeDecodeError as exc:
            i = int(np.searchsorted(bounds, exc.start, side="right")) - 1
            raise BadProperties(i, exc.start - int(bounds[i]) - 1) from None
    padded = blob + bytes(9)
    seps = np.flatnonzero(np.frombuffer(blob, np.uint8) == 2)
    is_keys = gather(padded, _KEYS.dtype, seps + 1) == _KEYS
    hit = is_keys | (gather(padded, _UNIQ.dtype, seps + 1) == _UNIQ)
    named, is_keys = seps[hit], is_keys[hit]
    empty = np.zeros(0, np.int64)
    if not len(named):
        return empty, blob, empty, empty
    owners = np.searchsorted(bounds, named, side="right") - 1
    # the last occurrence of each (record, name) wins, as in a dict of properties
    slots = owners * 2 + is_keys
    last = np.sort(len(slots) - 1 - np.unique(slots[::-1], return_index=True)[1])
    named, is_keys, owners = named[last], is_keys[last], owners[last]
    value_at = named + 1 + np.where(is_keys, 5, 9)
    nxt = np.searchsorted(seps, value_at)  # the separator ending the value, if any
    value_end = np.where(nxt < len(seps), seps[np.minimum(nxt, len(seps) - 1)], len(blob))
    # KEYS: split at spaces; an empty piece is no key
    k_at, k_end, k_owner = value_at[is_keys], value_end[is_keys], owners[is_keys]
    spaces = np.flatnonzero(np.frombuffer(blob, np.uint8) == 0x20)
    if len(spaces) and len(k_at):
        inside = np.searchsorted(k_at, spaces, side="right") - 1
        spaces = spaces[(inside >= 0) & (spaces < k_end[np.maximum(inside, 0)])]
        k_at, k_end = np.sort(np.concatenate((k_at, spaces + 1))), np.sort(np.concatenate((k_end, spaces)))
        k_owner = owners[is_keys][np.searchsorted(value_at[is_keys], k_at, side="right") - 1]
    u = ~is_keys
    key_at, key_end = np.concatenate((k_at, value_at[u])), np.concatenate((k_end, value_end[u]))
    key_owner = np.concatenate((k_owner, owners[u]))
    nonempty = key_end > key_at
    return key_owner[nonempty], blob, key_at[nonempty], key_end[nonempty]


_PINNED = {b"": 0x68850AC74E2E5A26, b"order-42": 0x2201ABFBC998EB3F,
           b"C0A8000100002A9F0000000000000001": 0x62CD0353630F83DA}


def _checked(core: ModuleType | None) -> ModuleType | None:
    """The native core when its key hash gives the format's pinned values
    (tests/format/test_keyindex.py); None (the numpy path) otherwise: a key
    index hashed wrong would answer lookups wrong."""
    if core is not None and [core.key_hash(k) for k in _PINNED] != list(_PINNED.values()):
        log.warning("the native core's key hash disagrees with the format's: using the numpy path")
        return None
    return core


# the native core's key scan (tiered/_native_keys.c), or None: numpy
_native = _checked(native.core)


def record_key_hashes(
    buf: bytes | bytearray | memoryview | SegmentBuffer, starts: np.ndarray, ends: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The keys of records whose properties are ``buf[starts[i]:ends[i]]``
    (as ``batch_keys`` finds them), hashed: (record index int64, version 2
    key hash uint64), in ``batch_keys``' order. Raises BadProperties for the
    first record whose properties are not UTF-8. Compiled (tiered/_native_keys.c)
    where the install built it, else numpy; the two agree exactly
    (tests/format/test_keyscan.py)."""
    if _native is None:
        return record_key_hashes_numpy(buf, starts, ends)
    owners, hashes, bad, at = _native.keys(buf, np.ascontiguousarray(starts, np.int64),
                                           np.ascontiguousarray(ends, np.int64))
    if bad >= 0:
        raise BadProperties(bad, at)
    return np.frombuffer(owners, np.int64), np.frombuffer(hashes, _U64)


def record_key_hashes_numpy(
    buf: bytes | bytearray | memoryview | SegmentBuffer, starts: np.ndarray, ends: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``record_key_hashes`` with numpy only (installs without a compiler)."""
    owners, blob, key_at, key_end = batch_keys(buf, starts, ends)
    return owners, hash_spans(blob, key_at, key_end)


def key_hash(key: str, version: int = VERSION) -> int:
    raw = key.encode("utf-8")
    if version == 1:
        return int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "big")
    if _native is not None:
        return _native.key_hash(raw)
    return int(hash_spans(raw, np.zeros(1, np.int64), np.array([len(raw)], np.int64))[0])


def key_hashes(keys: Iterable[str]) -> np.ndarray:
    """``key_hash`` of many keys at once."""
    encoded = [key.encode("utf-8") for key in keys]
    lengths = np.fromiter(map(len, encoded), np.int64, len(encoded))
    ends = np.cumsum(lengths)
    return hash_spans(b"".join(encoded), ends - lengths, ends)


def _legacy_positions(key: str, m: int, k: int) -> Iterable[int]:
    d = hashlib.blake2b(key.encode("utf-8"), digest_size=16, person=b"tiered-bloom").digest()
    h1 = int.from_bytes(d[:8], "big")
    h2 = int.from_bytes(d[8:], "big") | 1
    return ((h1 + i * h2) % m for i in range(k))


def _positions(hashes: np.ndarray, m: int, k: int) -> np.ndarray:
    h1 = hashes & _U64(0xFFFFFFFF)
    h2 = (hashes >> _U64(32)) | _U64(1)
    return (h1[:, None] + np.arange(k, dtype=_U64)[None, :] * h2[:, None]) % _U64(m)


# A segment indexed but holding no key: a filter with no bit set answers
# "certainly not" for every key, so lookups skip it instead of scanning it
# like an old, unindexed segment.
EMPTY_BLOOM = base64.b64encode(bytes([1]) + bytes(8)).decode("ascii")


def build_bloom(keys: Iterable[str]) -> str:
    return bloom_of_hashes(key_hashes(keys))


def bloom_of_hashes(hashes: np.ndarray) -> str:
    """The bloom filter of the keys with these version 2 key hashes."""
    unique = np.unique(hashes)
    if not len(unique):
        return EMPTY_BLOOM
    nbytes = min(MAX_BLOOM_BYTES, max(8, math.ceil(len(unique) * BITS_PER_KEY / 8)))
    m = nbytes * 8
    k = max(1, min(10, round(m / len(unique) * math.log(2))))
    bits = np.zeros(m, dtype=bool)
    bits[_positions(unique, m, k).ravel()] = True
    return base64.b64encode(bytes([k | _FROM_KEY_HASH]) + np.packbits(bits, bitorder="little").tobytes()).decode("ascii")


def bloom_may_contain(bloom: str | None, key: str) -> bool:
    """False only when the segment certainly holds no such key. A segment
    without a bloom (older archives) may hold anything."""
    if not bloom:
        return True
    raw = base64.b64decode(bloom)
    k, bits = raw[0], raw[1:]
    m = len(bits) * 8
    if k & _FROM_KEY_HASH:
        positions = _positions(np.array([key_hash(key)], _U64), m, k & ~_FROM_KEY_HASH)[0].tolist()
    else:
        positions = _legacy_positions(key, m, k)
    return all(bits[p >> 3] & (1 << (p & 7)) for p in positions)


def build_index(q_start: int, keys_by_offset: Iterable[tuple[int, Iterable[str]]]) -> bytes:
    rel: list[int] = []
    keys: list[str] = []
    for off, ks in keys_by_offset:
        for key in ks:
            rel.append(off - q_start)
            keys.append(key)
    return index_of_hashes(q_start, np.array(rel, _U64), key_hashes(keys))


def index_of_hashes(q_start: int, rel_offsets: np.ndarray, hashes: np.ndarray) -> bytes:
    """The index object of (version 2 key hash, queue offset - ``q_start``) pairs."""
    hashes, rel_offsets = hashes.astype(_U64), rel_offsets.astype(_U64)
    order = np.lexsort((rel_offsets, hashes))  # by hash, then offset
    hashes, rel_offsets = hashes[order], rel_offsets[order]
    keep = np.ones(len(order), bool)
    keep[1:] = (hashes[1:] != hashes[:-1]) | (rel_offsets[1:] != rel_offsets[:-1])  # a key twice in a record
    out = np.empty(int(keep.sum()), _ENTRY_DTYPE)
    out["hash"] = hashes[keep]
    out["rel"] = rel_offsets[keep]
    return _HEADER.pack(MAGIC, VERSION, 0, len(out), q_start) + out.tobytes()


def lookup(index: bytes, key: str, source: str = "<index>") -> list[int]:
    """Queue offsets whose record may hold ``key`` (hash matches)."""
    if len(index) < _HEADER.size:
        raise CorruptRecordError(source, 0, "key index shorter than its header")
    magic, version, _, count, q_start = _HEADER.unpack_from(index, 0)
    if magic != MAGIC or not 1 <= version <= VERSION:
        raise CorruptRecordError(source, 0, f"not a key index (magic {magic!r}, version {version})")
    if len(index) != _HEADER.size + count * _ENTRY.size:
        raise CorruptRecordError(source, _HEADER.size, f"key index of {count} entries has {len(index)} bytes")
    h = key_hash(key, version)
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
