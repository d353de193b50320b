"""The compiled whole write of a file:// object (tiered/archive/_filewrite.c):
the temp file written (its whole pages with O_DIRECT from a page-aligned
buffer, the tail through the cache) and fsynced, renamed, its directory
fsynced, in one call without the GIL. Its system calls are watched and
failed under the C library by a preloaded shim (tests/helpers/oscalls_shim.c)
in a subprocess, on the real file system: the order that makes an object
durable before its put returns, the refusals of O_DIRECT, failures at each
step, a crash. The Python path (no compiler) is test_filestore_direct.py's
and test_filestore_durable.py's."""

from __future__ import annotations

import errno
import mmap
import os
import random
from pathlib import Path

import pytest

import oscalls
from tiered.archive import filewrite
from tiered.archive.filewrite import DIRECT_ALIGN, DIRECT_MIN

PAGE = DIRECT_ALIGN
pytestmark = pytest.mark.skipif(filewrite._native is None, reason="built without a C compiler")

# a store whose object directory T/0/segment this process made (and knows)
_STORE = """
import logging
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
from tiered.archive import filewrite
from tiered.archive.storage import FileStore, RetryPolicy
from tiered.errors import StorageError
assert filewrite._native is not None
store = FileStore(sys.argv[1], direct=sys.argv[2] == "direct", retry=RetryPolicy(attempts=1))
store.put("T/0/segment/first", b"x")
def put_failing(key, data):
    try:
        store.put(key, data)
    except StorageError as exc:
        print("raised", type(exc.__cause__).__name__, exc.__cause__.errno, exc.__cause__.filename)
"""


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return oscalls.build(tmp_path_factory.mktemp("shim"))


def _run(shim: Path, tmp_path: Path, code: str, *, direct: bool = True) -> oscalls.Traced:
    root = tmp_path / "cold"
    root.mkdir(exist_ok=True)
    done = oscalls.run(shim, root, _STORE + code, tmp_path / "calls.log", str(root), "direct" if direct else "cached")
    return done


def _payload(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)  # as the snippets' payload()


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def _durable(size: int, head: int) -> list[str]:
    """The calls of one object's compiled write, in order."""
    tmp, obj = "T/0/segment/.obj.tmp", "T/0/segment/obj"
    writes = [f"open {tmp}", f"write {tmp} {size} cached"] if not head else [
        f"open_direct {tmp}", f"write {tmp} {head} direct",
        *([f"setfl {tmp} cached", f"write {tmp} {size - head} cached"] if size > head else [])]
    return [*writes, f"fsync {tmp}", f"close {tmp}", f"rename {tmp} {obj}",
            "opendir T/0/segment", "fsync_dir T/0/segment", "close T/0/segment"]


@pytest.mark.parametrize(("size", "buffer", "direct"), [
    (DIRECT_MIN - 1, "aligned", True), (DIRECT_MIN, "aligned", True), (DIRECT_MIN + PAGE + 1, "aligned", True),
    (3 * DIRECT_MIN - 1, "aligned", True), (DIRECT_MIN + 1, "bytes", True), (DIRECT_MIN + 1, "aligned", False)])
def test_a_put_into_a_known_directory_is_one_compiled_call_in_the_durable_order(
        shim: Path, tmp_path: Path, size: int, buffer: str, direct: bool) -> None:
    done = _run(shim, tmp_path, f"""
data = payload({size}, 5)
for name in ("open", "write", "fsync", "replace", "rename", "close"):
    setattr(os, name, None)  # no call from Python: the compiled write makes them all
mark("put")
store.put("T/0/segment/obj", {buffer}(data) if "{buffer}" == "aligned" else data)
""", direct=direct)
    assert done.returncode == 0, done.stderr
    head = size - size % PAGE if direct and buffer == "aligned" and size >= DIRECT_MIN else 0
    # the bytes synced before the name, the name before the put returns
    assert done.after("put") == _durable(size, head)
    obj = tmp_path / "cold/T/0/segment/obj"
    assert obj.read_bytes() == _payload(size, 5)
    assert _files(tmp_path / "cold") == ["T/0/segment/first", "T/0/segment/obj"]


