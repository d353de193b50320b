"""Fuzzing: random, truncated and bit-flipped input to the codec and to the
reader (corrupt ConsumeQueue and CommitLog files on disk).

Only TieredError subclasses may escape -- never IndexError, struct.error,
UnicodeDecodeError, ValueError, OverflowError -- and nothing hangs. Every
test is bounded (examples, deadline, a pytest timeout); the file runs in a
few seconds.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tiered.format.codec import (
    Host,
    MagicVersion,
    Message,
    Peek,
    Record,
    decode_and_check,
    decode_cq_entry,
    decode_properties,
    decode_record,
    encode_record,
    peek,
    tags_code,
)
from tiered.errors import TieredError
from tiered.store.localstore import LocalStore
from tiered.store.storewriter import StoreWriter

from nativekit import need_native

pytestmark = pytest.mark.timeout(120)

FUZZ = settings(max_examples=400, deadline=500, suppress_health_check=[HealthCheck.too_slow])
READER_FUZZ = settings(max_examples=120, deadline=2000, suppress_health_check=[HealthCheck.too_slow])

SEEDS = [
    encode_record(Message(topic="TopicTest", queue_id=3, body=b"Hello RocketMQ",
                          properties={"TAGS": "TagA", "KEYS": "a b", "UNIQ_KEY": "U1"}, queue_offset=7,
                          physical_offset=1234, born_timestamp=1, store_timestamp=2)),
    encode_record(Message(topic="L" * 130, queue_id=0, body=bytes(range(256)), properties={"TAGS": "标签"})),
    encode_record(Message(topic="v6", queue_id=1, body=b"", born_host=Host("2001:db8::1", 7))),
    encode_record(Message(topic="v6v6", queue_id=1, body=b"xy", born_host=Host("::1", 1),
                          store_host=Host("fe80::2", 2), properties={"K": "v"})),
    encode_record(Message(topic="t", queue_id=0, body=b"", version=MagicVersion.V2)),
]


def only_tiered_errors(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except TieredError:
        return None


def _decode_all(data: bytes, position: int, verify_crc: bool) -> None:
    for buf in (memoryview(data), data):
        rec = only_tiered_errors(lambda: decode_record(buf, position, "fuzz", verify_crc=verify_crc))
        if rec is not None:
            only_tiered_errors(lambda: _touch(rec))


def _touch(rec: Record) -> None:
    rec.to_dict()
    rec.to_message()
    rec.body_bytes()
    repr(rec)
    bytes(rec.topic_raw), bytes(rec.properties_raw), rec.msg_id, rec.born_host, rec.store_host


@FUZZ
@given(st.binary(max_size=400), st.integers(-3, 420), st.booleans())
def test_decode_random_bytes(data: bytes, position: int, verify_crc: bool) -> None:
    _decode_all(data, position, verify_crc)
    only_tiered_errors(lambda: peek(memoryview(data), position, "fuzz"))


@FUZZ
@given(st.sampled_from(SEEDS), st.data())
def test_decode_truncated_records(seed: bytes, data: st.DataObject) -> None:
    cut = data.draw(st.integers(0, len(seed) - 1))
    _decode_all(seed[:cut], 0, True)
    only_tiered_errors(lambda: peek(memoryview(seed[:cut]), 0))


@FUZZ
@given(st.sampled_from(SEEDS), st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 7)), min_size=1, max_size=6),
       st.booleans())
def test_decode_bit_flipped_records(seed: bytes, flips: list[tuple[int, int]], verify_crc: bool) -> None:
    data = bytearray(seed)
    for at, bit in flips:
        data[at % len(data)] ^= 1 << bit
    _decode_all(bytes(data), 0, verify_crc)
    rec = decode_record(memoryview(seed), 0)
    only_tiered_errors(lambda: decode_and_check(
        memoryview(bytes(data)), 0, "fuzz", topic=bytes(rec.topic_raw), queue_id=rec.queue_id,
        queue_offset=rec.queue_offset, commitlog_offset=rec.physical_offset, size=rec.size, verify_crc=verify_crc))


EXTREMES = [0, 1, -1, 0x7F, 0x80, 0xFF, 0x7FFF, 0x8000, 0xFFFF, 0x7FFFFFFF, -0x80000000, 91, 90]


@FUZZ
@given(st.sampled_from(SEEDS), st.integers(0, 300), st.sampled_from([">b", ">B", ">h", ">H", ">i", ">I", ">q"]),
       st.sampled_from(EXTREMES))
def test_decode_records_with_extreme_fields(seed: bytes, at: int, fmt: str, value: int) -> None:
    data = bytearray(seed)
    width = struct.calcsize(fmt)
    at %= max(1, len(data) - width)
    try:
        struct.pack_into(fmt, data, at, value)
    except struct.error:
        assume(False)
    _decode_all(bytes(data), 0, True)
    _decode_all(bytes(data), 0, False)


@FUZZ
@given(st.binary(max_size=200), st.integers(0, 1000))
def test_decode_properties_random(data: bytes, offset: int) -> None:
    props = only_tiered_errors(lambda: decode_properties(data, "fuzz", offset))
    if props is not None:
        for value in props.values():
            tags_code(value)


@FUZZ
@given(st.binary(max_size=60), st.integers(-5, 70))
def test_decode_cq_entry_random(data: bytes, position: int) -> None:
    only_tiered_errors(lambda: decode_cq_entry(data, position))


# --- the reader over corrupt files on disk --------------------------------------------------------

FILE = 4096
CQ_PER_FILE = 6


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fuzz-template")
    with StoreWriter(root, commitlog_file_size=FILE, cq_entries_per_file=CQ_PER_FILE) as w:
        w.fill_queue_head("F", 0, 3)
        for i in range(30):
            w.put("T", i % 2, bytes([i]) * (i * 29 % 500), tags=f"t{i}", keys=["k"], store_timestamp=1000 + i)
            if i % 3 == 0:
                w.put("F", 0, b"f" * i, born_host=Host("::1", 9), store_timestamp=1000 + i)
    return root


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name.isdigit())


MUTATION = st.tuples(
    st.sampled_from(["flip", "byte", "zero", "truncate", "garbage_entry", "unlink"]),
    st.integers(0, 10**6),   # which file
    st.integers(0, 10**6),   # where
    st.integers(0, 255),     # value / length
)


def _mutate(root: Path, mutation: tuple[str, int, int, int], rnd: bytes) -> None:
    kind, which, where, value = mutation
    files = _files(root)
    path = files[which % len(files)]
    size = path.stat().st_size
    if size == 0:
        return
    at = where % size
    if kind == "unlink":
        path.unlink()
        return
    with open(path, "r+b") as fh:
        if kind == "flip":
            fh.seek(at)
            byte = fh.read(1)[0]
            fh.seek(at)
            fh.write(bytes([byte ^ (1 << (value % 8))]))
        elif kind == "byte":
            fh.seek(at)
            fh.write(bytes([value]))
        elif kind == "zero":
            fh.seek(at)
            fh.write(bytes(min(value * 4, size - at)))
        elif kind == "truncate":
            fh.truncate(at)
        elif kind == "garbage_entry" and "consumequeue" in path.parts:
            fh.seek(at - at % 20)
            fh.write((rnd * 20)[:20])


def _exercise(root: Path, timestamp: int, start: int) -> None:
    with LocalStore(root) as store:
        for topic, qid in only_tiered_errors(store.queues) or []:
            rng = only_tiered_errors(lambda: store.queue_range(topic, qid))
            for frm in ([rng.min_offset] if rng else []) + [0, start]:
                def run() -> int:
                    n = 0
                    for item in store.iter_queue(topic, qid, frm, max_count=100):
                        _touch(item.record)
                        n += 1
                    return n
                count = only_tiered_errors(run)
                assert count is None or count <= 100
            only_tiered_errors(lambda: store.find_offset(topic, qid, timestamp))
            only_tiered_errors(lambda: store.max_offset(topic, qid))
        only_tiered_errors(store.retention_hours)
        only_tiered_errors(store.confirmed_offset)


@READER_FUZZ
@given(st.lists(MUTATION, min_size=1, max_size=4), st.binary(min_size=1, max_size=20),
       st.integers(900, 1100), st.integers(0, 40))
def test_reader_over_corrupt_files(template: Path, mutations: list, rnd: bytes, timestamp: int, start: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "store"
        shutil.copytree(template, root)
        for mutation in mutations:
            _mutate(root, mutation, rnd)
        _exercise(root, timestamp, start)


@READER_FUZZ
@given(st.binary(max_size=100), st.integers(0, 40))
def test_reader_over_a_garbage_consumequeue_file(template: Path, garbage: bytes, start: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "store"
        shutil.copytree(template, root)
        cq = root / "consumequeue" / "T" / "0" / f"{CQ_PER_FILE * 20:020d}"
        cq.write_bytes(garbage)
        _exercise(root, 1010, start)


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)


@FUZZ
@given(st.one_of(st.binary(max_size=80), JSONISH.map(lambda v: json.dumps(v).encode()),
                 st.dictionaries(st.text(max_size=5), JSONISH, max_size=3).map(
                     lambda t: json.dumps({"topicConfigTable": t}).encode()),
                 st.dictionaries(st.text(max_size=5), JSONISH, max_size=3).map(
                     lambda a: json.dumps({"topicConfigTable": {"T": {"attributes": a}}}).encode())),
       st.one_of(st.none(), st.binary(max_size=40)))
def test_config_fuzz(main: bytes, bak: bytes | None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "config"
        config.mkdir()
        (config / "topics.json").write_bytes(main)
        if bak is not None:
            (config / "topics.json.bak").write_bytes(bak)
        store = LocalStore(tmp)
        hours = only_tiered_errors(store.retention_hours)
        if hours is not None:
            assert all(isinstance(h, float) and h > 0 for h in hours.values())
        only_tiered_errors(store.topic_configs)


def test_template_is_sound(template: Path) -> None:
    with LocalStore(template) as store:
        assert store.queue_range("T", 0).count == 15
        assert len(list(store.iter_queue("T", 0, 0))) == 15
        assert store.queue_range("F", 0).min_offset == 3
        assert len(list(store.iter_queue("F", 0, 3))) == 10
    assert os.path.isdir(template / "commitlog")


def test_peek_never_steps_backwards() -> None:
    # a writer recovering its position steps by peek's size: it must move forward
    for seed in SEEDS:
        for value in EXTREMES:
            data = bytearray(seed)
            struct.pack_into(">i", data, 0, value)
            result = only_tiered_errors(lambda: peek(memoryview(bytes(data)), 0))
            if result is not None and result[0] is not Peek.UNWRITTEN:
                assert result[1] >= 8


def _outcome(root: Path, topic: str, qid: int, frm: int) -> tuple[list[tuple[int, int, bytes]], Any]:
    """(queue offset, tags code, record bytes) of what iter_queue yields, and
    how it ended: None, or the error's type, file and offset."""
    got: list[tuple[int, int, bytes]] = []
    with LocalStore(root) as store:
        try:
            for item in store.iter_queue(topic, qid, frm):
                got.append((item.queue_offset, item.tags_code, bytes(item.record.raw)))
        except TieredError as exc:
            return got, (type(exc).__name__, getattr(exc, "source", None), getattr(exc, "offset", None))
    return got, None


@pytest.mark.parametrize("run_check", ["compiled", "numpy"])
@READER_FUZZ
@given(st.lists(MUTATION.filter(lambda m: m[0] != "unlink"), min_size=1, max_size=3), st.binary(min_size=1, max_size=20),
       st.integers(0, 12))
def test_batches_and_record_by_record_agree_on_corrupt_files(template: Path, run_check: str, mutations: list,
                                                             rnd: bytes, start: int) -> None:
    # the same reader with its fast path turned off is the reference: runs
    # checked at once (by the compiled loop, or by numpy where it is not
    # built) must yield the same records and stop with the same error
    import tiered.store.queuecursor as queuecursor
    from tiered.format import batch

    if run_check == "compiled":
        need_native()

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "store"
        shutil.copytree(template, root)
        for mutation in mutations:
            _mutate(root, mutation, rnd)
        for topic, qid in (("T", 0), ("T", 1), ("F", 0)):
            with mock.patch.object(batch, "_native", batch._native if run_check == "compiled" else None):
                fast = _outcome(root, topic, qid, start)
            with mock.patch.object(queuecursor, "check_run", lambda *a, **kw: None):
                slow = _outcome(root, topic, qid, start)
            assert fast == slow
