"""How a ``file://`` object's bytes reach the disk: through the page cache,
or around it (O_DIRECT), then fsynced either way.

A segment object (``DIRECT_MIN`` bytes or more, in a buffer starting at a
multiple of ``DIRECT_ALIGN``: the dispatcher's segment buffers are,
dispatcher/segment.py) is written around the page cache: its whole pages
with O_DIRECT, the short tail through the cache, then fsynced as any other.
The kernel then reads the bytes straight from the buffer instead of copying
them into cache pages (the largest cost of a buffered write here), and
archived objects, never read back by the dispatcher, do not push the
broker's CommitLog out of the cache. Anything else (small, unaligned,
compressed bytes, manifests) goes through the cache. A file system refusing
O_DIRECT (EINVAL, at the open or a write) gets the whole object written
through the cache, and is not asked again by the same writer.

Durability does not depend on the path taken: the file is fsynced in both,
and the name and directory protocol (tiered/archive/filestore.py FileStore,
tiered/archive/dirsync.py) is the same.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
from pathlib import Path

import numpy as np

from tiered.format.segbuffer import SegmentBuffer

log = logging.getLogger(__name__)


# Objects from this size on whose buffer starts at a multiple of DIRECT_ALIGN
# are written around the page cache. Measured here (ext4, an fsync per
# object, kernel threads' CPU counted too): a direct write of 16 MiB costs a
# fifth of a buffered one's system time, of 1 MiB a third to four fifths; of
# 256 KiB a little less (a round over 1,000 queues, whose objects are that
# big, took less CPU in 13 of 15 paired runs); of 64-128 KiB more (the
# object's create and fsync dominate, and a direct write adds to them).
DIRECT_MIN = 256 << 10
DIRECT_ALIGN = 4096  # O_DIRECT's alignment of address, offset and length on Linux (a page covers any block size up to it)
_O_DIRECT = getattr(os, "O_DIRECT", 0)  # 0 where there is none: never direct


def write_whole(path: Path, data: bytes | bytearray | memoryview | SegmentBuffer, *, sync: bool) -> None:
    """``data`` into the file ``path`` (created or truncated) through the page
    cache, fsynced when ``sync``. System calls only, no file object: Python's
    ``open`` adds a stat, a terminal check and a seek to every file, and each
    call hands the GIL over to a thread that wants it (at 1,000 queues, 6 of
    the ~45 system calls an upload thread makes a segment)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
    try:
        with memoryview(data) as view, view.cast("B") as flat:
            _write_rest(fd, flat, 0)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def _wrote(n: int) -> int:
    if n <= 0:  # a write that never ends would loop here forever
        raise OSError(errno.EIO, "write wrote nothing")
    return n


def _write_rest(fd: int, view: memoryview, done: int) -> None:
    """``view[done:]`` written to ``fd``, however many writes it takes."""
    while done < len(view):
        done += _wrote(os.write(fd, view[done:]))


class FileWriter:
    """Writes and fsyncs files for one store root; remembers whether its file
    system refuses O_DIRECT. Thread-safe (the flag only ever goes down)."""

    def __init__(self, root: str, *, direct: bool = True) -> None:
        self.root = root
        self.direct = direct and _O_DIRECT != 0  # set to False when the file system refuses it

    def write(self, path: Path, data: bytes | SegmentBuffer) -> None:
        """``data`` into the file ``path`` (created or truncated), fsynced."""
        head = self._direct_bytes(data)
        if head and self._write_direct(path, data, head):
            return
        write_whole(path, data, sync=True)

    def _direct_bytes(self, data: bytes | SegmentBuffer) -> int:
        """How many of ``data``'s first bytes to write with O_DIRECT: its
        whole pages when it is big and starts at a page; else 0."""
        if not self.direct or len(data) < DIRECT_MIN:
            return 0
        try:
            address = np.frombuffer(data, np.uint8).ctypes.data
        except (TypeError, ValueError):  # not a plain buffer of bytes
            return 0
        return len(data) - len(data) % DIRECT_ALIGN if address % DIRECT_ALIGN == 0 else 0

    def _write_direct(self, path: Path, data: bytes | SegmentBuffer, head: int) -> bool:
        """``data`` into ``path``: its first ``head`` bytes with O_DIRECT (the
        kernel reads them from ``data`` itself, no page-cache copy), the rest
        through the cache, then fsynced: as durable as a buffered write. False,
        with nothing to clean up (the buffered write truncates ``path``), when
        the file system refuses O_DIRECT; this writer then stops asking."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        try:
            fd = os.open(path, flags | _O_DIRECT, 0o666)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise  # FileNotFoundError among them: the caller makes the directory
            self._refuse(exc)
            return False
        try:
            with memoryview(data) as view:
                done = 0
                try:
                    while done < head:
                        n = _wrote(os.write(fd, view[done:head]))
                        done += n
                        if n % DIRECT_ALIGN:
                            break  # a short write off a page boundary: the rest through the cache
                    if done < len(view):
                        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~_O_DIRECT)
                except OSError as exc:
                    if exc.errno != errno.EINVAL:
                        raise
                    self._refuse(exc)
                    return False
                _write_rest(fd, view, done)
            os.fsync(fd)
        finally:
            os.close(fd)
        return True

    def _refuse(self, exc: OSError) -> None:
        if self.direct:
            self.direct = False  # per store: not asked again for every object
            log.info("%s refuses O_DIRECT writes (%s): writing objects through the page cache", self.root,
                     exc.strerror or exc)
