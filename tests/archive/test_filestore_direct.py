"""file:// objects written around the page cache (FileStore, O_DIRECT): a
big object in a page-aligned buffer has its whole pages written directly,
its tail through the cache, and reads back byte for byte as any other.
Everything here writes real files; the refusals of a file system without
O_DIRECT are played at the os.open / os.write boundary, everything else is
the real thing on the test's file system."""

from __future__ import annotations

import errno
import fcntl
import gc
import logging
import mmap
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tiered.archive.filewrite import DIRECT_ALIGN, DIRECT_MIN
from tiered.archive.storage import FileStore, RetryPolicy, open_store
from tiered.errors import StorageError

PAGE = DIRECT_ALIGN


def _payload(n: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(n)


@pytest.fixture
def aligned() -> Iterator:  # noqa: ANN202
    """Page-aligned buffers (anonymous mappings) holding given bytes."""
    maps: list[tuple[mmap.mmap, memoryview]] = []

    def make(data: bytes) -> memoryview:
        m = mmap.mmap(-1, max(len(data), 1))
        m[:len(data)] = data
        view = memoryview(m)[:len(data)]
        maps.append((m, view))
        return view

    yield make
    gc.collect()  # views of them in a kept traceback's frames
    for m, view in maps:
        view.release()
        m.close()


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[bool, int]]:
    """Each os.write as (made with O_DIRECT on, bytes written): the real call,
    observed. Both paths write with os.write (filewrite.write_whole for the
    buffered one)."""
    seen: list[tuple[bool, int]] = []
    real = os.write

    def write(fd: int, data) -> int:  # noqa: ANN001
        direct = bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT)
        n = real(fd, data)
        seen.append((direct, n))
        return n

    monkeypatch.setattr(os, "write", write)
    return seen


def _direct_bytes(seen: list[tuple[bool, int]]) -> tuple[int, int]:
    return sum(n for d, n in seen if d), sum(n for d, n in seen if not d)


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize("size", [DIRECT_MIN - 1, DIRECT_MIN, DIRECT_MIN + 1, DIRECT_MIN + PAGE - 1,
                                  DIRECT_MIN + PAGE + 1, 3 * DIRECT_MIN - 1, 2 * DIRECT_MIN + 3 * PAGE])
def test_an_aligned_object_is_written_direct_page_by_page_and_reads_back_exact(tmp_path: Path, aligned,  # noqa: ANN001
                                                                                writes, size: int) -> None:
    store = open_store(f"file://{tmp_path}")
    data = _payload(size, size)
    store.put("T/0/segment/obj", aligned(data))
    assert (tmp_path / "T/0/segment/obj").read_bytes() == data
    assert store.get("T/0/segment/obj") == data and store.head("T/0/segment/obj").size == size
    if size < DIRECT_MIN:  # small: through the page cache
        assert _direct_bytes(writes) == (0, size)
    else:  # every whole page direct, only the last partial one through the cache
        assert _direct_bytes(writes) == (size - size % PAGE, size % PAGE)
    assert _files(tmp_path) == ["T/0/segment/obj"] and store.leftovers() == []


def test_a_buffer_not_starting_at_a_page_and_plain_bytes_go_through_the_cache(tmp_path: Path, aligned,  # noqa: ANN001
                                                                               writes) -> None:
    store = open_store(f"file://{tmp_path}")
    data = _payload(2 * DIRECT_MIN + 1)
    store.put("a", aligned(b"\0" + data)[1:])  # one byte past a page
    store.put("b", data)  # bytes: their data sit behind the object's header
    store.put("c", bytearray(data))
    assert [store.get(k) for k in "abc"] == [data] * 3
    assert _direct_bytes(writes) == (0, 3 * len(data))


