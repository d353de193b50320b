"""A reader iterating queues while a writer appends in another process.

The reader must only ever see a consistent prefix of each queue (every
record complete and validated, offsets contiguous, never a half record), and
once the writer is done it must see everything, byte-equal to a fresh read
and to what the writer meant to write.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tiered.store.localstore import LocalStore

pytestmark = pytest.mark.timeout(120)

N = 3000
QUEUES = 3

WRITER = r"""
import hashlib, os, sys, time
from tiered.store.storewriter import StoreWriter
from tiered.format.codec import Host
root, n, queues = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with StoreWriter(root, commitlog_file_size=8192, cq_entries_per_file=37, preallocate=sys.argv[4] == "1") as w:
    for i in range(n):
        body = hashlib.sha256(b"%d" % i).digest() * (i % 40)
        host = Host("::1", 7) if i % 5 == 0 else Host("10.0.0.%d" % (i % 250), 9)
        w.put("T", i % queues, body, tags="t%d" % (i % 7), keys=["k%d" % i], store_timestamp=10**12 + i,
              born_host=host)
        if i % 97 == 0:
            time.sleep(0.002)  # let the reader catch up with the tail now and then
"""


def expected_body(i: int) -> bytes:
    return hashlib.sha256(b"%d" % i).digest() * (i % 40)


def _run(tmp_path: Path, preallocate: bool) -> None:
    root = tmp_path / "store"
    root.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(root), str(N), str(QUEUES), "1" if preallocate else "0"])
    seen: dict[int, list[bytes]] = {q: [] for q in range(QUEUES)}
    rounds = 0
    while_running = 0  # records read while the writer was still appending
    try:
        with LocalStore(root) as store:
            while True:
                done = proc.poll() is not None
                for q in range(QUEUES):
                    got = seen[q]
                    for item in store.iter_queue("T", q, len(got), max_count=200):
                        assert item.queue_offset == len(got)  # contiguous, in order
                        rec = item.record
                        i = item.queue_offset * QUEUES + q
                        assert rec.body_bytes() == expected_body(i)
                        assert rec.keys == [f"k{i}"] and rec.tags == f"t{i % 7}"
                        assert item.tags_code == _java_hash(f"t{i % 7}")
                        got.append(bytes(rec.raw))
                        while_running += not done
                rounds += 1
                if rounds % 7 == 0:
                    store.refresh()
                if done and all(len(seen[q]) == _count(q) for q in range(QUEUES)):
                    break
                if done and rounds > 10_000:
                    pytest.fail(f"reader stuck at {[len(v) for v in seen.values()]}")
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == 0
    # the reader really ran alongside the writer, and caught up with it
    assert rounds > 3 and 0 < while_running
    with LocalStore(root) as fresh:
        for q in range(QUEUES):
            assert [bytes(i.record.raw) for i in fresh.iter_queue("T", q, 0)] == seen[q]


def _count(q: int) -> int:
    return len(range(q, N, QUEUES))


def _java_hash(s: str) -> int:
    h = 0
    for ch in s:
        h = (31 * h + ord(ch)) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def test_reader_alongside_a_writer_process(tmp_path: Path) -> None:
    _run(tmp_path, preallocate=True)


def test_reader_alongside_a_writer_process_growing_files(tmp_path: Path) -> None:
    _run(tmp_path, preallocate=False)


def test_reader_alongside_tiered_produce(tmp_path: Path) -> None:
    """The console script as the writer: several `tiered produce` runs append
    to the same store while the reader follows."""
    root = tmp_path / "store"
    exe = Path(sys.executable).with_name("tiered")
    cmd = [str(exe), "produce", "--store", str(root), "--topic", "P", "--queues", "2", "--messages", "400",
           "--body-size", "300", "--keys", "--tags", "TagA", "--commitlog-file-size", "16384", "--cq-entries", "50"]
    runs = 3
    seen: dict[int, list[bytes]] = {0: [], 1: []}
    deadline = time.monotonic() + 90
    for run in range(runs):
        proc = subprocess.Popen([*cmd, "--seed", str(run)], stderr=subprocess.DEVNULL)
        with LocalStore(root) as store:
            while True:
                done = proc.poll() is not None
                for q in (0, 1):
                    if not (root / "consumequeue" / "P" / str(q)).exists():
                        continue
                    for item in store.iter_queue("P", q, len(seen[q])):
                        assert item.queue_offset == len(seen[q])
                        assert item.record.tags == "TagA" and item.record.body_length == 300
                        assert item.record.keys == [f"key-{(item.queue_offset - 200 * run) * 2 + q}"]
                        seen[q].append(bytes(item.record.raw))
                if done and all(len(seen[q]) == 200 * (run + 1) for q in (0, 1)):
                    break
                assert time.monotonic() < deadline, [len(v) for v in seen.values()]
        assert proc.wait() == 0
    with LocalStore(root) as fresh:
        for q in (0, 1):
            assert [bytes(i.record.raw) for i in fresh.iter_queue("P", q, 0)] == seen[q]
            assert fresh.queue_range("P", q).count == 200 * runs
