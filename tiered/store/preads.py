"""A span of each of many files, read in one call.

The CommitLog pass (dispatcher.commitpass) reads a few KiB of ConsumeQueue
entries for each of up to thousands of queues, then reads each queue's last
entry again. File by file that is three or four system calls a queue, and
each gives the GIL up: while the upload threads run Python, the pass waits
to get it back after every one (at 1,000 queues most of the pass's wall
time went there). ``read_files`` makes all of a pass's reads in one call:
in the native core (tiered/_native_reads.c), the GIL given up once; else
file by file with ``os`` calls, with the same answers (held equal by
tests/store/test_preads.py).

Nothing is mapped: no page to fault in, none to give back after, and a file
truncated meanwhile reads short instead of raising SIGBUS.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass

import numpy as np

from tiered import native

# the native core's reads (tiered/_native_reads.c), or None: file by file
_native = native.core


@dataclass(frozen=True, kw_only=True, slots=True)
class Spans:
    """What ``read_files`` read: file i's bytes are ``data[at[i]:at[i] + got[i]]``."""

    data: np.ndarray  # uint8
    at: np.ndarray  # int64, where each file's slot starts in ``data``
    got: np.ndarray  # int64, bytes read (fewer than asked: the file ends there); -1: no such file
    sizes: np.ndarray  # int64, each file's size after its read (-1: not asked, or no such file)
    # read_files(keep=True): each file's descriptor, left open for ``read_kept`` (-1: none)
    kept: np.ndarray | None = None

    def of(self, i: int) -> memoryview:
        """File i's bytes (empty when it does not exist)."""
        at = int(self.at[i])
        return memoryview(self.data.data)[at:at + max(0, int(self.got[i]))]


def read_files(paths: list[str], los: np.ndarray, ns: np.ndarray, *, sizes: bool = False,
               keep: bool = False) -> Spans:
    """Bytes [los[i], los[i] + ns[i]) of each file ``paths[i]``, fewer where
    it ends, each in its own slot of one buffer; with each file's size read
    after its bytes when ``sizes``. A file that does not exist reads as
    got -1 (the caller decides what a file gone means). Any other failure
    raises the OSError of the first file (in order) it happened to, naming
    it, as reading file by file would. ``keep``: the files are left open
    (``Spans.kept``) for one ``read_kept``, which closes them: a file read
    again later costs a read, not an open and a close (the caller must
    make that call, or ``close_kept``, whatever happens)."""
    n = len(paths)
    los, ns = _spans(n, los, ns)
    at, data = _slots(ns)
    got, size, errs = np.zeros(n, np.int64), np.full(n, -1, np.int64), np.zeros(n, np.int64)
    kept = np.full(n, -1, np.int64) if keep else None
    if _native is not None:
        _native.read_files(paths, los, ns, data, at, got, size, errs, sizes, kept)
    else:
        _read_one_by_one(paths, los, ns, data, at, got, size, errs, sizes, kept)
    try:
        _raise_first(errs, got, paths)
    except OSError:
        if kept is not None:
            close_kept(kept)
        raise
    size[got < 0] = -1
    return Spans(data=data, at=at, got=got, sizes=size, kept=kept)


def read_kept(kept: np.ndarray, los: np.ndarray, ns: np.ndarray) -> Spans:
    """Bytes [los[i], los[i] + ns[i]) of each file ``read_files(keep=True)``
    left open (``kept[i]``; -1: none, read as got -1), then every one of
    them closed, once: ``kept`` is set to -1 as they are (a descriptor's
    number is the next open's). Raises the OSError of the first failed
    read, after closing them all."""
    n = len(kept)
    los, ns = _spans(n, los, ns)
    at, data = _slots(ns)
    got, errs = np.zeros(n, np.int64), np.zeros(n, np.int64)
    names = [f"descriptor {fd}" for fd in kept.tolist()]
    if _native is not None:
        _native.read_fds(kept, los, ns, data, at, got, errs)
    else:
        _read_kept_one_by_one(kept, los, ns, data, at, got, errs)
    _raise_first(errs, got, names)
    return Spans(data=data, at=at, got=got, sizes=np.full(n, -1, np.int64))


def close_kept(kept: np.ndarray) -> None:
    """Every descriptor of ``kept`` still open closed, once (``read_kept``
    reading nothing)."""
    none = np.zeros(len(kept), np.int64)
    if (kept >= 0).any():
        read_kept(kept, none, none)


def _spans(n: int, los: np.ndarray, ns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    los = np.ascontiguousarray(los, np.int64)
    ns = np.ascontiguousarray(ns, np.int64)
    if len(los) != n or len(ns) != n:
        raise ValueError(f"{n} files, {len(los)} offsets and {len(ns)} lengths")
    if n and (int(los.min()) < 0 or int(ns.min()) < 0):
        raise ValueError("offsets and lengths cannot be negative")
    return los, ns


def _slots(ns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each file's bytes go in one buffer, and the buffer (not zeroed:
    every byte handed out was read into it)."""
    at = np.zeros(len(ns), np.int64)
    if len(ns):
        np.cumsum(ns[:-1], out=at[1:])
    return at, np.empty(int(at[-1] + ns[-1]) if len(ns) else 0, np.uint8)


def _raise_first(errs: np.ndarray, got: np.ndarray, names: list[str]) -> None:
    """The first failure but a missing file raised; missing files got -1."""
    failed = np.flatnonzero(errs)
    for i in failed.tolist():
        code = int(errs[i])
        if code != errno.ENOENT:
            raise OSError(code, os.strerror(code), names[i])
    got[failed] = -1


def _read_one_by_one(paths: list[str], los: np.ndarray, ns: np.ndarray, data: np.ndarray, at: np.ndarray,
                     got: np.ndarray, size: np.ndarray, errs: np.ndarray, sizes: bool, kept: np.ndarray | None) -> None:
    """The native ``read_files`` in Python: the same reads, file by file."""
    out = data.data
    for i, (path, lo, n, slot) in enumerate(zip(paths, los.tolist(), ns.tolist(), at.tolist())):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            errs[i] = exc.errno or errno.EIO
            continue
        try:
            got[i] = _pread_into(fd, out, slot, lo, n)
            if sizes:
                size[i] = os.fstat(fd).st_size
        except OSError as exc:
            errs[i] = exc.errno or errno.EIO
            got[i] = 0
        finally:
            if kept is not None and not errs[i]:
                kept[i] = fd
            else:
                os.close(fd)


def _read_kept_one_by_one(kept: np.ndarray, los: np.ndarray, ns: np.ndarray, data: np.ndarray, at: np.ndarray,
                          got: np.ndarray, errs: np.ndarray) -> None:
    """The native ``read_fds`` in Python."""
    out = data.data
    for i, (fd, lo, n, slot) in enumerate(zip(kept.tolist(), los.tolist(), ns.tolist(), at.tolist())):
        if fd < 0:
            got[i] = -1
            continue
        try:
            got[i] = _pread_into(fd, out, slot, lo, n)
        except OSError as exc:
            errs[i] = exc.errno or errno.EIO
            got[i] = 0
        finally:
            os.close(fd)
            kept[i] = -1


def _pread_into(fd: int, out: memoryview, slot: int, lo: int, n: int) -> int:
    done = 0
    while done < n:
        r = os.preadv(fd, [out[slot + done:slot + n]], lo + done)
        if r == 0:
            break
        done += r
    return done