def test_zstd_compressed_objects_are_exact_written_direct_or_not(tmp_path: Path, aligned, writes) -> None:  # noqa: ANN001
    from tiered.archive import layout

    rng = random.Random(7)
    raw = b"".join(rng.choice([b"paid", b"shipped", b"lost"]) + rng.randbytes(12) for _ in range(400_000))
    packed = layout.compress(raw)
    assert DIRECT_MIN < len(packed) < len(raw) and len(packed) % PAGE
    store = open_store(f"file://{tmp_path}")
    store.put("plain.zst", packed)  # as the archiver hands them over: bytes
    assert _direct_bytes(writes) == (0, len(packed))
    writes.clear()
    store.put("direct.zst", aligned(packed))
    assert _direct_bytes(writes) == (len(packed) - len(packed) % PAGE, len(packed) % PAGE)
    for key in ("plain.zst", "direct.zst"):
        got = store.get(key)
        assert got == packed and layout.decompress(got, key) == raw


def test_a_file_system_refusing_o_direct_at_open_gets_buffered_writes_said_once(
        tmp_path: Path, aligned, writes, monkeypatch: pytest.MonkeyPatch,  # noqa: ANN001
        caplog: pytest.LogCaptureFixture) -> None:
    real = os.open
    tried: list[str] = []

    def open_(path, flags, *a):  # noqa: ANN001, ANN002, ANN202
        if flags & os.O_DIRECT:
            tried.append(str(path))
            # what a file system without direct I/O answers (Linux: after creating the file)
            fd = real(path, flags & ~os.O_DIRECT, *a)
            os.close(fd)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(path, flags, *a)

    monkeypatch.setattr(os, "open", open_)
    store = open_store(f"file://{tmp_path}")
    objects = {f"T/{i}/obj": _payload(DIRECT_MIN + 100 * i + 1, i) for i in range(3)}
    with caplog.at_level(logging.INFO, logger="tiered.archive.filewrite"):
        for key, data in objects.items():
            store.put(key, aligned(data))
    assert len(tried) == 1 and not store.direct  # asked once, remembered for this store
    assert [r.getMessage() for r in caplog.records if "O_DIRECT" in r.getMessage()] == [
        f"{tmp_path} refuses O_DIRECT writes (Invalid argument): writing objects through the page cache"]
    assert {k: store.get(k) for k in objects} == objects
    assert _direct_bytes(writes) == (0, sum(map(len, objects.values()))) and store.leftovers() == []
    assert _files(tmp_path) == sorted(objects)
    # another store (another process, a restart) asks again
    again = FileStore(str(tmp_path))
    again.put("T/9/obj", aligned(objects["T/0/obj"]))
    assert len(tried) == 2 and again.get("T/9/obj") == objects["T/0/obj"]


def test_a_refusal_at_the_first_direct_write_writes_the_whole_object_buffered(
        tmp_path: Path, aligned, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    real = os.write
    calls: list[tuple[bool, int]] = []

    def write(fd: int, data) -> int:  # noqa: ANN001
        direct = bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT)
        calls.append((direct, len(data)))
        if direct:
            raise OSError(errno.EINVAL, "Invalid argument")  # a FUSE file system that opens but cannot
        return real(fd, data)

    monkeypatch.setattr(os, "write", write)
    store = open_store(f"file://{tmp_path}")
    data = _payload(3 * DIRECT_MIN + 5)
    store.put("T/0/obj", aligned(data))
    # one direct attempt; then the whole object through the cache, from its first byte
    assert calls == [(True, len(data) - 5), (False, len(data))]
    assert store.get("T/0/obj") == data and not store.direct
    store.put("T/1/obj", aligned(data))  # not asked again: through the cache at once
    assert calls == [(True, len(data) - 5), (False, len(data)), (False, len(data))]
    assert store.get("T/1/obj") == data
    assert _files(tmp_path) == ["T/0/obj", "T/1/obj"]


@pytest.mark.parametrize(("fail_at", "direct_buffer"),
                         [("direct", True), ("tail", True), ("fsync", True), ("tail", False), ("fsync", False)])