@pytest.mark.parametrize("refused_at", ["open_direct", "write_direct"])
def test_a_refusal_of_o_direct_writes_the_object_through_the_cache_said_once(
        shim: Path, tmp_path: Path, refused_at: str) -> None:
    size = 2 * DIRECT_MIN + 5
    done = _run(shim, tmp_path, f"""
data = payload({size}, 1)
arm("{refused_at}:1:{errno.EINVAL}")
mark("first")
store.put("T/0/segment/obj", aligned(data))
mark("second")
store.put("T/0/segment/obj2", aligned(data))
print("direct", store.direct)
""")
    assert done.returncode == 0, done.stderr
    tmp = "T/0/segment/.obj.tmp"
    first = done.after("first")
    # refused once, then the whole object through the cache from its first byte, as durable
    assert first[:first.index(f"failed {refused_at} {tmp} {errno.EINVAL}")] == (
        [f"open_direct {tmp}"] if refused_at == "write_direct" else [])
    assert first[first.index(f"failed {refused_at} {tmp} {errno.EINVAL}") + 1:] == (
        [f"close {tmp}"] if refused_at == "write_direct" else []) + _durable(size, 0)
    assert not any(line.startswith(("open_direct", "failed")) for line in done.after("second"))  # not asked again
    assert done.stdout.count("refuses O_DIRECT writes (Invalid argument)") == 1 and "direct False" in done.stdout
    want = _payload(size, 1)
    assert [(tmp_path / f"cold/T/0/segment/{k}").read_bytes() for k in ("obj", "obj2")] == [want, want]
    assert _files(tmp_path / "cold") == ["T/0/segment/first", "T/0/segment/obj", "T/0/segment/obj2"]


@pytest.mark.parametrize("fail", ["open_direct:1:5", "write_direct:1:5", "setfl:1:5", "write:1:28", "fsync:1:5",
                                  "rename:1:18"])
def test_a_compiled_write_failing_midway_leaves_no_object_and_no_temp_file(shim: Path, tmp_path: Path,
                                                                           fail: str) -> None:
    size = 2 * DIRECT_MIN + 3
    done = _run(shim, tmp_path, f"""
data = payload({size}, 2)
arm("{fail}")
put_failing("T/0/segment/obj", aligned(data))
print("left", sorted(os.listdir(sys.argv[1] + "/T/0/segment")), "direct", store.direct)
mark("retry")
store.put("T/0/segment/obj", aligned(data))
""")
    assert done.returncode == 0, done.stderr
    code = fail.split(":")[2]
    raised = next(line for line in done.stdout.splitlines() if line.startswith("raised")).split()
    assert raised[1:3] == [type(OSError(int(code), "")).__name__, code]
    assert raised[3].startswith(str(tmp_path / "cold/T/0/segment/.obj."))  # the file the failed call was on
    # nothing of the failed write is left, not even its temp file; an I/O error is no refusal of O_DIRECT
    assert "left ['first'] direct True" in done.stdout
    assert done.after("retry")[0] == "open_direct T/0/segment/.obj.tmp"
    assert (tmp_path / "cold/T/0/segment/obj").read_bytes() == _payload(size, 2)
    assert _files(tmp_path / "cold") == ["T/0/segment/first", "T/0/segment/obj"]


def test_a_failed_directory_sync_fails_the_put_and_the_retry_syncs_it(shim: Path, tmp_path: Path) -> None:
    done = _run(shim, tmp_path, f"""
data = payload({DIRECT_MIN}, 4)
arm("fsync_dir:1:5")
put_failing("T/0/segment/obj", aligned(data))
mark("retry")
store.put("T/0/segment/obj", aligned(data))
""")
    assert done.returncode == 0, done.stderr
    # named but maybe not durable: the put does not return as if it were; the caller's retry syncs it
    assert f"raised OSError 5 {tmp_path / 'cold/T/0/segment'}" in done.stdout
    assert done.after("retry")[-4:] == ["rename T/0/segment/.obj.tmp T/0/segment/obj", "opendir T/0/segment",
                                        "fsync_dir T/0/segment", "close T/0/segment"]
    assert (tmp_path / "cold/T/0/segment/obj").read_bytes() == _payload(DIRECT_MIN, 4)


def test_a_crash_in_a_compiled_write_leaves_a_temp_file_for_the_orphan_pass_never_an_object(
        shim: Path, tmp_path: Path) -> None:
    from tiered.archive.storage import open_store

    size = 2 * DIRECT_MIN + 3
    done = _run(shim, tmp_path, f"""
arm("fsync:1:0")  # killed with the object's bytes written, before their fsync and the rename
store.put("T/0/segment/obj", aligned(payload({size})))
""")
    assert done.returncode == -9, done.stderr
    assert done.lines[-1] == "killed fsync T/0/segment/.obj.tmp"
    store = open_store(f"file://{tmp_path / 'cold'}")
    assert store.head("T/0/segment/obj") is None and [o.key for o in store.list_keys()] == ["T/0/segment/first"]
    (left,) = store.leftovers()
    assert left.key.startswith("T/0/segment/.obj.") and left.key.endswith(".tmp") and left.size == size


