"""One sequential CommitLog pass that builds the next segment of every due queue.

Reading each queue on its own (``LocalStore.iter_batches``) walks the
CommitLog once per queue: with interleaved queues every pass maps, faults
and gives back the same pages again, and at 1,000 queues a batch holds a
dozen records. This pass reads the CommitLog once, in the broker's own
write (reput) order, for all the queues of a round's wave:

1. ``_gather``: each queue's pending ConsumeQueue entries from its job's
   start offset, in the ConsumeQueue file of that offset, up to the
   segment's byte budget. The ConsumeQueue is the authority on what belongs
   to a queue: records in no ConsumeQueue (transaction half and rollback
   messages) are never read, a record dispatched to several queues (LMQ)
   is read for each. Only *plain* entries enter the pass: a size that can
   be a record, below the confirmed offset, physical offsets growing. The
   queue's last written entry is read again after its record, as the
   per-queue read does (the broker may have been writing it): when it
   changed, the queue is read again by the per-queue read. The entries are
   read with ``pread`` (``_FileSet.read``), a few KiB a queue, not mapped;
   the plain ones are found for all queues at once (``_plain_many``).
2. ``_walk``: every queue's entries merged by physical offset (one argsort),
   cut into windows of one CommitLog file, each window's pages mapped in one
   call and given back behind it. A window is one compiled call for all its
   queues (``batch.check_copy_runs``, without the GIL): each record is
   copied into its queue's ``SegmentBuilder`` buffer, then checked there,
   hot in the cache, exactly as the per-queue read's ``check_run`` checks
   it (body CRC included), and the segment's CRC-32 is continued over it:
   the mapped CommitLog is read once, and nothing reads the segment again
   for its CRC (the manifest's ``commitlog_crc``, and the v2 object's
   upload checksum continued from it). The copy is made while the pages
   are mapped: copying later, at the upload, would map every page again for
   every queue whose records it holds (measured 0.19 s more for 64 MiB over
   16 queues). The window's bytes are cut into pieces of whole records
   (a queue's run too: at 16 queues a wave holds a few queues of many MiB)
   and done on up to ``pass_threads()`` threads, the cores this process may
   use; a piece that stops at a record the checks refuse ends its queue's
   run there, whatever the pieces after it did. The pass's per-queue state
   is kept as arrays (``_Columns``), so a window costs array operations
   over its queues, not Python calls a queue; each builder is handed its
   records' arrays and CRC once, after the walk.
3. ``_finish``: where the pass left a queue short of its budget (a record
   ``check_run`` does not accept, a filler, the last entry, the end of a
   ConsumeQueue file, a CommitLog file gone), the per-queue read continues
   from that offset with the rest of the budget. It decides tails, races and
   errors as it always has: a corrupt record stops its queue with the typed
   error naming file and offset, and no other queue.

The segments are those the per-queue build makes: same records, same
boundaries (the budget rule of ``QueueCursor`` is kept, including "the
first record of a segment is taken whatever its size"), same bytes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dispatcher.buildpool import BuildJob
from dispatcher.segment import SegmentBuilder
from tiered.errors import CorruptRecordError, ExpiredLocallyError
from tiered.format.batch import COPY_FIELDS, CQ_DTYPE, RecordBatch, check_copy_runs, run_tails
from tiered.format.keyindex import BadProperties, record_key_hashes
from tiered.format.codec import CQ_ENTRY_SIZE, CQ_FILLER_SIZE
from tiered.store.localstore import LocalStore
from tiered.store.queuecursor import NO_LIMIT

# A window of one CommitLog file: mapped in one call, given back behind the
# pass. A window costs some array operations over its queues whatever their
# records (once ~100 us of numpy calls a queue), so a pass over many queues
# takes wider windows, up to MAX_WINDOW of mapped pages at a time: one per
# QUEUES_PER_WINDOW_STEP queues more WINDOW bytes.
WINDOW = 32 << 20
MAX_WINDOW = 128 << 20
QUEUES_PER_WINDOW_STEP = 256


def window_bytes(queues: int) -> int:
    """The window of a pass over ``queues`` queues."""
    return min(MAX_WINDOW, WINDOW * max(1, -(-queues // QUEUES_PER_WINDOW_STEP)))
# a window's pages are mapped at once when the records read fill at least 1/_DENSE of it
_DENSE = 4

# Threads checking and copying a window (without the GIL, in the compiled call):
# THREADS when set, else the cores this process may run on, at most MAX_THREADS
# (a window's copy is bound by memory bandwidth well before that).
THREADS: int | None = None
MAX_THREADS = 8


def pass_threads() -> int:
    """The threads a pass's windows are checked and copied on."""
    if THREADS is not None:
        return max(1, THREADS)
    return max(1, min(MAX_THREADS, len(os.sched_getaffinity(0))))


