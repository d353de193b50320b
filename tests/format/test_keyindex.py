"""Key index and bloom filter formats: the vectorized hash, and archives
written before it (index version 1, BLAKE2b blooms) still answering."""

from __future__ import annotations

import base64
import hashlib
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiered.errors import CorruptRecordError
from tiered.format.keyindex import (
    EMPTY_BLOOM,
    bloom_may_contain,
    build_bloom,
    build_index,
    hash_spans,
    key_hash,
    key_hashes,
    lookup,
)

M64 = (1 << 64) - 1


def _reference_hash(raw: bytes) -> int:
    """The version 2 key hash written out with Python integers, word by word."""
    h = (len(raw) * 0x9E3779B97F4A7C15 ^ 0xC2B2AE3D27D4EB4F) & M64
    for i in range(0, len(raw), 8):
        w = int.from_bytes(raw[i:i + 8].ljust(8, b"\0"), "little")
        h ^= (w * 0x87C37B91114253D5) & M64
        h = ((h << 31) | (h >> 33)) & M64
        h = (h * 0x4CF5AD432745937F) & M64
    h ^= h >> 30
    h = (h * 0xBF58476D1CE4E5B9) & M64
    h ^= h >> 27
    h = (h * 0x94D049BB133111EB) & M64
    return h ^ (h >> 31)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=40), max_size=30))
def test_vectorized_hash_equals_the_definition(keys) -> None:  # noqa: ANN001
    expected = [_reference_hash(k.encode("utf-8")) for k in keys]
    assert key_hashes(keys).tolist() == expected
    assert [key_hash(k) for k in keys] == expected


def test_hash_of_spans_inside_a_buffer_ignores_the_bytes_around_them() -> None:
    buf = b"xxKEY-1yyyKEY-1zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz-long-key"
    h = hash_spans(buf, np.array([2, 10, 18]), np.array([7, 15, len(buf)]))
    assert h[0] == h[1] == _reference_hash(b"KEY-1")
    assert h[2] == _reference_hash(buf[18:])


def test_known_values_pin_the_format() -> None:
    # written into archives: a change here makes old indexes unreadable
    assert key_hash("") == 0x68850AC74E2E5A26
    assert key_hash("order-42") == 0x2201ABFBC998EB3F
    assert key_hash("C0A8000100002A9F0000000000000001") == 0x62CD0353630F83DA
    assert key_hash("order-42", version=1) == int.from_bytes(
        hashlib.blake2b(b"order-42", digest_size=8).digest(), "big")


def test_index_lookup_finds_every_offset_of_a_key() -> None:
    index = build_index(1000, [(1000, ["a", "b"]), (1001, ["a"]), (1005, ["c", "c"]), (1007, ["€uro"])])
    assert lookup(index, "a") == [1000, 1001]
    assert lookup(index, "b") == [1000]
    assert lookup(index, "c") == [1005]
    assert lookup(index, "€uro") == [1007]
    assert lookup(index, "missing") == []


def test_a_version_1_index_is_still_read() -> None:
    keys = {"k1": [10, 12], "k2": [11]}
    entries = sorted((int.from_bytes(hashlib.blake2b(k.encode(), digest_size=8).digest(), "big"), off - 10)
                     for k, offs in keys.items() for off in offs)
    v1 = struct.pack(">4sHHIQ", b"TKIX", 1, 0, len(entries), 10) + b"".join(
        struct.pack(">QI", h, rel) for h, rel in entries)
    assert lookup(v1, "k1") == [10, 12] and lookup(v1, "k2") == [11] and lookup(v1, "k3") == []


def test_a_newer_index_version_is_refused() -> None:
    index = bytearray(build_index(0, [(0, ["a"])]))
    index[4:6] = (3).to_bytes(2, "big")
    with pytest.raises(CorruptRecordError, match="version 3"):
        lookup(bytes(index), "a", "bucket/index/x")


def test_bloom_has_no_false_negatives_and_few_false_positives() -> None:
    keys = [f"key-{i}" for i in range(5000)]
    bloom = build_bloom(keys)
    assert all(bloom_may_contain(bloom, k) for k in keys)
    false = sum(bloom_may_contain(bloom, f"other-{i}") for i in range(20000))
    assert false < 20000 * 0.03  # 10 bits per key: ~1%
    assert not bloom_may_contain(EMPTY_BLOOM, "key-1") and bloom_may_contain(None, "anything")


def test_a_legacy_bloom_is_still_read() -> None:
    # the filter as written before positions came from the key hash
    keys = ["a", "b", "c"]
    m, k = 64, 7
    bits = bytearray(m // 8)
    for key in keys:
        d = hashlib.blake2b(key.encode(), digest_size=16, person=b"tiered-bloom").digest()
        h1, h2 = int.from_bytes(d[:8], "big"), int.from_bytes(d[8:], "big") | 1
        for i in range(k):
            p = (h1 + i * h2) % m
            bits[p >> 3] |= 1 << (p & 7)
    legacy = base64.b64encode(bytes([k]) + bits).decode()
    assert all(bloom_may_contain(legacy, key) for key in keys)
    assert sum(bloom_may_contain(legacy, f"x{i}") for i in range(1000)) < 1000
