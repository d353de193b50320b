"""Group-committed directory fsyncs (tiered/archive/dirsync.py): a writer
returns only after an fsync that started after its call, writers arriving
while one runs share the next, and a failed fsync is never counted."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tiered.archive.dirsync import Directories


def _until(cond, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + 10
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.001)


class _Blocking:
    """An fsync whose first call blocks until released (and fails if told)."""

    def __init__(self, fail_first: bool = False) -> None:
        self.calls: list[Path] = []
        self.entered = threading.Event()
        self.release = threading.Event()
        self.fail_first = fail_first

    def __call__(self, directory: Path) -> None:
        self.calls.append(directory)
        if len(self.calls) == 1:
            self.entered.set()
            if not self.release.wait(10):
                raise AssertionError("never released")
            if self.fail_first:
                raise OSError(5, "I/O error")


def _run(dirs: Directories, path: Path, done: list[str], name: str, errors: list[BaseException]) -> threading.Thread:
    def body() -> None:
        try:
            dirs.sync(path)
            done.append(name)
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            errors.append(exc)

    t = threading.Thread(target=body)
    t.start()
    return t


def test_sequential_syncs_each_run_their_own_fsync(tmp_path: Path) -> None:
    calls: list[Path] = []
    dirs = Directories(fsync=calls.append)
    dirs.sync(tmp_path)
    dirs.sync(tmp_path)
    dirs.sync(tmp_path / "x")
    assert calls == [tmp_path, tmp_path, tmp_path / "x"]
    assert dirs._states == {}  # nothing kept once nobody waits


def test_writers_arriving_during_an_fsync_wait_for_the_next_and_share_it(tmp_path: Path) -> None:
    fsync = _Blocking()
    dirs = Directories(fsync=fsync)
    done: list[str] = []
    errors: list[BaseException] = []
    a = _run(dirs, tmp_path, done, "a", errors)
    assert fsync.entered.wait(10)
    # b and c changed the directory while a's fsync runs: it may have started
    # before their change, so it must not count for them
    b = _run(dirs, tmp_path, done, "b", errors)
    c = _run(dirs, tmp_path, done, "c", errors)
    _until(lambda: dirs.waiting(tmp_path) == 2, "b and c waiting")
    assert done == [] and len(fsync.calls) == 1
    fsync.release.set()
    for t in (a, b, c):
        t.join(10)
    assert not errors
    assert sorted(done) == ["a", "b", "c"]
    assert fsync.calls == [tmp_path, tmp_path]  # one more fsync, shared by b and c
    assert dirs._states == {}


def test_a_failed_fsync_fails_its_caller_and_covers_nobody(tmp_path: Path) -> None:
    fsync = _Blocking(fail_first=True)
    dirs = Directories(fsync=fsync)
    done: list[str] = []
    errors: list[BaseException] = []
    a = _run(dirs, tmp_path, done, "a", errors)
    assert fsync.entered.wait(10)
    b = _run(dirs, tmp_path, done, "b", errors)
    _until(lambda: dirs.waiting(tmp_path) == 1, "b waiting")
    fsync.release.set()
    a.join(10)
    b.join(10)
    assert [type(e) for e in errors] == [OSError] and done == ["b"]
    assert fsync.calls == [tmp_path, tmp_path]  # b ran its own after a's failed


def test_other_directories_do_not_wait_for_each_other(tmp_path: Path) -> None:
    fsync = _Blocking()
    dirs = Directories(fsync=fsync)
    done: list[str] = []
    errors: list[BaseException] = []
    a = _run(dirs, tmp_path / "one", done, "a", errors)
    assert fsync.entered.wait(10)
    dirs.sync(tmp_path / "two")  # returns while one's fsync is blocked
    assert fsync.calls == [tmp_path / "one", tmp_path / "two"]
    fsync.release.set()
    a.join(10)
    assert done == ["a"] and not errors


def test_not_picklable_on_its_own() -> None:
    import pickle

    with pytest.raises(TypeError):
        pickle.dumps(Directories())


def test_the_memory_of_known_directories_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tiered.archive import dirsync

    monkeypatch.setattr(dirsync, "_KNOWN_MAX", 4)
    calls: list[Path] = []
    dirs = Directories(tmp_path, fsync=calls.append)
    for q in range(6):
        dirs.ensure(tmp_path / "T" / str(q))
        assert (tmp_path / "T" / str(q)).is_dir()
    assert len(dirs._known) <= 4
    # T was forgotten once on the way: synced in the root again then, never lost
    assert calls.count(tmp_path) == 2 and calls.count(tmp_path / "T") == 6
