"""Reading one queue of a broker store as validated batches: the state of
``LocalStore.iter_batches`` as a small object with named steps.

A cursor walks the queue's ConsumeQueue chunk by chunk (the written
entries of one file from the current offset) and reads each entry's
record from a *window* of the CommitLog file that holds it:

- ``_chunk``: find the ConsumeQueue file of the current offset and its
  written entries (a new file is found without a rescan; a deleted one is
  ``ExpiredLocallyError``);
- ``_fast_run``: the ordinary records of a run of entries, checked at once
  by ``batch.check_run`` when they lie in the current window;
- ``_one_entry``: everything else, record by record: fillers, impossible
  entries, tails still being written, window and file changes, errors
  with their file and offset, and every record of an LMQ queue (its
  parents' records, ``tiered.format.lmq``);
- ``_move_window``: the window onto the CommitLog file holding a record;
  the pages behind it are given back every ``_RELEASE_EVERY`` bytes.

See ``LocalStore.iter_batches`` for the contract; the module docstring of
``tiered.store.localstore`` for the races this is built for.
"""

from __future__ import annotations

import struct
from collections.abc import Generator, Iterator
from typing import TYPE_CHECKING

import numpy as np

from tiered.format.batch import CQ_DTYPE, RecordBatch, check_run
from tiered.format.codec import CQ_ENTRY, CQ_ENTRY_SIZE, CQ_FILLER_SIZE, decode_and_check
from tiered.format.lmq import is_lmq
from tiered.errors import CorruptRecordError, NotWrittenYetError

if TYPE_CHECKING:
    from tiered.store.localstore import LocalStore

EMPTY = memoryview(b"")
NO_LIMIT = 1 << 62  # compared with int64 arrays: must fit one
# the window ends this far past where it starts: pages behind are given back there
_RELEASE_EVERY = 32 << 20
# at most so many ConsumeQueue entries are checked at once (bounds the arrays)
_RUN = 8192
# a run's pages are mapped at once when its records fill at least 1/_DENSE of them
_DENSE = 4
_I32 = struct.Struct(">i")
_unpack = CQ_ENTRY.unpack_from


class _Chunk:
    """The written entries of one ConsumeQueue file from the cursor's offset."""

    __slots__ = ("start", "view", "entries", "count", "base", "last")

    def __init__(self, start: int, view: memoryview, first: int, hi: int, offset: int) -> None:
        self.start = start  # the file's start byte
        self.view = view
        self.entries = np.frombuffer(view, CQ_DTYPE, count=hi - first, offset=first * CQ_ENTRY_SIZE)
        self.count = hi - first
        self.base = offset - first  # entry index in the file -> queue offset
        self.last = offset + self.count - 1  # queue offset of the chunk's last entry (maybe being written)

    def entry(self, offset: int) -> tuple[int, int, int]:
        return _unpack(self.view, (offset - self.base) * CQ_ENTRY_SIZE)


