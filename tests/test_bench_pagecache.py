"""bench/pagecache.py: the page cache the dispatch bench starts its store
from, and the share in 2 MiB pages it prints beside its figures (the
CommitLog pass's mapping cost moves with it, so a wrong share would make
the figures look like the code's doing)."""

from __future__ import annotations

import mmap
import os
import resource
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import pagecache  # noqa: E402


def test_a_file_read_back_a_page_at_a_time_is_cached_in_4_kib_pages_and_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000"
    data = os.urandom(8 << 20)
    path.write_bytes(data)
    pagecache.reread_small(path)
    assert pagecache.huge_share([path]) == 0.0
    pagecache.reread(path)
    assert path.read_bytes() == data
    assert pagecache.huge_share([]) == 0.0


def test_a_mapping_is_found_by_its_whole_path_in_this_process(tmp_path: Path) -> None:
    size = 1 << 20
    a, ab = tmp_path / "a", tmp_path / "ab"  # "ab" ends with "a": only a whole path names a mapping
    a.write_bytes(b"x" * size)
    ab.write_bytes(b"y" * size)
    with open(a, "rb") as fa, mmap.mmap(fa.fileno(), size, access=mmap.ACCESS_READ) as ma, \
            open(ab, "rb") as fb, mmap.mmap(fb.fileno(), size, access=mmap.ACCESS_READ) as mb:
        assert sum(ma[offset] for offset in range(0, size, mmap.PAGESIZE)) == ord("x") * (size // mmap.PAGESIZE)
        assert mb[0] == ord("y")
        assert pagecache._smaps_field(str(a), "Rss:") == size  # every page touched
        assert 0 < pagecache._smaps_field(str(ab), "Rss:") < size  # one page and the ones around it
        assert pagecache._smaps_field(str(tmp_path / "c"), "Rss:") == 0  # not mapped


def test_the_share_is_measured_without_raising_the_callers_peak_rss(tmp_path: Path) -> None:
    """A phase the bench starts after the measure inherits its process's peak
    RSS: mapping 64 MiB there made every later phase report over a GiB."""
    path = tmp_path / "00000000000000000000"
    with open(path, "wb") as fh:  # a MiB at a time: the test's own peak stays low
        for _ in range(64):
            fh.write(os.urandom(1 << 20))
    pagecache.reread(path)  # read back: in 2 MiB pages where the kernel caches files so
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    share = pagecache.huge_share([path])
    assert 0.0 <= share <= 1.0
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 4 << 10  # KiB
