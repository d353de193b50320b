"""Read a broker's store directory, read-only, while the broker writes it.

Layout::

    {store}/commitlog/{startByte:020d}                 records, preallocated files
    {store}/consumequeue/{topic}/{queueId}/{startByte:020d}   20-byte entries
    {store}/config/topics.json (+ .bak)                 broker configuration
    {store}/checkpoint                                  confirm offset at byte 32 (controller mode
                                                        only: tiered.store.brokermode)

Races this reader is built for:

- The broker appends concurrently. A ConsumeQueue entry is written after its
  record, so an entry of size 0 ends the queue, and a record still made of
  zeros is "not written yet": iteration stops there and resumes next round.
  Only complete, validated records are returned.
- The broker deletes old files (retention). A file gone under the reader is
  reported as ``ExpiredLocallyError`` with the next offset still available,
  never as a crash or as corruption.
- Files are mapped read-only. Unlinking a mapped file is safe; the broker
  only truncates files during its own crash recovery, which a restarted
  sidecar survives (archiving resumes from the manifest).
"""

from __future__ import annotations

import os
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tiered.format.batch import RecordBatch
from tiered.format.codec import (
    CQ_ENTRY,
    CQ_ENTRY_SIZE,
    CQ_FILLER_SIZE,
    Peek,
    Record,
    cq_written_entries,
    decode_record,
    peek,
)
from tiered.errors import CorruptRecordError, ExpiredLocallyError, NotWrittenYetError
from tiered.store import brokermode
from tiered.store.brokermode import BrokerMode
from tiered.store.consumeroffsets import ConsumerOffsets, read_consumer_offsets
from tiered.store.mappedfiles import FileSet, QueueFiles
from tiered.store.cqscan import count_written
from tiered.format.jsonfile import read_json
from tiered.store.queuecursor import EMPTY as _EMPTY
from tiered.store.queuecursor import NO_LIMIT, QueueCursor



@dataclass(frozen=True, slots=True)
class QueueRange:
    """Queue offsets still on local disk: ``min_offset`` <= o < ``max_offset``."""

    min_offset: int
    max_offset: int

    @property
    def count(self) -> int:
        return self.max_offset - self.min_offset


@dataclass(frozen=True, slots=True)
class QueuedRecord:
    queue_offset: int
    tags_code: int
    record: Record


