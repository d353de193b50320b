"""A store directory's files named by their 20-digit start byte (the
CommitLog's, a ConsumeQueue's), each mapped read-only once and remapped
when it grew: what ``LocalStore`` and the CommitLog pass read through."""

from __future__ import annotations

import mmap
import os
from bisect import bisect_right
from pathlib import Path

from tiered.format.codec import CQ_ENTRY_SIZE
from tiered.store.cqscan import written_by_reads
from tiered.store.queuecursor import EMPTY as _EMPTY

_MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)  # Linux >= 5.14; the name is Python >= 3.13


class FileSet:
    """Files of one directory named by their 20-digit start byte offset."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        # a string, and a Path only when asked: a round looks at a thousand
        # queues' directories, pathlib's joins cost more than the look
        self._directory = os.fspath(directory)
        self._prefix = os.path.join(self._directory, "")  # files' names without a Path each
        self.starts: list[int] = []
        self._maps: dict[int, tuple[mmap.mmap | None, memoryview]] = {}
        self.refresh()

    @property
    def directory(self) -> Path:
        return Path(self._directory)

    def refresh(self) -> None:
        try:
            names = os.listdir(self._directory)
        except FileNotFoundError:
            names = []
        self.starts = sorted(int(n) for n in names if len(n) == 20 and n.isascii() and n.isdigit())
        for start in list(self._maps):
            if start not in self.starts:
                self._drop(start)

    def path(self, start: int) -> Path:
        return self.directory / f"{start:020d}"

    def name(self, start: int) -> str:
        """``path(start)`` as a string, without making a Path (a pass names
        a file of each of a thousand queues)."""
        return f"{self._prefix}{start:020d}"

    def locate(self, offset: int) -> int | None:
        """Start of the file that may hold ``offset`` (None: before the first file)."""
        i = bisect_right(self.starts, offset) - 1
        return self.starts[i] if i >= 0 else None

    def view(self, start: int, need_end: int = 0) -> memoryview:
        """A read-only view of the whole file; remapped when it grew past what
        was mapped and ``need_end`` (relative) lies beyond it."""
        cached = self._maps.get(start)
        if cached is not None and (need_end <= len(cached[1])):
            return cached[1]
        if cached is not None:
            self._drop(start)
        fd = os.open(self.name(start), os.O_RDONLY)  # FileNotFoundError: expired
        try:
            length = os.fstat(fd).st_size
            if length == 0:
                entry: tuple[mmap.mmap | None, memoryview] = (None, _EMPTY)
            else:
                mm = mmap.mmap(fd, length, access=mmap.ACCESS_READ)
                entry = (mm, memoryview(mm))
        finally:
            os.close(fd)
        self._maps[start] = entry
        return entry[1]

    def read(self, start: int, lo: int, n: int) -> tuple[bytes, int]:
        """Bytes [lo, lo + n) of file ``start`` as it is now (fewer where it
        ends) in one ``pread``, and the file's size: nothing mapped, so no
        page to fault in and none to give back after. (One file's read of
        what the CommitLog pass reads for all its queues in one call,
        ``tiered.store.preads``; the tests' reference for it.) Raises
        FileNotFoundError when the file is gone."""
        fd = os.open(self.name(start), os.O_RDONLY | os.O_CLOEXEC)
        try:
            return os.pread(fd, n, lo), os.fstat(fd).st_size
        finally:
            os.close(fd)

    def read_bytes(self, start: int, lo: int, n: int) -> bytes:
        """``read`` without the file's size: one system call less (each gives
        the GIL up; the CommitLog pass reads on this way only for a queue
        with more entries pending than its first read held)."""
        fd = os.open(self.name(start), os.O_RDONLY | os.O_CLOEXEC)
        try:
            return os.pread(fd, n, lo)
        finally:
            os.close(fd)

    def release(self, start: int, lo: int = 0, hi: int | None = None) -> None:
        """Give back this process's pages of file ``start`` from the page
        holding ``lo`` to the page boundary at or below ``hi`` (relative;
        None: the end). They stay in the page cache and every view stays
        valid (a later access faults the page in again); only the resident
        set shrinks, so a reader's RSS is bounded by what it reads at a
        time, not by the size of the store."""
        cached = self._maps.get(start)
        if cached is None or cached[0] is None:
            return
        mm = cached[0]
        page = mmap.PAGESIZE
        lo -= lo % page
        hi = len(mm) if hi is None or hi >= len(mm) else hi - hi % page
        if hi > lo:
            try:
                mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
            except (AttributeError, OSError, ValueError):
                pass  # advisory only

    def release_all(self) -> None:
        """``release`` every file mapped so far, whole."""
        for start in list(self._maps):
            self.release(start)

    def populate(self, start: int, lo: int, hi: int) -> None:
        """Map this process's pages of file ``start`` for bytes [lo, hi) in
        one call: a reader about to touch all of them (every record of a
        run) saves a page fault per few pages. Advisory: a kernel older
        than 5.14 faults them in as they are touched."""
        cached = self._maps.get(start)
        if cached is None or cached[0] is None:
            return
        mm = cached[0]
        lo -= lo % mmap.PAGESIZE
        hi = min(hi, len(mm))
        if hi > lo:
            try:
                mm.madvise(_MADV_POPULATE_READ, lo, hi - lo)
            except (AttributeError, OSError, ValueError):
                pass

    def _drop(self, start: int) -> None:
        # Forget the map, never release or close it here: a suspended
        # iter_queue or a Record may still hold the view (or a slice of it),
        # and a released view would fail under them. The mapping is unmapped
        # when the last reference goes (munmap; its fd is mmap's own dup).
        del self._maps[start]

    def close(self) -> None:
        for start in list(self._maps):
            self._drop(start)


class QueueFiles(FileSet):
    is_batch = False  # a BatchConsumeQueue shown as a ConsumeQueue (tiered.store.batchcq)
    unit_size = CQ_ENTRY_SIZE  # bytes of one entry in the files themselves

    def __init__(self, directory: str | os.PathLike[str], topic: str, queue_id: int) -> None:
        super().__init__(directory)
        self.topic = topic
        self.queue_id = queue_id
        # file start -> written entries at the last look (a hint, checked when used)
        self.written: dict[int, int] = {}

    def written_count(self, start: int, n: int) -> int:
        """Written entries of the first ``n`` of file ``start``, from the file."""
        return written_by_reads(self.name(start), n)

    def file_size(self, start: int) -> int:
        return self.path(start).stat().st_size

    def entries_per_file(self, start: int, view: memoryview) -> int:
        """Derived from the next file's name when there is one (files may be
        cut short by a crashed writer), else from the file's length."""
        i = self.starts.index(start)
        if i + 1 < len(self.starts):
            return (self.starts[i + 1] - start) // CQ_ENTRY_SIZE
        return len(view) // CQ_ENTRY_SIZE

    def entries_end(self, start: int, size: int) -> int:
        """Where the entries of file ``start`` (of ``size`` bytes) end, as
        ``entries_per_file`` bounds them: the next file's start when there is
        one, the file's end else."""
        i = bisect_right(self.starts, start)
        if i < len(self.starts) and i > 0 and self.starts[i - 1] == start:
            return min(size, (self.starts[i] - start) // CQ_ENTRY_SIZE * CQ_ENTRY_SIZE)
        return size