def test_a_write_failing_midway_leaves_no_object_and_no_temp_file(tmp_path: Path, aligned, fail_at: str,  # noqa: ANN001
                                                                  direct_buffer: bool,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # direct_buffer False: plain bytes, the whole object through the cache ("tail": its one write)
    real_write, real_fsync = os.write, os.fsync
    failures = [1]  # the first attempt fails, the retry goes through

    def write(fd: int, data) -> int:  # noqa: ANN001
        direct = bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT)
        if failures and fail_at == ("direct" if direct else "tail"):
            failures.pop()
            if not direct:
                real_write(fd, data[:1])  # a byte of the tail made it to the file
            raise OSError(errno.EIO, "Input/output error")
        return real_write(fd, data)

    def fsync(fd: int) -> None:
        if failures and fail_at == "fsync" and not os.path.isdir(os.readlink(f"/proc/self/fd/{fd}")):
            failures.pop()
            raise OSError(errno.EIO, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(os, "write", write)
    monkeypatch.setattr(os, "fsync", fsync)
    data = _payload(2 * DIRECT_MIN + 3)
    put = aligned(data) if direct_buffer else data
    once = open_store(f"file://{tmp_path}", retry=RetryPolicy(attempts=1))
    with pytest.raises(StorageError):
        once.put("T/0/segment/obj", put)
    assert once.head("T/0/segment/obj") is None and once.list_keys() == [] and once.leftovers() == []
    assert _files(tmp_path) == []  # not even a temp file: a failed write removes its own
    assert once.direct  # an I/O error is no refusal of O_DIRECT
    failures.append(1)
    retried = open_store(f"file://{tmp_path}", retry=RetryPolicy(attempts=2, base_delay=0, max_delay=0))
    retried.put("T/0/segment/obj", put)
    assert not failures and retried.get("T/0/segment/obj") == data
    assert _files(tmp_path) == ["T/0/segment/obj"]


_CRASH = """
import mmap, os, random, sys
from tiered.archive.storage import open_store
data = random.Random(3).randbytes({size})
m = mmap.mmap(-1, len(data)); m[:] = data
real = os.fsync
def fsync(fd):
    if not os.path.isdir(os.readlink(f"/proc/self/fd/{{fd}}")):
        os._exit(9)  # the process dies with the object's bytes written, before its fsync and rename
    real(fd)
os.fsync = fsync
open_store(sys.argv[1]).put("T/0/segment/obj", memoryview(m))
"""


def test_a_crash_in_a_direct_write_leaves_a_temp_file_for_the_orphan_pass_never_an_object(tmp_path: Path) -> None:
    size = 2 * DIRECT_MIN + 3
    done = subprocess.run([sys.executable, "-c", _CRASH.format(size=size), f"file://{tmp_path}"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 9, done.stderr
    store = open_store(f"file://{tmp_path}")
    assert store.head("T/0/segment/obj") is None and store.list_keys() == []
    (left,) = store.leftovers()
    assert left.key.startswith("T/0/segment/.obj.") and left.key.endswith(".tmp") and left.size == size
    store.delete_many([left.key])  # what the orphan pass does after its grace period
    assert _files(tmp_path) == []


def test_direct_writes_can_be_turned_off(tmp_path: Path, aligned, writes,  # noqa: ANN001
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from tiered.cli.wiring import object_store
    from tiered.config import Settings

    data = _payload(DIRECT_MIN)
    off = Settings(store=tmp_path, cold_url=f"file://{tmp_path}/a", file={"direct_writes": False})
    on = Settings(store=tmp_path, cold_url=f"file://{tmp_path}/b")
    stores = object_store(off), object_store(on)
    assert [s.direct for s in stores] == [False, True]  # type: ignore[attr-defined]
    stores[0].put("obj", aligned(data))
    assert writes == [(False, DIRECT_MIN)]
    writes.clear()
    stores[1].put("obj", aligned(data))
    assert writes == [(True, DIRECT_MIN)]
    assert [s.get("obj") for s in stores] == [data, data]
    monkeypatch.setenv("TIERED_FILE__DIRECT_WRITES", "false")
    assert not Settings(store=tmp_path, cold_url=f"file://{tmp_path}/c").file.direct_writes