@dataclass(frozen=True, kw_only=True)
class PassStats:
    """What one pass read: for benchmarks and for the tests that prove the
    CommitLog is read once."""

    queues: int = 0
    records: int = 0  # read by the pass itself
    nbytes: int = 0
    windows: int = 0
    continued: int = 0  # queues the per-queue read finished
    seconds: float = 0.0
    # the pass's own CPU (its thread's, and the threads its windows started
    # in the compiled call): its wall time also counts waiting for the GIL
    # while upload threads run Python
    cpu_seconds: float = 0.0


@dataclass
class _Queue:
    job: BuildJob
    builder: SegmentBuilder
    entries: np.ndarray  # CQ_DTYPE, the plain entries the pass reads
    limit: int  # entries[:limit] still to be taken; lowered where the pass must stop
    taken: int = 0
    full: bool = False  # the entry after ``entries`` would pass the budget: the segment ends there
    stop: Exception | None = None
    # When ``entries`` are all the written ones of their ConsumeQueue file:
    # the last one's (file start, byte, bytes), read again after its record
    # (the broker may have been writing it), and whether the written data
    # ends inside that file (then nothing more is to be read this round).
    last: tuple[int, int, bytes] | None = None
    at_end: bool = False
    redo: bool = False  # the last entry changed: the queue is read again, by the per-queue read


Planned = tuple[BuildJob, SegmentBuilder, Exception | None]


def build_pass(local: LocalStore, jobs: list[BuildJob]) -> tuple[dict[tuple[str, int], Planned], PassStats]:
    """The next segment of every job's queue, as ``buildpool.build_segment``
    builds it, from one CommitLog pass. Returns (topic, queue) -> (job,
    builder, stop) and what the pass read: ``builder.build()`` (when it holds
    records) gives the segment; ``stop`` is the corrupt record or expired
    offset that ended it early, as in ``build_segment``. Raises nothing for
    a queue's data."""
    started, cpu = time.perf_counter(), time.thread_time()
    confirmed = local.confirmed_offset()
    phys_limit = confirmed if confirmed is not None else NO_LIMIT
    local.commitlog.refresh()  # files the broker started or deleted since the last look
    queues = _gather(local, jobs, phys_limit)
    records, nbytes, windows, helpers_cpu = _walk(local, queues)
    out: dict[tuple[str, int], Planned] = {}
    continued = 0
    for q in queues:
        _recheck_last(local, q)
        if _finish(local, q):
            continued += 1
            local.release_queue(q.job.topic, q.job.queue_id)  # what the per-queue read mapped
        out[(q.job.topic, q.job.queue_id)] = (q.job, q.builder, q.stop)
    stats = PassStats(queues=len(jobs), records=records, nbytes=nbytes, windows=windows, continued=continued,
                      seconds=time.perf_counter() - started,
                      cpu_seconds=time.thread_time() - cpu + helpers_cpu)
    return out, stats


