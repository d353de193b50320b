"""file:// writes are durable before they return: the object's bytes, its
name (the directory holding it) and every directory created for it are
fsynced, so a manifest committed afterwards never names an object a power
loss could take back. What each fsync covered is observed on the real file
system, at the moment of the call."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dispatchkit import direct_opens
from tiered.archive.storage import open_store


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, tuple[str, ...]]]:
    """Each fsync as (what was synced, the names its directory held then)."""
    calls: list[tuple[str, tuple[str, ...]]] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        names = tuple(sorted(n for n in os.listdir(path) if not n.endswith(".tmp"))) if os.path.isdir(path) else ()
        calls.append((path, names))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return calls


def _dirs(calls: list[tuple[str, tuple[str, ...]]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for path, names in calls:
        if os.path.isdir(path):
            out.setdefault(path, set()).update(names)
    return out


def test_a_put_syncs_its_name_and_every_directory_it_created(tmp_path: Path, synced) -> None:  # noqa: ANN001
    root = tmp_path / "cold"
    root.mkdir()
    store = open_store(f"file://{root}")
    store.put("C/b/T/0/segment/obj", b"bytes")
    dirs = _dirs(synced)
    # each new directory's entry made durable in its parent, and the object's name after its rename
    assert dirs[str(root)] >= {"C"} and dirs[str(root / "C")] >= {"b"}
    assert dirs[str(root / "C/b/T/0")] >= {"segment"}
    assert dirs[str(root / "C/b/T/0/segment")] == {"obj"}
    # the file's bytes were synced before its name was
    files = [p for p, _ in synced if not os.path.isdir(p)]
    assert len(files) == 1 and files[0].endswith(".tmp")
    assert (root / "C/b/T/0/segment/obj").read_bytes() == b"bytes"


def test_conditional_writes_sync_the_name_they_created_or_replaced(tmp_path: Path, synced) -> None:  # noqa: ANN001
    root = tmp_path / "cold"
    store = open_store(f"file://{root}")
    etag = store.put_if_absent("C/b/T/0/manifest.json", b"v1")
    first = _dirs(synced)[str(root / "C/b/T/0")]
    assert "manifest.json" in first
    synced.clear()
    store.put_if_match("C/b/T/0/manifest.json", b"v2", etag)
    assert _dirs(synced)[str(root / "C/b/T/0")] == {"manifest.json"}
    assert store.get("C/b/T/0/manifest.json") == b"v2"
    # a write into an existing directory syncs only that directory
    assert set(_dirs(synced)) == {str(root / "C/b/T/0")}


def test_a_directory_removed_after_a_write_is_created_and_synced_again(tmp_path: Path, synced) -> None:  # noqa: ANN001
    root = tmp_path / "cold"
    store = open_store(f"file://{root}")
    store.put("C/b/T/0/segment/a", b"1")
    store.put("C/b/T/1/segment/a", b"2")  # T is remembered: only 1 and 1/segment are made
    assert {"0", "1"} <= _dirs(synced)[str(root / "C/b/T")]
    # the cleaner (or a hand) removes a queue's directories the store remembers
    import shutil

    shutil.rmtree(root / "C/b/T/0")
    synced.clear()
    store.put("C/b/T/0/segment/b", b"3")
    dirs = _dirs(synced)
    assert "0" in dirs[str(root / "C/b/T")] and dirs[str(root / "C/b/T/0")] >= {"segment"}
    assert dirs[str(root / "C/b/T/0/segment")] == {"b"}
    # and the topic's whole tree, every remembered level gone
    shutil.rmtree(root / "C")
    synced.clear()
    etag = store.put_if_absent("C/b/T/1/manifest.json", b"m")
    dirs = _dirs(synced)
    assert dirs[str(root)] >= {"C"} and dirs[str(root / "C")] >= {"b"} and dirs[str(root / "C/b")] >= {"T"}
    assert dirs[str(root / "C/b/T")] >= {"1"} and dirs[str(root / "C/b/T/1")] == {"manifest.json"}
    assert store.get("C/b/T/1/manifest.json") == b"m" and etag
    assert [o.key for o in store.list_keys("C/")] == ["C/b/T/1/manifest.json"]


def test_concurrent_writers_into_new_directories_each_find_their_entry_synced(tmp_path: Path, synced) -> None:  # noqa: ANN001
    from concurrent.futures import ThreadPoolExecutor

    root = tmp_path / "cold"
    (root / "T").mkdir(parents=True)
    store = open_store(f"file://{root}")
    keys = [f"T/{q}/segment/obj" for q in range(40)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: store.put(k, k.encode()), keys))
    dirs = _dirs(synced)
    # every queue directory is in a listing of T taken by an fsync after it was made
    assert dirs[str(root / "T")] == {str(q) for q in range(40)}
    for q in range(40):
        assert dirs[str(root / f"T/{q}")] == {"segment"}
        assert dirs[str(root / f"T/{q}/segment")] == {"obj"}
        assert store.get(f"T/{q}/segment/obj") == f"T/{q}/segment/obj".encode()
    # T was synced no more often than a queue directory was made in it (group commit may do fewer)
    assert sum(1 for p, _ in synced if p == str(root / "T")) <= 40


def test_new_directories_are_synced_after_the_file_and_before_its_name(tmp_path: Path, synced) -> None:  # noqa: ANN001
    root = tmp_path / "cold"
    (root / "T").mkdir(parents=True)
    store = open_store(f"file://{root}")
    store.put("T/0/segment/obj", b"x")
    order = [p for p, _ in synced]
    tmp_at = next(i for i, p in enumerate(order) if p.endswith(".tmp"))
    # the file first (its commit usually carries the new entries too), then
    # each new directory in its parent (T, there but not yet known to be
    # durable, in the root), then the object's own name
    assert order[tmp_at + 1:] == [str(root), str(root / "T"), str(root / "T/0"), str(root / "T/0/segment")]
    assert dict(synced)[str(root / "T/0/segment")] == ("obj",)


def test_directories_found_but_not_known_durable_are_synced_once(tmp_path: Path, synced) -> None:  # noqa: ANN001
    root = tmp_path / "cold"
    (root / "C/b/T").mkdir(parents=True)  # made by a process that died before syncing them
    store = open_store(f"file://{root}")
    store.put("C/b/T/0/segment/a", b"1")
    dirs = _dirs(synced)
    assert dirs[str(root)] == {"C"} and dirs[str(root / "C")] == {"b"} and dirs[str(root / "C/b")] == {"T"}
    synced.clear()
    store.put("C/b/T/1/segment/a", b"2")  # known now: only the new queue's own levels
    assert set(_dirs(synced)) == {str(root / "C/b/T"), str(root / "C/b/T/1"), str(root / "C/b/T/1/segment")}


def test_a_whole_path_made_by_another_process_is_synced_at_the_first_write(tmp_path: Path,  # noqa: ANN001
                                                                          synced) -> None:
    root = tmp_path / "cold"
    (root / "C/b/T/0/segment").mkdir(parents=True)  # all of it, by a process that died before syncing
    store = open_store(f"file://{root}")
    store.put("C/b/T/0/segment/a", b"1")
    dirs = _dirs(synced)
    assert dirs[str(root)] == {"C"} and dirs[str(root / "C")] == {"b"} and dirs[str(root / "C/b")] == {"T"}
    assert dirs[str(root / "C/b/T")] == {"0"} and dirs[str(root / "C/b/T/0")] == {"segment"}
    synced.clear()
    store.put("C/b/T/0/segment/b", b"2")  # known now: the file and its name only
    assert set(_dirs(synced)) == {str(root / "C/b/T/0/segment")}


def test_a_failed_write_still_syncs_the_directories_it_made(tmp_path: Path, synced,  # noqa: ANN001
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    from tiered.archive.storage import RetryPolicy
    from tiered.errors import StorageError

    root = tmp_path / "cold"
    (root / "T").mkdir(parents=True)
    store = open_store(f"file://{root}", retry=RetryPolicy(attempts=1))
    recording = os.fsync

    def full(fd: int) -> None:
        if not os.path.isdir(os.readlink(f"/proc/self/fd/{fd}")):
            raise OSError(errno.ENOSPC, "No space left on device")
        recording(fd)

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(StorageError):
        store.put("T/0/segment/obj", b"x")
    monkeypatch.setattr(os, "fsync", recording)
    dirs = _dirs(synced)
    assert dirs[str(root / "T")] == {"0"} and dirs[str(root / "T/0")] == {"segment"}
    synced.clear()
    store.put("T/0/segment/obj", b"y")  # the directories are there now: only the object's name
    assert set(_dirs(synced)) == {str(root / "T/0/segment")}
    assert store.get("T/0/segment/obj") == b"y"


def test_directories_made_for_a_file_that_could_not_be_opened_are_synced(tmp_path: Path, synced,  # noqa: ANN001
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    from tiered.archive.storage import RetryPolicy
    from tiered.errors import StorageError

    root = tmp_path / "cold"
    (root / "T").mkdir(parents=True)
    store = open_store(f"file://{root}", retry=RetryPolicy(attempts=1))
    opened: list[str] = []
    real_open = os.open

    def open_(path, flags, *a):  # noqa: ANN001, ANN002, ANN202
        if str(path).endswith(".tmp"):  # the object's file, not a directory opened for its fsync
            opened.append(str(path))
            if len(opened) == 1:  # made before the first open: this process never synced them
                raise OSError(errno.EMFILE, "Too many open files")
        return real_open(path, flags, *a)

    monkeypatch.setattr(os, "open", open_)
    with pytest.raises(StorageError):
        store.put("T/0/segment/obj", b"x")
    dirs = _dirs(synced)
    assert len(opened) == 1 and (root / "T/0/segment").is_dir()
    assert dirs[str(root / "T")] == {"0"} and dirs[str(root / "T/0")] == {"segment"}


def test_a_direct_write_is_synced_as_a_buffered_one(tmp_path: Path, synced,  # noqa: ANN001
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import mmap

    from tiered.archive.filewrite import DIRECT_MIN

    root = tmp_path / "cold"
    (root / "T").mkdir(parents=True)
    store = open_store(f"file://{root}")
    direct = direct_opens(monkeypatch)
    data = os.urandom(DIRECT_MIN + 1)
    m = mmap.mmap(-1, len(data))  # page-aligned, as the dispatcher's segment buffers are
    m[:] = data
    with memoryview(m) as view:
        store.put("T/0/segment/obj", view)
    m.close()
    assert len(direct) == 1 and direct[0].endswith(".tmp")  # the object went around the page cache
    order = [p for p, _ in synced]
    tmp_at = next(i for i, p in enumerate(order) if p.endswith(".tmp"))
    # the same fsyncs in the same order: the file, its new directories, its name
    assert order[tmp_at:] == [direct[0], str(root), str(root / "T"), str(root / "T/0"), str(root / "T/0/segment")]
    assert dict(synced)[str(root / "T/0/segment")] == ("obj",)
    assert (root / "T/0/segment/obj").read_bytes() == data