class LocalStore:
    """A broker store directory, opened read-only.

    ``broker_mode`` (auto | default | controller | dledger) is told once, at
    open; a store tiered cannot read (DLedger, RocksDB ConsumeQueue) raises
    UnsupportedStoreError here."""

    def __init__(self, root: str | os.PathLike[str], broker_mode: str = "auto") -> None:
        self.root = Path(root)
        self.told_mode = brokermode.tell(self.root, broker_mode)
        brokermode.refuse_unreadable(self.root, self.told_mode)
        self.commitlog = FileSet(self.root / "commitlog")
        self._queues_prefix = os.path.join(os.fspath(self.root), "consumequeue", "")
        self._queues: dict[tuple[str, int], QueueFiles] = {}
        self._batch: set[str] | None = None  # BatchCQ topics, at the last ``topics()``

    # --- discovery -------------------------------------------------------

    def topics(self) -> list[str]:
        """Topics with queues: under ``consumequeue/`` and, for BatchCQ
        topics, ``batchconsumequeue/``."""
        try:
            names = {e.name for e in os.scandir(self.root / "consumequeue") if e.is_dir()}
        except FileNotFoundError:
            names = set()
        from tiered.store.batchcq import batch_topics  # it builds on this module

        try:
            configs = self.topic_configs()
        except (OSError, CorruptRecordError):
            configs = {}  # unreadable: the directories alone tell (status reports the file)
        self._batch = batch_topics(self.root, configs, names)
        return sorted(names | self._batch)

    def is_batch(self, topic: str) -> bool:
        """The topic's queues are BatchConsumeQueues (``tiered.store.batchcq``)."""
        if self._batch is None:
            self.topics()
        return self._batch is not None and topic in self._batch

    def queue_ids(self, topic: str) -> list[int]:
        try:
            names = os.listdir(self.root / ("batchconsumequeue" if self.is_batch(topic) else "consumequeue") / topic)
        except FileNotFoundError:
            return []
        return sorted(int(n) for n in names if n.isdigit())

    def queues(self) -> list[tuple[str, int]]:
        return [(t, q) for t in self.topics() for q in self.queue_ids(t)]

    def refresh(self) -> None:
        """See files created and deleted since the last look. Call once per round."""
        self.commitlog.refresh()
        for files in self._queues.values():
            files.refresh()

    def refresh_queue(self, topic: str, queue_id: int) -> None:
        """``refresh`` for the CommitLog and one queue only."""
        self.commitlog.refresh()
        self.queue_files(topic, queue_id).refresh()

    def release_queue(self, topic: str, queue_id: int) -> None:
        """Give back this process's mapped pages of a queue's ConsumeQueue
        files (they stay in the page cache). A round over many queues touches
        a few pages of each; kept, they add up to hundreds of MiB."""
        files = self._queues.get((topic, queue_id))
        if files is not None:
            files.release_all()

    def commitlog_join(self, los: np.ndarray, his: np.ndarray) -> bytes:
        """CommitLog bytes [los[i], his[i]) of each span (each within one file,
        in order, written already) joined in one copy; the pages read are
        given back after. Raises FileNotFoundError when a file is gone or
        shorter. Array work per file, not per span: the spans of a queue
        interleaved with others are one per record."""
        parts: list[memoryview] = []
        touched: list[tuple[int, int, int]] = []
        i, n = 0, len(los)
        while i < n:
            lo = int(los[i])
            located = self._commitlog_span(lo, int(his[i]))
            if located is None:
                self.commitlog.refresh()  # a file started since the last look
                located = self._commitlog_span(lo, int(his[i]))
                if located is None:
                    raise FileNotFoundError(f"CommitLog bytes [{lo}, {int(his[i])}) are not on disk")
            start, view = located
            # the spans inside this file's mapping
            j = i + int(np.searchsorted(his[i:], start + len(view), side="right"))
            rel_lo, rel_hi = (los[i:j] - start).tolist(), (his[i:j] - start).tolist()
            parts.extend(map(view.__getitem__, map(slice, rel_lo, rel_hi)))
            touched.append((start, rel_lo[0], rel_hi[-1]))
            i = j
        try:
            return b"".join(parts)
        finally:
            for start, lo, hi in touched:
                self.commitlog.release(start, lo, hi)

    def _commitlog_span(self, lo: int, hi: int) -> tuple[int, memoryview] | None:
        start = self.commitlog.locate(lo)
        if start is None:
            return None
        try:
            view = self.commitlog.view(start, hi - start)
        except FileNotFoundError:
            return None
        return (start, view) if hi - start <= len(view) else None

    def queue_files(self, topic: str, queue_id: int) -> QueueFiles:
        """The ConsumeQueue (or BatchConsumeQueue) files of a queue, kept
        mapped across calls; a reader of the queue (``QueueCursor``, the
        CommitLog pass) walks them itself."""
        files = self._queues.get((topic, queue_id))
        if files is None:
            if self.is_batch(topic):
                from tiered.store.batchcq import BatchQueueFiles

                files = BatchQueueFiles(self.root / "batchconsumequeue" / topic / str(queue_id), topic, queue_id)
            else:
                files = QueueFiles(f"{self._queues_prefix}{topic}{os.sep}{queue_id}", topic, queue_id)
            self._queues[(topic, queue_id)] = files
        return files

    # --- ConsumeQueue ----------------------------------------------------

    def _entry(self, files: QueueFiles, queue_offset: int) -> tuple[int, int, int] | None:
        """The entry at ``queue_offset``; None past the written end. Raises
        FileNotFoundError when its file is gone."""
        byte = queue_offset * CQ_ENTRY_SIZE
        start = files.locate(byte)
        if start is None:
            raise FileNotFoundError(byte)
        view = files.view(start, byte - start + CQ_ENTRY_SIZE)
        rel = byte - start
        if rel + CQ_ENTRY_SIZE > len(view):
            return None
        entry = CQ_ENTRY.unpack_from(view, rel)
        return None if entry[1] == 0 else entry

    def entry_at(self, topic: str, queue_id: int, queue_offset: int) -> tuple[int, int, int] | None:
        """The ConsumeQueue entry (CommitLog offset, size, tags code) at
        ``queue_offset``; None when it is not written or its file is gone."""
        try:
            return self._entry(self.queue_files(topic, queue_id), queue_offset)
        except FileNotFoundError:
            return None

    def batch_entry(self, topic: str, queue_id: int, offset: int) -> Any:
        """The BatchConsumeQueue entry (``tiered.store.batchcq.BatchEntry``)
        at entry ``offset`` of a BatchCQ queue; None when not written."""
        files = self.queue_files(topic, queue_id)
        if not files.is_batch or self.entry_at(topic, queue_id, offset) is None:
            return None
        return files.unit(offset)  # type: ignore[attr-defined]

    def batch_offset_range(self, topic: str, queue_id: int) -> QueueRange:
        """A BatchCQ queue's queue offsets as RocketMQ counts its messages:
        the first entry's base offset to the last one's base + batch size."""
        rng = self.queue_range(topic, queue_id)
        if rng.count <= 0:
            return QueueRange(0, 0)
        first = self.batch_entry(topic, queue_id, rng.min_offset)
        last = self.batch_entry(topic, queue_id, rng.max_offset - 1)
        if first is None or last is None:
            return QueueRange(0, 0)
        return QueueRange(first.base_offset, last.base_offset + last.batch_size)

    def batch_entry_of(self, topic: str, queue_id: int, queue_offset: int) -> int:
        """The entry offset of the record holding message ``queue_offset`` of a
        BatchCQ queue (the range's end when it is not written yet)."""
        from tiered.store.batchcq import entry_of

        rng = self.queue_range(topic, queue_id)
        return entry_of(self.queue_files(topic, queue_id), queue_offset, rng.min_offset,  # type: ignore[arg-type]
                        rng.max_offset)

    def truncated(self, topic: str, queue_id: int) -> bool:
        """The last ConsumeQueue file ends inside an entry (from its mapping:
        no system call), so an "idle" queue is really stopped on corruption."""
        files = self.queue_files(topic, queue_id)
        if not files.starts:
            return False
        try:
            if files.is_batch:
                return files.file_size(files.starts[-1]) % files.unit_size != 0
            return len(files.view(files.starts[-1])) % CQ_ENTRY_SIZE != 0
        except FileNotFoundError:
            return False

    def why_stopped(self, topic: str, queue_id: int, offset: int) -> CorruptRecordError | None:
        """Why nothing can be read at ``offset`` when it is corruption rather
        than the end of written data: a ConsumeQueue file that ends inside an
        entry (files are preallocated and entries written whole), or a zero
        entry while later entries are written (the broker writes them in
        order, so this is not a tail in progress). None: the end of data."""
        files = self.queue_files(topic, queue_id)
        byte = offset * CQ_ENTRY_SIZE
        start = files.locate(byte)
        if start is None:
            return None
        path, unit = files.name(start), files.unit_size
        try:
            size = files.file_size(start)
        except FileNotFoundError:
            return None
        kind = "BatchConsumeQueue" if files.is_batch else "ConsumeQueue"
        if size % unit and (byte - start) // CQ_ENTRY_SIZE * unit + unit > size:
            return CorruptRecordError(path, size - size % unit,
                                      f"{kind} file ends inside entry {offset} ({size} bytes): truncated")
        try:
            if self._entry(files, offset) is not None:
                return None
            end = self._max_offset(files)
        except FileNotFoundError:
            return None
        if end > offset:
            return CorruptRecordError(path, (byte - start) // CQ_ENTRY_SIZE * unit,
                                      f"{kind} entry {offset} is zero while entries up to {end} are written")
        return None

    def queue_range(self, topic: str, queue_id: int) -> QueueRange:
        """Offsets on local disk. Leading filler entries and entries whose
        CommitLog file the broker already deleted are not counted."""
        files = self.queue_files(topic, queue_id)
        if not files.starts:
            files.refresh()
        if not files.starts:
            return QueueRange(0, 0)
        max_offset = self._max_offset(files)
        lo = files.starts[0] // CQ_ENTRY_SIZE
        min_phys = self.commitlog.starts[0] if self.commitlog.starts else None
        # first offset that is neither a filler nor below the CommitLog's start
        hi = max_offset
        # the file of the last probe and its view, kept while the probes stay in it
        # (``_entry``'s locate and view a probe, without their calls: a round asks
        # each queue's range up to three times)
        start, view, end = -1, _EMPTY, -1
        while lo < hi:
            mid = (lo + hi) // 2
            byte = mid * CQ_ENTRY_SIZE
            try:
                if not start <= byte < end or byte - start + CQ_ENTRY_SIZE > len(view):
                    located = files.locate(byte)
                    if located is None:
                        raise FileNotFoundError(byte)
                    start = located
                    view = files.view(start, byte - start + CQ_ENTRY_SIZE)
                    i = bisect_right(files.starts, start)
                    end = files.starts[i] if i < len(files.starts) else NO_LIMIT
            except FileNotFoundError:
                files.refresh()
                return self.queue_range(topic, queue_id)
            rel = byte - start
            entry = CQ_ENTRY.unpack_from(view, rel) if rel + CQ_ENTRY_SIZE <= len(view) else None
            if entry is None or entry[1] == 0 or (entry[1] != CQ_FILLER_SIZE and min_phys is not None
                                                  and entry[0] >= min_phys):
                hi = mid
            else:
                lo = mid + 1
        return QueueRange(lo, max_offset)

    def _max_offset(self, files: QueueFiles) -> int:
        for start in reversed(files.starts):
            try:
                view = files.view(start)
            except FileNotFoundError:
                continue
            gone = False
            while True:
                n = len(view) // CQ_ENTRY_SIZE
                hint = files.written.get(start)
                if hint is None:
                    try:
                        lo = files.written_count(start, n)
                    except FileNotFoundError:
                        gone = True  # deleted since it was mapped: as if it could not be mapped
                        break
                else:
                    lo = cq_written_entries(view, hint)
                files.written[start] = lo
                if lo < n or start != files.starts[-1]:
                    break
                # every mapped entry is written: the last file may have grown
                # since it was mapped (mapped while just created, or not preallocated)
                try:
                    grown = files.view(start, len(view) + CQ_ENTRY_SIZE)
                except FileNotFoundError:
                    break
                if len(grown) // CQ_ENTRY_SIZE <= n:
                    break
                view = grown
            if gone:
                continue
            if lo > 0 or start == files.starts[0]:
                return start // CQ_ENTRY_SIZE + lo
        return files.starts[0] // CQ_ENTRY_SIZE if files.starts else 0

    # --- records ---------------------------------------------------------

    def broker_mode(self) -> BrokerMode:
        """The mode told at open, with the confirm offset read now."""
        return brokermode.with_bound(self.told_mode, self.root)

    def confirmed_offset(self) -> int | None:
        """The CommitLog offset records must end at or before to be archived:
        the checkpoint's confirm offset in controller mode, None elsewhere
        (the broker itself honours it nowhere else)."""
        return self.broker_mode().confirm_offset

    def read_at(self, commitlog_offset: int, *, verify_crc: bool = True) -> Record:
        """The record at a physical CommitLog offset."""
        start = self.commitlog.locate(commitlog_offset)
        if start is None:
            raise FileNotFoundError(commitlog_offset)
        try:
            view = self.commitlog.view(start, commitlog_offset - start + 8)
        except FileNotFoundError:
            self.commitlog.refresh()
            raise
        rel = commitlog_offset - start
        if rel + 8 > len(view):
            # past this file: a newer file may exist that we have not listed yet
            self.commitlog.refresh()
            newer = self.commitlog.locate(commitlog_offset)
            if newer is not None and newer != start:
                return self.read_at(commitlog_offset, verify_crc=verify_crc)
        source = self.commitlog.name(start)
        if rel + 8 > len(view):
            raise NotWrittenYetError(source, rel, "the file ends inside the record header")
        kind, size = peek(view, rel, source)
        if kind is Peek.UNWRITTEN:
            raise NotWrittenYetError(source, rel)
        if kind is Peek.BLANK:
            raise CorruptRecordError(source, rel, "a ConsumeQueue entry points at the end-of-file filler")
        if rel + size > len(view):
            view = self.commitlog.view(start, rel + size)
            if rel + size > len(view):
                # the file ends inside the record: a torn tail, not corruption
                raise NotWrittenYetError(source, rel, f"record of {size} bytes truncated at {len(view) - rel}")
        return decode_record(view, rel, source, verify_crc=verify_crc)

    def commitlog_window(self, phys: int, size: int) -> tuple[int, memoryview, str] | None:
        """(start, view, source) of the CommitLog file holding the ``size``
        bytes at ``phys``, remapped if it grew; None when they are not
        (completely) on disk yet. Raises FileNotFoundError when the file is
        gone and CorruptRecordError when what is there contradicts ``size``."""
        cl = self.commitlog
        start = cl.locate(phys)
        if start is None:
            cl.refresh()
            start = cl.locate(phys)
            if start is None:
                raise FileNotFoundError(phys)
        try:
            view = cl.view(start, phys - start + size)
        except FileNotFoundError:
            cl.refresh()
            raise
        if phys - start + 8 > len(view) and start == cl.starts[-1]:
            # past the last file we listed: a newer one may have been created
            cl.refresh()
            newer = cl.locate(phys)
            if newer is not None and newer != start:
                start = newer
                view = cl.view(start, phys - start + size)
        rel = phys - start
        source = cl.name(start)
        if rel + size > len(view):
            if rel + 8 > len(view):
                return None  # the file ends inside the record header: a torn tail
            kind, found = peek(view, rel, source)
            if kind is Peek.BLANK:
                raise CorruptRecordError(source, rel, "a ConsumeQueue entry points at the end-of-file filler")
            if kind is Peek.RECORD and found != size:
                raise CorruptRecordError(source, rel, f"size {found} != ConsumeQueue size {size}")
            return None  # zeros, or the file ends inside the record: a torn tail
        return start, view, source

    def iter_queue(
        self,
        topic: str,
        queue_id: int,
        from_offset: int,
        *,
        max_count: int | None = None,
        max_bytes: int | None = None,
        verify_crc: bool = True,
    ) -> Iterator[QueuedRecord]:
        """Validated records of a queue from ``from_offset``, in order, one by
        one: ``iter_batches`` flattened (see there)."""
        for batch in self.iter_batches(topic, queue_id, from_offset, max_count=max_count, max_bytes=max_bytes,
                                       verify_crc=verify_crc):
            tags = batch.tags.tolist()
            for i in range(batch.count):
                yield QueuedRecord(batch.first_offset + i, tags[i], batch.record(i))

    def iter_batches(
        self,
        topic: str,
        queue_id: int,
        from_offset: int,
        *,
        max_count: int | None = None,
        max_bytes: int | None = None,
        verify_crc: bool = True,
    ) -> Iterator[RecordBatch]:
        """Validated records of a queue from ``from_offset``, in order, as
        batches of consecutive records.

        Stops (without error) at the end of written data, at a record not
        completely written yet, at ``max_count`` records, before exceeding
        ``max_bytes``, or at the cluster-confirmed CommitLog offset.

        Raises ExpiredLocallyError when ``from_offset`` (or a later offset)
        is no longer on local disk, and CorruptRecordError naming the file
        and offset for invalid data; batches yielded before stay valid.

        New ConsumeQueue and CommitLog files, and files that grew since they
        were mapped, are found without ``refresh()``. Memory: the pages read
        are given back every ``_RELEASE_EVERY`` bytes and when the iteration
        ends (they stay in the page cache), so RSS does not grow with the
        store; the batches' views stay valid.

        Runs of ordinary records go through ``batch.check_run`` at once;
        the first record it does not accept, the chunk's last entry (maybe
        still being written) and every file or window change go through
        the record-by-record path, which decides tails, races and errors
        (``tiered.store.queuecursor``: the pass as an object with named steps).
        """
        return QueueCursor(self, topic, queue_id, from_offset, max_count=max_count, max_bytes=max_bytes,
                           verify_crc=verify_crc).batches()

    def missing_record_error(self, phys: int, offset: int) -> CorruptRecordError:
        """A record that is not on disk while a later ConsumeQueue entry is:
        the broker writes records in order and each entry after its record,
        so this is not a tail still being written but lost data."""
        start = self.commitlog.locate(phys)
        source = str(self.commitlog.path(start)) if start is not None else str(self.root / "commitlog")
        if start is not None and start == self.commitlog.starts[-1] and self._unwritten_from(source, phys - start):
            # the broker appends: nothing was ever written there, the entry points past the CommitLog's data
            return CorruptRecordError(source, phys - start,
                                      f"record of queue offset {offset} is missing: its ConsumeQueue entry points "
                                      f"at CommitLog offset {phys}, past the end of the CommitLog")
        return CorruptRecordError(source, phys - (start or 0),
                                  f"record of queue offset {offset} is missing (zeros or cut off) "
                                  "while later ConsumeQueue entries exist")

    @staticmethod
    def _unwritten_from(path: str, rel: int) -> bool:
        """Whether ``path`` ends before ``rel`` or holds zeros there (a record
        header's first 8 bytes: its size and magic are never zero)."""
        try:
            with open(path, "rb") as fh:
                return os.pread(fh.fileno(), 8, rel) in (b"", bytes(8))
        except OSError:
            return False

    def max_offset(self, topic: str, queue_id: int) -> int:
        """The next queue offset the broker will write: cheap enough to call for
        every idle queue every round (no directory listing unless the last
        ConsumeQueue file is full)."""
        files = self.queue_files(topic, queue_id)
        if not files.starts:
            files.refresh()
            if not files.starts:
                return 0
        last = files.starts[-1]
        try:
            end = self._max_offset(files)
        except FileNotFoundError:
            files.refresh()
            return self._max_offset(files)
        try:
            view = files.view(last)
        except FileNotFoundError:  # deleted by the broker since we listed it
            files.refresh()
            return self._max_offset(files)
        if end - last // CQ_ENTRY_SIZE >= len(view) // CQ_ENTRY_SIZE:
            files.refresh()  # the last file is full: a next one may have started
            if files.starts and files.starts[-1] != last:
                return self._max_offset(files)
        return end

    def pending(self, topic: str, queue_id: int, from_offset: int, *, max_entries: int = 1 << 20) -> tuple[int, int]:
        """(messages, bytes) written after ``from_offset``, from the ConsumeQueue
        alone (no CommitLog read); counts at most ``max_entries`` entries."""
        files = self.queue_files(topic, queue_id)
        count = 0
        total = 0
        offset = from_offset
        while count < max_entries:
            byte = offset * CQ_ENTRY_SIZE
            start = files.locate(byte)
            if start is None:
                break
            try:
                view = files.view(start)
            except FileNotFoundError:
                break
            rel = byte - start
            end = min(len(view), files.entries_per_file(start, view) * CQ_ENTRY_SIZE,
                      rel + (max_entries - count) * CQ_ENTRY_SIZE)
            end = rel + (end - rel) // CQ_ENTRY_SIZE * CQ_ENTRY_SIZE
            if rel >= end:
                files.refresh()
                if files.locate(byte) == start:
                    break
                continue
            n, nbytes, ended = count_written(view, rel, end)
            count += n
            total += nbytes
            if ended:
                return count, total
            offset += n
        return count, total

    def expired_error(self, topic: str, queue_id: int, offset: int) -> ExpiredLocallyError:
        """The error for ``offset`` read after the broker deleted it: the
        store is looked at again so it names the first offset still there."""
        self.refresh()
        rng = self.queue_range(topic, queue_id)
        nxt = rng.min_offset if rng.min_offset > offset else None
        if nxt is None and rng.max_offset > offset:
            nxt = rng.min_offset
        return ExpiredLocallyError(topic, queue_id, offset, nxt)

    def find_offset(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first queue offset whose store timestamp is >= ``timestamp_ms``
        (``max_offset`` when every record is older). Binary search: store
        timestamps grow with queue offsets in one queue."""
        rng = self.queue_range(topic, queue_id)
        lo, hi = rng.min_offset, rng.max_offset
        files = self.queue_files(topic, queue_id)
        while lo < hi:
            mid = (lo + hi) // 2
            try:
                entry = self._entry(files, mid)
                stamp = None if entry is None else self.read_at(entry[0], verify_crc=False).store_timestamp
            except FileNotFoundError:
                raise self.expired_error(topic, queue_id, mid) from None
            except NotWrittenYetError:
                stamp = None  # a torn tail ends the queue here
            if stamp is None or stamp >= timestamp_ms:
                hi = mid
            else:
                lo = mid + 1
        return lo

    # --- config ----------------------------------------------------------

    def read_config(self, name: str) -> dict[str, Any]:
        """``config/{name}`` with the ``.bak`` fallback; {} when absent."""
        data = read_json(self.root / "config" / name)
        if data is None:
            return {}
        if not isinstance(data, dict):
            raise CorruptRecordError(str(self.root / "config" / name), 0, "top level is not a JSON object")
        return data

    def topic_configs(self) -> dict[str, dict[str, Any]]:
        table = self.read_config("topics.json").get("topicConfigTable", {})
        return table if isinstance(table, dict) else {}

    def consumer_offsets(self) -> ConsumerOffsets:
        """Committed consumer offsets from ``config/consumerOffset.json``
        (unquoted or quoted integer keys; ``.bak`` fallback with a warning)."""
        return read_consumer_offsets(self.root / "config")

    def retention_hours(self) -> dict[str, float]:
        """Per-topic ``reserve.time`` (hours) from topics.json, where set and valid."""
        out: dict[str, float] = {}
        for topic, cfg in self.topic_configs().items():
            attrs = cfg.get("attributes") if isinstance(cfg, dict) else None
            if not isinstance(attrs, dict):
                continue
            value = attrs.get("reserve.time", attrs.get("+reserve.time"))
            try:
                hours = float(value) if value is not None else None
            except (TypeError, ValueError):
                hours = None
            if hours is not None and hours > 0:
                out[topic] = hours
        return out

    def close(self) -> None:
        self.commitlog.close()
        for files in self._queues.values():
            files.close()
        self._queues.clear()

    def __enter__(self) -> LocalStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