def _gather(local: LocalStore, jobs: list[BuildJob], phys_limit: int) -> list[_Queue]:
    """Each job's queue with the plain entries the pass reads: read queue
    by queue, checked (``_plain_many``) for all queues at once."""
    read = [_read_pending(local, job, phys_limit) for job in jobs]
    none = np.zeros(0, CQ_DTYPE)
    k, full, nbytes = _plain_many([r[0] if r is not None else none for r in read], phys_limit,
                                  np.fromiter((job.segment_bytes for job in jobs), np.int64, len(jobs)))
    queues = []
    for job, got, k_, full_, nbytes_ in zip(jobs, read, k.tolist(), full.tolist(), nbytes.tolist()):
        builder = SegmentBuilder(job.prefix, job.start, job.cl_start, key_index=job.key_index, layout=job.layout,
                                 compression=job.compression)
        if got is None:
            queues.append(_Queue(job, builder, none, 0))  # the per-queue read says why (expired, nothing yet)
            continue
        entries, hi, start, end = got
        q = _Queue(job, builder, entries[:k_], k_, full=full_)
        builder.reserve(nbytes_, k_)  # what the pass will copy, allocated once
        if k_ and k_ == len(entries) and hi is not None:
            # the last written entry may be the one the broker is writing: it is
            # read again after its record, as QueueCursor._one_entry does
            q.last = (start, (hi - 1) * CQ_ENTRY_SIZE, entries[k_ - 1:k_].tobytes())
            q.at_end = hi * CQ_ENTRY_SIZE < end
        queues.append(q)
    return queues