class QueueCursor:
    """One pass over one queue; ``batches()`` once."""

    def __init__(self, store: LocalStore, topic: str, queue_id: int, offset: int, *, max_count: int | None,
                 max_bytes: int | None, verify_crc: bool) -> None:
        self.store = store
        self.files = store.queue_files(topic, queue_id)
        self.topic = topic
        self.queue_id = queue_id
        self.topic_raw = topic.encode("utf-8")
        # a BatchCQ queue: offsets number its entries, each record's queue
        # offset is its entry's base offset (checked record by record)
        self.batch = self.files.is_batch
        # an LMQ queue's records are its parents': check_run would refuse each one
        self.lmq = is_lmq(topic)
        self.verify_crc = verify_crc
        confirmed = store.confirmed_offset()
        self.phys_limit = confirmed if confirmed is not None else NO_LIMIT
        self.offset = offset  # the next queue offset to read
        self.remaining = max_count if max_count is not None else NO_LIMIT
        self.budget = max_bytes if max_bytes is not None else NO_LIMIT
        self.total = 0  # bytes yielded
        self.cq_start = -1  # the ConsumeQueue file in use
        # The window: CommitLog file ``cl_start`` as ``cl_view``, read up to
        # ``cl_limit``; pages below ``cl_released`` given back, up to
        # ``cl_populated`` mapped at once.
        self.cl_start, self.cl_view, self.cl_limit, self.cl_source = 0, EMPTY, 0, ""
        self.cl_released = 0
        self.cl_populated = 0

    def batches(self) -> Iterator[RecordBatch]:
        if self.remaining <= 0:
            return
        try:
            while True:
                chunk = self._chunk()
                if chunk is None:
                    return
                if not (yield from self._read_chunk(chunk)):
                    return
                # the chunk never holds more than ``remaining`` entries
                self.remaining -= chunk.count
                if self.remaining == 0:
                    return
        finally:
            # give back what this pass touched; views stay valid
            if self.cl_view is not EMPTY:
                self.store.commitlog.release(self.cl_start, self.cl_released, self.cl_limit)
            if self.cq_start >= 0:
                self.files.release(self.cq_start)

    # --- the ConsumeQueue ---------------------------------------------------------

    def _chunk(self) -> _Chunk | None:
        """The written entries from the cursor's offset in its ConsumeQueue
        file, at most ``remaining``; None: nothing (more) written yet."""
        files = self.files
        while True:
            byte = self.offset * CQ_ENTRY_SIZE
            start = files.locate(byte)
            if start is None:
                files.refresh()
                start = files.locate(byte)
                if start is None:
                    if not files.starts:
                        return None  # no ConsumeQueue file (yet): nothing written
                    raise self.store.expired_error(self.topic, self.queue_id, self.offset)
            rel = byte - start
            if start != self.cq_start:
                if self.cq_start >= 0:
                    files.release(self.cq_start)  # done with the previous ConsumeQueue file
                self.cq_start = start
            try:
                view = files.view(start, rel + CQ_ENTRY_SIZE)  # remapped if it grew
            except FileNotFoundError:
                files.refresh()
                raise self.store.expired_error(self.topic, self.queue_id, self.offset) from None
            slot = files.entries_per_file(start, view) * CQ_ENTRY_SIZE
            if rel < slot:
                break
            # past this file: the next one may not exist yet
            files.refresh()
            nxt = files.locate(byte)
            if nxt == start or nxt is None:
                return None
        end = min(len(view), slot)
        if rel + CQ_ENTRY_SIZE > end:
            return None  # the file is shorter than its slot: this entry is not written yet
        first = rel // CQ_ENTRY_SIZE
        hi = _written_end(view, first, min(end, rel + self.remaining * CQ_ENTRY_SIZE) // CQ_ENTRY_SIZE)
        if hi == first:
            return None  # nothing written past this offset yet
        return _Chunk(start, view, first, hi, self.offset)

    def _read_chunk(self, chunk: _Chunk) -> Generator[RecordBatch, None, bool]:
        """The chunk's records; returns False when the pass ends inside it."""
        i = 0
        while i < chunk.count:
            batch = self._fast_run(chunk, i)
            if batch is None:
                batch = self._one_entry(chunk)
                if batch is None:
                    return False
            yield batch
            self.total += batch.nbytes
            self.offset += batch.count
            i += batch.count
        return True

    # --- records ----------------------------------------------------------------

    def _fast_run(self, chunk: _Chunk, i: int) -> RecordBatch | None:
        """The ordinary entries from ``i`` up to (not including) the chunk's
        last whose records lie in the window, checked at once; None when
        not even the first qualifies."""
        j = min(chunk.count - 1, i + _RUN)
        if j <= i or self.cl_view is EMPTY or self.batch or self.lmq:
            return None
        run = chunk.entries[i:j]
        phys = run["phys"].astype(np.int64)
        size = run["size"].astype(np.int64)
        pos = phys - self.cl_start
        ok = ((size > 0) & (size != CQ_FILLER_SIZE) & (pos >= 0) & (pos + size <= self.cl_limit)
              & (phys + size <= self.phys_limit) & (self.total + np.cumsum(size) <= self.budget))
        k = int(np.argmin(ok)) if not ok.all() else len(ok)
        if not k:
            return None
        self._populate(int(size[:k].sum()), int(pos[0]), int(pos[k - 1] + size[k - 1]))
        return check_run(self.cl_view, self.cl_start, run[:k], topic=self.topic_raw, queue_id=self.queue_id,
                         first_offset=self.offset, source=self.cl_source, verify_crc=self.verify_crc)

    def _populate(self, nbytes: int, lo: int, run_end: int) -> None:
        """Map a run's pages in one call when its records (``nbytes`` of them)
        fill at least a quarter of the range: page faults would map it all
        anyway. A queue interleaved with many others' would map pages it
        never reads, once per queue read: there faults are cheaper (measured
        with 16 queues: 20 % less CPU for the whole read)."""
        if run_end <= self.cl_populated:
            return
        lo = max(self.cl_populated, lo)
        if nbytes * _DENSE >= run_end - lo:
            self.store.commitlog.populate(self.cl_start, lo, run_end)
        self.cl_populated = run_end

    def _one_entry(self, chunk: _Chunk) -> RecordBatch | None:
        """The record of the entry at the cursor's offset, decoded field by
        field; None: the pass ends here (end of data, a tail still being
        written, a limit). Raises the typed errors."""
        offset = self.offset
        entry = chunk.entry(offset)
        phys, size, tags = entry
        if size <= 0 or size == CQ_FILLER_SIZE or phys < 0:
            if size == 0:
                return None
            if size == CQ_FILLER_SIZE:
                raise self.store.expired_error(self.topic, self.queue_id, offset)
            raise CorruptRecordError(str(self.files.path(chunk.start)), (offset - chunk.base) * CQ_ENTRY_SIZE,
                                     f"ConsumeQueue entry ({phys}, {size}, {tags}) is impossible")
        if phys + size > self.phys_limit:
            return None
        if self.total and self.total + size > self.budget:
            return None
        try:
            pos = phys - self.cl_start
            if pos < 0 or pos + size > self.cl_limit:
                if not self._move_window(phys, size, offset == chunk.last, offset):
                    return None
                pos = phys - self.cl_start
            expect = self.files.unit(offset).base_offset if self.batch else offset  # type: ignore[attr-defined]
            rec = decode_and_check(self.cl_view, pos, self.cl_source, self.topic_raw, self.queue_id, expect, phys,
                                   size, self.verify_crc)
        except NotWrittenYetError:
            if offset != chunk.last:
                raise self.store.missing_record_error(phys, offset) from None
            return None  # the tail: not (completely) written yet
        except CorruptRecordError:
            if chunk.entry(offset) != entry:
                return None  # the entry changed under us: it was being written
            raise
        if offset == chunk.last and chunk.entry(offset) != entry:
            return None  # still being written: next round
        return RecordBatch.of_record(offset, tags, rec, self.cl_view)

    def _move_window(self, phys: int, size: int, is_last: bool, offset: int) -> bool:
        """Make the window hold the ``size`` bytes at ``phys``; False: they are
        the tail, not (completely) written yet."""
        commitlog = self.store.commitlog
        pos = phys - self.cl_start
        if 0 <= pos and pos + size <= len(self.cl_view):
            # a release point in the same file: give back what is behind
            commitlog.release(self.cl_start, self.cl_released, pos)
        else:
            try:
                window = self.store.commitlog_window(phys, size)
            except FileNotFoundError:
                raise self.store.expired_error(self.topic, self.queue_id, offset) from None
            if window is None:
                if not is_last:
                    raise self.store.missing_record_error(phys, offset)
                return False
            if self.cl_view is not EMPTY and window[0] != self.cl_start:
                commitlog.release(self.cl_start, self.cl_released)  # done with that file
            self.cl_start, self.cl_view, self.cl_source = window
            pos = phys - self.cl_start
        self.cl_released = self.cl_populated = pos
        self.cl_limit = min(len(self.cl_view), pos + _RELEASE_EVERY)
        return True


def _written_end(view: memoryview, first: int, hi: int) -> int:
    """The entry index in [first, hi] where the written entries end (the
    first of size 0; entries are written in order), by bisection. An entry
    is not written atomically: the last one may be the tail the broker is
    completing, which the reader checks again after its record."""
    size_at = _I32.unpack_from
    if size_at(view, hi * CQ_ENTRY_SIZE - 12)[0] != 0:
        return hi
    lo = first
    while lo < hi:
        mid = (lo + hi) // 2
        if size_at(view, mid * CQ_ENTRY_SIZE + 8)[0] != 0:
            lo = mid + 1
        else:
            hi = mid
    return hi
