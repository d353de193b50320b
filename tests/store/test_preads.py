"""tiered.store.preads: a span of each of many files in one call, compiled
and file by file, with the same answers; a file that is gone reads as
nothing, any other failure raises naming the file."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiered.store import preads

from nativekit import need_native

PATHS = ["compiled", "python"]


@pytest.fixture(params=PATHS)
def compiled(request, monkeypatch) -> bool:  # noqa: ANN001
    if request.param == "python":
        monkeypatch.setattr(preads, "_native", None)
    else:
        need_native()
    return request.param == "compiled"


def _spans(paths: list[str], los: list[int], ns: list[int], sizes: bool,
           keep: bool = False) -> list[tuple[bytes | None, int]]:
    got = preads.read_files(paths, np.array(los, np.int64), np.array(ns, np.int64), sizes=sizes, keep=keep)
    assert got.at.tolist() == (np.cumsum([0, *ns])[:-1]).tolist()
    if keep:
        assert got.kept is not None
        again = preads.read_kept(got.kept, np.array(los, np.int64), np.array(ns, np.int64))
        assert got.kept.tolist() == [-1] * len(paths)  # all closed
        assert [bytes(again.of(i)) if again.got[i] >= 0 else None for i in range(len(paths))] == [
            bytes(got.of(i)) if got.got[i] >= 0 else None for i in range(len(paths))]
    return [(bytes(got.of(i)) if got.got[i] >= 0 else None, int(got.sizes[i])) for i in range(len(paths))]


def _reference(paths: list[str], los: list[int], ns: list[int], sizes: bool) -> list[tuple[bytes | None, int]]:
    out: list[tuple[bytes | None, int]] = []
    for path, lo, n in zip(paths, los, ns):
        try:
            data = Path(path).read_bytes()
        except FileNotFoundError:
            out.append((None, -1))
            continue
        out.append((data[lo:lo + n], len(data) if sizes else -1))
    return out


def test_spans_short_reads_and_missing_files(tmp_path, compiled):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(bytes(range(100)))
    b.write_bytes(b"")
    paths = [str(a), str(tmp_path / "gone"), str(a), str(b), str(a), str(a)]
    los, ns = [10, 0, 95, 0, 100, 3], [5, 3, 10, 4, 7, 0]
    got = _spans(paths, los, ns, True)
    assert got == [(bytes(range(10, 15)), 100), (None, -1), (bytes(range(95, 100)), 100), (b"", 0), (b"", 100),
                   (b"", 100)]
    assert got == _reference(paths, los, ns, True)
    assert [s for _d, s in _spans(paths, los, ns, False)] == [-1] * 6


def test_no_files(compiled):
    got = preads.read_files([], np.zeros(0, np.int64), np.zeros(0, np.int64), sizes=True)
    assert len(got.data) == 0 and got.got.tolist() == [] and got.sizes.tolist() == []


def test_a_failure_other_than_a_missing_file_raises_naming_the_first_file_it_hit(tmp_path, compiled):
    a = tmp_path / "a"
    a.write_bytes(b"x" * 10)
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir2").mkdir()
    paths = [str(tmp_path / "gone"), str(a), str(tmp_path / "dir"), str(tmp_path / "dir2")]
    with pytest.raises(IsADirectoryError) as err:
        preads.read_files(paths, np.zeros(4, np.int64), np.full(4, 5, np.int64))
    assert err.value.filename == str(tmp_path / "dir")


def test_a_path_under_a_file_is_not_a_missing_file(tmp_path, compiled):
    a = tmp_path / "a"
    a.write_bytes(b"x")
    with pytest.raises(NotADirectoryError):
        preads.read_files([str(a / "b")], np.zeros(1, np.int64), np.ones(1, np.int64))


def test_arguments_are_checked_before_a_file_is_read(tmp_path, compiled):
    a = tmp_path / "a"
    a.write_bytes(b"x" * 10)
    with pytest.raises(ValueError, match="2 files, 1 offsets"):
        preads.read_files([str(a), str(a)], np.zeros(1, np.int64), np.ones(2, np.int64))
    with pytest.raises(ValueError, match="negative"):
        preads.read_files([str(a)], np.array([-1], np.int64), np.ones(1, np.int64))
    with pytest.raises(ValueError, match="negative"):
        preads.read_files([str(a)], np.zeros(1, np.int64), np.array([-1], np.int64))


def test_a_file_removed_or_truncated_after_listing_reads_as_gone_or_short(tmp_path, compiled):
    files = [tmp_path / f"f{i}" for i in range(6)]
    for f in files:
        f.write_bytes(b"y" * 4096)
    files[1].unlink()
    os.truncate(files[3], 100)
    got = _spans([str(f) for f in files], [0] * 6, [4096] * 6, True)
    assert [(None if d is None else len(d), s) for d, s in got] == [
        (4096, 4096), (None, -1), (4096, 4096), (100, 100), (4096, 4096), (4096, 4096)]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(-1, 5000), st.integers(0, 6000), st.integers(0, 3000)), max_size=30),
       st.booleans(), st.booleans())
def test_compiled_and_file_by_file_read_the_same(tmp_path_factory, files, sizes, keep):
    """Any files (-1: missing), any spans, either path, kept open and read
    again or not: what reading each file whole says."""
    root = tmp_path_factory.mktemp("spans")
    paths, los, ns = [], [], []
    for i, (length, lo, n) in enumerate(files):
        path = root / f"{i}"
        if length >= 0:
            path.write_bytes(np.random.default_rng(i).integers(0, 256, length, np.uint8).tobytes())
        paths.append(str(path))
        los.append(lo)
        ns.append(n)
    want = _reference(paths, los, ns, sizes)
    native = need_native()
    try:
        for path_ in (native, None):
            preads._native = path_
            assert _spans(paths, los, ns, sizes, keep) == want
    finally:
        preads._native = native


def test_the_compiled_call_checks_its_arrays(tmp_path):
    need_native()
    a = tmp_path / "a"
    a.write_bytes(b"x" * 10)
    one, out = np.zeros(1, np.int64), np.zeros(4, np.uint8)
    ok = dict(los=one, ns=np.full(1, 4, np.int64), out=out, ats=one, got=one.copy(), sizes=one.copy(),
              errs=one.copy())

    def call(**kw: np.ndarray) -> None:
        args = {**ok, **kw}
        preads._native.read_files([str(a)], args["los"], args["ns"], args["out"], args["ats"], args["got"],
                                  args["sizes"], args["errs"], True, None)

    call()
    assert bytes(out) == b"xxxx"
    with pytest.raises(ValueError, match="los must be an int64 array"):
        call(los=np.zeros(2, np.int64))
    with pytest.raises(ValueError, match="do not fit out"):
        call(ns=np.full(1, 5, np.int64))
    with pytest.raises(ValueError, match="do not fit out"):
        call(ats=np.full(1, 1, np.int64))
    with pytest.raises((BufferError, ValueError), match="read-only|not writable"):
        call(got=np.frombuffer(bytes(8), np.int64))  # the answers need writable arrays


def _open_fds() -> set[int]:
    return {int(n) for n in os.listdir("/proc/self/fd")}


def test_kept_files_are_read_again_then_closed_once(tmp_path, compiled):
    """``keep``: the files stay open after the first read (a file removed or
    cut meanwhile is read as it is now through its descriptor: removed, its
    bytes are still there; cut, they are not), ``read_kept`` reads them again
    and closes every one, once; ``close_kept`` after it closes nothing."""
    files = [tmp_path / f"k{i}" for i in range(5)]
    for i, f in enumerate(files):
        f.write_bytes(bytes([i]) * 100)
    before = _open_fds()
    paths = [str(f) for f in files[:2]] + [str(tmp_path / "gone")] + [str(f) for f in files[2:]]
    first = preads.read_files(paths, np.zeros(6, np.int64), np.full(6, 10, np.int64), sizes=True, keep=True)
    kept = first.kept
    assert kept is not None and (kept[[0, 1, 3, 4, 5]] >= 0).all() and kept[2] == -1
    assert len(_open_fds() - before) == 5
    files[0].unlink()
    os.truncate(files[1], 40)
    again = preads.read_kept(kept, np.full(6, 35, np.int64), np.array([20, 20, 20, 0, 5, 20], np.int64))
    assert [bytes(again.of(i)) if again.got[i] >= 0 else None for i in range(6)] == [
        b"\0" * 20, b"\1" * 5, None, b"", b"\3" * 5, b"\4" * 20]
    assert kept.tolist() == [-1] * 6 and _open_fds() == before
    preads.close_kept(kept)  # nothing left to close
    assert _open_fds() == before


def test_kept_files_are_closed_when_the_first_read_fails(tmp_path, compiled):
    a = tmp_path / "a"
    a.write_bytes(b"x" * 10)
    (tmp_path / "dir").mkdir()
    before = _open_fds()
    with pytest.raises(IsADirectoryError):
        preads.read_files([str(a), str(tmp_path / "dir"), str(a)], np.zeros(3, np.int64), np.ones(3, np.int64),
                          keep=True)
    assert _open_fds() == before
    kept = preads.read_files([str(a)], np.zeros(1, np.int64), np.ones(1, np.int64), keep=True).kept
    assert kept is not None and len(_open_fds() - before) == 1
    preads.close_kept(kept)
    assert kept.tolist() == [-1] and _open_fds() == before