def test_a_known_directory_removed_since_is_made_and_synced_again(shim: Path, tmp_path: Path) -> None:
    done = _run(shim, tmp_path, """
import shutil
shutil.rmtree(sys.argv[1] + "/T/0")  # the cleaner, or a hand
mark("put")
store.put("T/0/segment/obj", aligned(payload(300_000, 6)))
""")
    assert done.returncode == 0, done.stderr
    calls = done.after("put")
    # the compiled write finds no directory; the object is written again with
    # each directory made durable in its parent before the object's name
    assert calls[0] == "open_direct T/0/segment/.obj.tmp" and calls.count("fsync T/0/segment/.obj.tmp") == 1
    synced = [line.split()[1] for line in calls if line.startswith("fsync_dir")]
    assert synced == ["T", "T/0", "T/0/segment"]
    assert calls.index("fsync_dir T/0") < calls.index("rename T/0/segment/.obj.tmp T/0/segment/obj")
    assert (tmp_path / "cold/T/0/segment/obj").read_bytes() == _payload(300_000, 6)


@pytest.mark.parametrize("kind", ["bytes", "bytearray", "aligned", "offset"])
@pytest.mark.parametrize("size", [0, 1, PAGE - 1, PAGE, DIRECT_MIN - 1, DIRECT_MIN, DIRECT_MIN + PAGE + 1])
def test_the_compiled_write_is_exact_for_any_buffer(tmp_path: Path, kind: str, size: int) -> None:
    native = filewrite._native
    assert native is not None
    data = os.urandom(size)
    m = mmap.mmap(-1, size + 1)  # starts at a page
    at = 1 if kind == "offset" else 0
    m[at:at + size] = data
    with memoryview(m) as whole, whole[at:at + size] as view:
        buf = {"bytes": data, "bytearray": bytearray(data)}.get(kind, view)
        head = size - size % PAGE if kind == "aligned" else 0
        assert native.write_file(tmp_path / ".o.tmp", buf, head, tmp_path / "o", tmp_path) == 0
        del buf
    m.close()
    assert (tmp_path / "o").read_bytes() == data and os.listdir(tmp_path) == ["o"]


def test_the_compiled_write_refuses_heads_that_are_not_whole_aligned_pages(tmp_path: Path) -> None:
    native = filewrite._native
    assert native is not None
    m = mmap.mmap(-1, 4 * PAGE)
    with memoryview(m) as view, view[1:] as off_page:
        for buf, head in ((view, PAGE + 1), (view, 5 * PAGE), (view, -PAGE), (off_page, PAGE)):
            with pytest.raises(ValueError, match="whole pages"):
                native.write_file(tmp_path / ".o.tmp", buf, head, None, None)
    m.close()
    assert os.listdir(tmp_path) == []


def test_failures_name_the_file_they_are_about(tmp_path: Path) -> None:
    native = filewrite._native
    assert native is not None
    with pytest.raises(FileNotFoundError) as missing:
        native.write_file(tmp_path / "no/.o.tmp", b"x", 0, tmp_path / "no/o", tmp_path / "no")
    assert missing.value.filename == tmp_path / "no/.o.tmp"
    (tmp_path / "full").mkdir()
    (tmp_path / "full/x").write_bytes(b"")
    with pytest.raises(OSError) as renamed:  # a non-empty directory where the object goes
        native.write_file(tmp_path / ".o.tmp", b"x", 0, tmp_path / "full", tmp_path)
    assert renamed.value.errno in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST)
    assert (renamed.value.filename, renamed.value.filename2) == (tmp_path / ".o.tmp", tmp_path / "full")
    with pytest.raises(FileNotFoundError) as dir_gone:  # named, then its directory could not be synced
        native.write_file(tmp_path / ".o.tmp", b"x", 0, tmp_path / "o", tmp_path / "gone")
    assert dir_gone.value.filename == tmp_path / "gone" and (tmp_path / "o").read_bytes() == b"x"
    assert sorted(os.listdir(tmp_path)) == ["full", "o"]  # no temp file left by any of them