def _read_pending(local: LocalStore, job: BuildJob, phys_limit: int
                  ) -> tuple[np.ndarray, int | None, int, int] | None:
    """``_pending`` of the job's queue from its start, in the ConsumeQueue file
    of that offset, and that file's start and entries' end; None when there
    is nothing to read there (the per-queue read says why)."""
    files = local._queue(job.topic, job.queue_id)
    byte = job.start * CQ_ENTRY_SIZE
    start = files.locate(byte)
    if start is None:
        return None
    rel = byte - start
    try:
        # read, not mapped: a queue's few KiB of entries cost a pread, where a
        # map cost page faults and an madvise to give the pages back
        head, size = files.read(start, rel, _SCAN * CQ_ENTRY_SIZE)
    except FileNotFoundError:
        return None
    end = files.entries_end(start, size)
    if rel + CQ_ENTRY_SIZE > end:
        return None
    first = np.frombuffer(head, CQ_DTYPE, count=min(len(head), end - rel) // CQ_ENTRY_SIZE)

    def read(at: int, n: int) -> np.ndarray | None:
        if at == rel // CQ_ENTRY_SIZE and n <= len(first):
            return first[:n]
        try:
            more = files.read_bytes(start, at * CQ_ENTRY_SIZE, n * CQ_ENTRY_SIZE)
        except FileNotFoundError:
            return None  # deleted since the first read: the per-queue read goes on from here and reports it
        return np.frombuffer(more, CQ_DTYPE, count=len(more) // CQ_ENTRY_SIZE)

    entries, hi = _pending(read, rel // CQ_ENTRY_SIZE, end // CQ_ENTRY_SIZE, phys_limit, job.segment_bytes)
    return entries, hi, start, end


# ConsumeQueue entries read at first by ``_pending``, then four times more each step
_SCAN = 1024


def _pending(read: Callable[[int, int], np.ndarray | None], first: int, last: int, phys_limit: int,
             budget: int) -> tuple[np.ndarray, int | None]:
    """The entries from ``first`` up to the written end (the first entry of
    size 0, or ``last``; entries are written in order), and that end; or,
    when an entry the pass cannot take (``_plain``) comes first, the entries
    up to and past it, and None. Read forward in growing steps by
    ``read(at, n)`` (up to ``n`` entries from entry ``at``, not a view of
    mapped pages; fewer: the file ends there now; None: it cannot be read
    any more, and the entries read so far are returned with None): what a
    segment takes and a step more, where finding the written end by
    bisection over the whole file faulted in a page for each probe (a
    fifth of the pass's CPU at 1,000 queues)."""
    parts: list[np.ndarray] = []
    at, step = first, _SCAN
    while True:
        chunk = read(at, min(step, last - at))
        if chunk is None:
            return (_joined(parts) if parts else np.zeros(0, CQ_DTYPE)), None
        short = len(chunk) < min(step, last - at)
        zero = np.flatnonzero(chunk["size"] == 0)
        n = int(zero[0]) if len(zero) else len(chunk)
        parts.append(chunk[:n])
        at += n
        entries = parts[0] if len(parts) == 1 else _joined(parts)
        if len(zero) or at >= last or short:
            return entries, at
        if _plain(entries, phys_limit, budget)[0] < len(entries):
            return entries, None
        step *= 4


def _plain(entries: np.ndarray, phys_limit: int, budget: int) -> tuple[int, bool]:
    """How many leading ``entries`` the pass takes: the checks of
    QueueCursor._fast_run and _one_entry, in their order. And whether the
    one after them passes the budget (the per-queue read stops before a
    record passing the budget, except the segment's first; a pass stopped
    there must not hand it on)."""
    phys = entries["phys"].astype(np.int64)
    size = entries["size"].astype(np.int64)
    can_be = (size > 0) & (size != CQ_FILLER_SIZE) & (phys >= 0) & (phys + size <= phys_limit)
    in_budget = np.cumsum(size) <= budget
    plain = can_be & in_budget
    plain[1:] &= phys[1:] >= phys[:-1] + size[:-1]  # merged by physical offset, a queue keeps its order
    k = int(np.argmin(plain)) if not plain.all() else len(plain)
    return k, 0 < k < len(plain) and bool(can_be[k]) and not bool(in_budget[k])


def _plain_many(parts: list[np.ndarray], phys_limit: int, budgets: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``_plain`` of every queue's entries at once (a dozen numpy calls a
    queue cost more than its few entries at 1,000 queues): for each, how
    many leading entries the pass takes, whether the one after them passes
    the budget, and the bytes of those taken."""
    counts = np.fromiter((len(p) for p in parts), np.int64, len(parts))
    firsts = np.cumsum(counts) - counts
    ends = firsts + counts
    if not counts.sum():
        zeros = np.zeros(len(parts), np.int64)
        return zeros, zeros.astype(bool), zeros
    every = _joined(parts)
    phys, size = every["phys"].astype(np.int64), every["size"].astype(np.int64)
    can_be = (size > 0) & (size != CQ_FILLER_SIZE) & (phys >= 0) & (phys + size <= phys_limit)
    total = np.cumsum(size)
    before = np.concatenate(([0], total))[firsts]  # each queue's sums start again
    total -= np.repeat(before, counts)
    in_budget = total <= np.repeat(budgets, counts)
    plain = can_be & in_budget
    grows = np.ones(len(every), bool)
    grows[1:] = phys[1:] >= phys[:-1] + size[:-1]  # merged by physical offset, a queue keeps its order
    grows[firsts[counts > 0]] = True  # a queue's first entry follows no other
    plain &= grows
    # the first entry not taken of each queue, or the queue's end
    bad = np.append(np.flatnonzero(~plain), len(every))
    stop = np.minimum(bad[np.searchsorted(bad, firsts)], ends)
    k = stop - firsts
    inside = (k > 0) & (k < counts)
    probe = np.minimum(stop, len(every) - 1)
    full = inside & can_be[probe] & ~in_budget[probe]
    nbytes = np.where(k > 0, total[np.maximum(stop - 1, 0)], 0)
    return k, full, nbytes


def _recheck_last(local: LocalStore, q: _Queue) -> None:
    """The queue's last entry read again now that its record was read: when
    it changed, it was being written, and what the pass took from it is
    not to be trusted; the per-queue read does the queue again."""
    if q.last is None or q.taken != len(q.entries):
        return
    start, at, seen = q.last
    try:
        now = local._queue(q.job.topic, q.job.queue_id).read_bytes(start, at, CQ_ENTRY_SIZE)
    except FileNotFoundError:
        now = b""
    q.redo = now != seen


class _Columns:
    """The pass's per-queue state as arrays, one item a queue of ``queues``:
    a window updates it with array operations over all its queues (a Python
    step a queue a window cost more than the queue's records at 1,000
    queues). The records a window takes are kept as arrays too and handed to
    each builder once, at the end of the walk (``flush``)."""

    def __init__(self, queues: list[_Queue]) -> None:
        n = len(queues)
        self.queues = queues
        counts = np.fromiter((len(q.entries) for q in queues), np.int64, n)
        self.first = np.cumsum(counts) - counts  # of each queue's entries in ``every``
        self.every = _joined([q.entries for q in queues])
        self.limit = np.fromiter((q.limit for q in queues), np.int64, n)
        self.taken = np.zeros(n, np.int64)
        self.filled = np.fromiter((q.builder.nbytes for q in queues), np.int64, n)  # bytes in its buffer
        self.crc = np.fromiter((q.builder.crc() for q in queues), np.int64, n)  # CRC-32 of those bytes
        self.stopped = np.zeros(n, bool)  # stopped by the fallback's own key search
        # each builder's buffer (``SegmentBuilder.buffer``) and its length, asked once
        self.buffers = [q.builder.buffer(q.builder.nbytes) for q in queues]
        self.room = np.fromiter(map(len, self.buffers), np.int64, n)
        self.start = np.fromiter((q.job.start for q in queues), np.int64, n)
        self.queue_id = np.fromiter((q.job.queue_id for q in queues), np.int64, n)
        self.keyed = np.fromiter((q.job.key_index for q in queues), bool, n)
        self.tails, self.blob = run_tails([q.job.topic.encode("utf-8") for q in queues])
        # check_copy_runs's answers, each record's at its entry's row of ``every``: a
        # queue's records stay in order with no sort; handed to its builder from ``given``
        self.out = np.empty((6, len(self.every)), np.int64)
        self.given = np.zeros(n, np.int64)
        # keys taken and not handed yet, window by window: (their record's row of ``every``, hash)
        self.keys: list[tuple[np.ndarray, np.ndarray]] = []

    def flush(self) -> None:
        """Every builder given the records taken for it since the last flush.
        (The order of a queue's keys is free: ``index_of_hashes`` sorts them.)"""
        due = np.flatnonzero(self.taken > self.given)
        if not len(due):
            return
        # keys by their record's row of ``every``, which orders them by queue and
        # offset: one sort of a few runs already in order (a window's are)
        rows = np.concatenate([r for r, _h in self.keys]) if self.keys else np.zeros(0, np.int64)
        hashes = np.concatenate([h for _r, h in self.keys]) if self.keys else np.zeros(0, np.uint64)
        several, self.keys = len(self.keys) > 1, []
        if several or np.any(rows[1:] < rows[:-1]):
            order = np.argsort(rows, kind="stable")
            rows, hashes = rows.take(order), hashes.take(order)
        lo, hi = self.first[due] + self.given[due], self.first[due] + self.taken[due]
        k_lo, k_hi = np.searchsorted(rows, lo).tolist(), np.searchsorted(rows, hi).tolist()
        sizes, tags, store, born = self.out[1], self.out[2], self.out[3], self.out[4]
        for qi, first, r_lo, r_hi, a, b, end, crc in zip(due.tolist(), self.first[due].tolist(), lo.tolist(),
                                                         hi.tolist(), k_lo, k_hi, self.filled[due].tolist(),
                                                         self.crc[due].tolist()):
            self.queues[qi].builder.extend(end, sizes[r_lo:r_hi], tags[r_lo:r_hi], store[r_lo:r_hi],
                                           born[r_lo:r_hi], rows[a:b] - first, hashes[a:b], crc=crc)
        self.given[due] = self.taken[due]

    def settle(self) -> None:
        """The arrays' word written back to each queue, after the walk."""
        self.flush()
        for q, limit, taken in zip(self.queues, self.limit.tolist(), self.taken.tolist()):
            q.limit, q.taken = limit, taken


def _walk(local: LocalStore, queues: list[_Queue]) -> tuple[int, int, int, float]:
    """Every queue's plain entries read in physical order, window by window.
    Returns (records, bytes, windows) read and the CPU seconds of the
    threads the windows started."""
    counts = [q.limit for q in queues]
    if not sum(counts):
        return 0, 0, 0, 0.0
    cols = _Columns(queues)
    phys, size = cols.every["phys"].astype(np.int64), cols.every["size"].astype(np.int64)
    before = np.zeros(len(size) + 1, np.int64)  # the bytes of the entries before each one
    np.cumsum(size, out=before[1:])
    threads = pass_threads()
    owner = np.repeat(np.arange(len(queues)), counts)
    index = np.arange(len(phys)) - np.repeat(cols.first, counts)  # in its queue's entries
    order = np.argsort(phys, kind="stable")
    # (take: a third of the time of indexing with an array)
    phys, size, owner, index = phys.take(order), size.take(order), owner.take(order), index.take(order)
    commitlog = local.commitlog
    starts = np.asarray(commitlog.starts, np.int64)
    file_at = np.searchsorted(starts, phys, side="right") - 1
    # windows: one CommitLog file each, cut every window_bytes of it
    width = window_bytes(sum(1 for n in counts if n))
    key = file_at * (1 << 40) + np.where(file_at >= 0, phys - starts[np.maximum(file_at, 0)], 0) // width
    cuts = np.flatnonzero(key[1:] != key[:-1]) + 1
    records = nbytes = windows = 0
    helpers_cpu = 0.0
    for lo, hi in zip(np.concatenate(([0], cuts)).tolist(), np.concatenate((cuts, [len(phys)])).tolist()):
        f = int(file_at[lo])
        w_phys, w_size, w_owner, w_index = phys[lo:hi], size[lo:hi], owner[lo:hi], index[lo:hi]
        if f < 0:
            np.minimum.at(cols.limit, w_owner, w_index)  # before the first file: the per-queue read reports it
            continue
        base = int(starts[f])
        try:
            view = commitlog.view(base, int((w_phys + w_size).max()) - base)
        except FileNotFoundError:
            np.minimum.at(cols.limit, w_owner, w_index)  # deleted meanwhile: the per-queue read reports the gap
            continue
        inside = w_phys + w_size - base <= len(view)
        if not inside.all():  # the file ends before them: a tail, which the per-queue read decides
            np.minimum.at(cols.limit, w_owner[~inside], w_index[~inside])
        r_lo, r_hi = int(w_phys[0]) - base, int((w_phys + w_size).max()) - base
        if int(w_size.sum()) * _DENSE >= r_hi - r_lo:
            commitlog.populate(base, r_lo, r_hi)
        source = str(commitlog.path(base))
        try:
            n, b, cpu = _window(cols, view, base, source, w_owner, w_index, before, threads)
        finally:
            commitlog.release(base, r_lo, r_hi)  # the builders copied what they keep
        records += n
        nbytes += b
        windows += 1
        helpers_cpu += cpu
    cols.settle()
    return records, nbytes, windows, helpers_cpu


_RAW = np.dtype(f"V{CQ_DTYPE.itemsize}")


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    """CQ_DTYPE arrays one after the other, joined as raw bytes: numpy joins
    structured arrays field by field, promoting each array's dtype (~3 us an
    array, a thousand arrays a window at 1,000 queues)."""
    # (as CQ_DTYPE first: numpy's own joins hand back the native byte order, the same values)
    return np.concatenate([np.asarray(p, CQ_DTYPE).view(_RAW) for p in parts]).view(CQ_DTYPE)


def _ragged(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """starts[r], starts[r] + 1, ... counts[r] items for each r, one after the other."""
    ends = np.cumsum(counts)
    return np.arange(int(ends[-1]) if len(ends) else 0) + np.repeat(starts - (ends - counts), counts)


def _window(cols: _Columns, view: memoryview, base: int, source: str, owners: np.ndarray, indices: np.ndarray,
            before: np.ndarray, threads: int) -> tuple[int, int, float]:
    """Each queue's entries of one window checked as ``check_run`` checks
    them and copied into their builders' buffers, each segment's CRC-32
    continued over the records kept: every queue's run in one compiled call
    (a queue's entries in a window are consecutive), cut by bytes over
    ``threads`` threads; their keys then found at once for the whole window.
    ``before``: the bytes of ``cols.every``'s entries before each row (and
    after the last). Returns (records, bytes, CPU seconds of the threads
    started)."""
    by_queue = np.argsort(owners, kind="stable")
    owners, indices = owners.take(by_queue), indices.take(by_queue)
    cuts = np.flatnonzero(owners[1:] != owners[:-1]) + 1
    firsts, lasts = np.concatenate(([0], cuts)), np.concatenate((cuts, [len(owners)])) - 1
    qs, i0 = owners[firsts], indices[firsts]
    i1 = np.minimum(indices[lasts] + 1, cols.limit[qs])
    go = ~cols.stopped[qs] & (i0 == cols.taken[qs]) & (i1 > i0)  # else stopped earlier: the per-queue read's
    qs, i0, counts = qs[go], i0[go], (i1 - i0)[go]
    if not len(qs):
        return 0, 0, 0.0
    rows = cols.first[qs] + i0  # each run's rows of ``every``, whose answers go to the same rows of ``out``
    at = cols.filled[qs]
    _room(cols, qs, at + before[rows + counts] - before[rows])
    table = np.empty((len(qs), COPY_FIELDS), np.int64)
    table[:, 0] = rows
    table[:, 1] = np.where(cols.tails[qs, 0] != 0, counts, 0)  # a topic no record can hold: a run of none
    table[:, 2] = cols.queue_id[qs]
    table[:, 3] = cols.start[qs] + i0
    table[:, 4:7] = cols.tails[qs]
    table[:, 8] = at
    table[:, 9] = cols.crc[qs]
    buffers = cols.buffers
    # every queue's run in one call (a call a queue cost more than its records at 1,000 queues)
    _out, helpers_cpu = check_copy_runs(view, base, cols.every, table, cols.blob, [buffers[qi] for qi in qs.tolist()],
                                        source=source, out=cols.out, threads=threads)
    k = table[:, 7]
    short = k < counts
    cols.limit[qs[short]] = i0[short] + k[short]  # the per-queue read decides the next
    some = k > 0
    qs, i0, k, rows, kept, crcs = qs[some], i0[some], k[some], rows[some], table[some, 10], table[some, 9]
    if not len(qs):
        return 0, 0, helpers_cpu
    taken = _ragged(rows, k)  # the records taken, run after run: their rows of ``out``
    pos = cols.out[0].take(taken)
    ends = pos + cols.out[1].take(taken)
    run_of = np.repeat(np.arange(len(qs)), k)
    try:
        keys = _window_keys(view, pos, ends, cols.out[5].take(taken), run_of, cols.keyed[qs])
    except BadProperties:
        # the copies made are not counted: the builders add these records again, one queue at a time
        return (*_window_one_by_one(cols, view, source, cols.out[:, taken], qs, i0, k), helpers_cpu)
    cols.filled[qs] = at[some] + kept
    cols.crc[qs] = crcs
    cols.taken[qs] += k
    if keys is not None:
        got, hashes = keys
        cols.keys.append((taken.take(got), hashes))
    return int(k.sum()), int(kept.sum()), helpers_cpu


def _window_keys(view: memoryview, pos: np.ndarray, ends: np.ndarray, props: np.ndarray, run_of: np.ndarray,
                 keyed: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """The keys of the window's records (run after run) of queues with a key
    index, found in one go, as ``SegmentBuilder.add`` would find them batch
    by batch: (the record's index, key hash). Raises BadProperties when a
    record's properties are not UTF-8."""
    rows = np.flatnonzero(keyed[run_of]) if not keyed.all() else None
    if rows is None:
        return record_key_hashes(view, props, ends)
    if not len(rows):
        return None
    at, hashes = record_key_hashes(view, props.take(rows), ends.take(rows))
    return rows.take(at), hashes


def _room(cols: _Columns, qs: np.ndarray, need: np.ndarray) -> None:
    """The buffers of queues ``qs`` grown to ``need`` bytes where they are
    shorter (the room was reserved for every entry the pass reads: never,
    unless that changed)."""
    short = need > cols.room[qs]
    for qi, end in zip(qs[short].tolist(), need[short].tolist()):
        cols.buffers[qi] = cols.queues[qi].builder.buffer(end)
        cols.room[qi] = len(cols.buffers[qi])


def _window_one_by_one(cols: _Columns, view: memoryview, source: str, out: np.ndarray, qs: np.ndarray,
                       i0: np.ndarray, k: np.ndarray) -> tuple[int, int]:
    """A window with a record whose properties are not UTF-8: each queue's
    records added by its builder, which finds its own keys and stops its
    queue at that record (the records before it kept)."""
    cols.flush()  # the builders up to date before they add
    bounds = np.concatenate(([0], np.cumsum(k))).tolist()
    records = nbytes = 0
    for r, (qi, first) in enumerate(zip(qs.tolist(), i0.tolist())):
        q = cols.queues[qi]
        lo, hi = bounds[r], bounds[r + 1]
        batch = RecordBatch(q.job.start + first, view, source, *(out[f, lo:hi] for f in range(6)))
        before, had = q.builder.count, q.builder.nbytes
        try:
            q.builder.add(batch)
        except CorruptRecordError as exc:
            q.stop = exc
            cols.stopped[qi] = True
        records += q.builder.count - before
        nbytes += q.builder.nbytes - had
        cols.taken[qi] = cols.given[qi] = q.builder.count  # the builder holds them already
        cols.filled[qi] = q.builder.nbytes
        cols.crc[qi] = q.builder.crc()  # continued over the bytes ``add`` copied
        cols.buffers[qi] = q.builder.buffer(q.builder.nbytes)  # ``add`` may have grown it
        cols.room[qi] = len(cols.buffers[qi])
    return records, nbytes


def _finish(local: LocalStore, q: _Queue) -> int:
    """The per-queue read from where the pass left the queue, with the rest of
    its budget; 1 when it ran."""
    q.limit = q.taken
    job = q.job
    if q.redo:
        q.builder = SegmentBuilder(job.prefix, job.start, job.cl_start, key_index=job.key_index,
                                   layout=job.layout, compression=job.compression)
        q.stop = None
    elif q.stop is not None or (q.taken == len(q.entries) and (q.full or q.at_end)):
        # full: the pass took every entry up to the one passing the budget;
        # at_end: every entry written when the pass began
        return 0
    builder = q.builder
    if builder.nbytes >= job.segment_bytes:
        return 0
    try:
        for batch in local.iter_batches(job.topic, job.queue_id, builder.next_offset,
                                        max_bytes=job.segment_bytes - builder.nbytes):
            if builder.count and builder.nbytes + int(batch.sizes[0]) > job.segment_bytes:
                break  # only a segment's first record may pass the budget
            builder.add(batch)
    except (CorruptRecordError, ExpiredLocallyError) as exc:
        q.stop = exc
    return 1
