"""The page cache a benchmark's store starts from (bench/dispatch.py): every
file dropped and read back, as a broker's cache holds a CommitLog read from
disk, or read back a page at a time (4 KiB pages, a reference); and the
share of it the kernel maps in 2 MiB pages, which the CommitLog pass's
mapping cost moves with."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
from pathlib import Path

HUGE_PAGE = 2 << 20  # x86-64's PMD-sized page


def reread(path: Path) -> None:
    """``path`` dropped from the page cache (written back first), then read
    whole: the same cache state whatever wrote the file and when."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)


def reread_small(path: Path) -> None:
    """``path`` dropped from the page cache, then read back a page at a time
    with readahead off: the cache in 4 KiB pages, as a kernel without large
    folios for the file system, or a copy made with ``cp``, leaves it."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # this open file only
        page = mmap.PAGESIZE
        for offset in range(0, os.fstat(fd).st_size, page):
            os.pread(fd, page, offset)
    finally:
        os.close(fd)


def huge_share(paths: list[Path]) -> float:
    """The share of the files' bytes the kernel maps in 2 MiB pages (their
    page cache in PMD-sized folios). What the pass's mapping costs depends
    on it (4 KiB pages: 16 page faults a MiB instead of one per 2). Measured
    in a process of its own: mapped here, the files would raise this
    process's peak RSS, and every phase started after it would report that
    peak as its own (a forked child's ``ru_maxrss`` starts from its parent's)."""
    out = subprocess.run([sys.executable, __file__, *map(str, paths)], capture_output=True, text=True, check=True)
    return float(out.stdout)


def _huge_share_here(paths: list[Path]) -> float:
    """``huge_share`` in this process: each file mapped, a byte touched every
    2 MiB, and counted in /proc/self/smaps."""
    huge = total = 0
    for path in paths:
        size = path.stat().st_size
        if not size:
            continue
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_READ) as mm:
            for offset in range(0, size, HUGE_PAGE):
                mm[offset]
            huge += _smaps_field(str(path), "FilePmdMapped:")
        total += size
    return huge / total if total else 0.0


def _smaps_field(path: str, field: str) -> int:
    """``field`` of this process's mapping of ``path`` in /proc/self/smaps, in bytes."""
    inside = False
    with open("/proc/self/smaps") as fh:
        for line in fh:
            if not line[0].isupper():  # a mapping's header: address range, ..., path
                inside = line.rstrip("\n").endswith(" " + path)
            elif inside and line.startswith(field):
                return int(line.split()[1]) * 1024
    return 0


if __name__ == "__main__":
    print(_huge_share_here([Path(p) for p in sys.argv[1:]]))
