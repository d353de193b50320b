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
   changed, the queue is read again by the per-queue read. Every queue's
   entries are read in one call (``_read_heads``, ``preads.read_files``:
   compiled, the GIL given up once for all the queues, where a ``pread``
   a queue gave it up four times and a pass over 1,000 queues spent most
   of its wall time getting it back from the upload threads), as many as
   the round's look at the queue found written and a few more, not mapped;
   the first step of ``_pending`` and the plain entries are found for all
   queues at once (``_plain_runs``); only a queue with more pending than
   its head holds reads on by itself. The files stay open until the last
   entries are read again, all in one more call, which closes them (up to
   a quarter of the descriptors the process may open; beyond, they are
   opened again by name).
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
   and done on up to ``PassOptions.pass_threads()`` threads, the cores this
   process may use; a piece that stops at a record the checks refuse ends its queue's
   run there, whatever the pieces after it did. The pass's per-queue state
   is kept as arrays (``_Columns``), so a window costs array operations
   over its queues, not Python calls a queue; each builder is handed its
   records' arrays and CRCs once, after the walk, in one
   ``SegmentBuilder.extend_many``.
3. ``_finish``: where the pass left a queue short of its budget (a record
   ``check_run`` does not accept, a filler, the last entry, the end of a
   ConsumeQueue file, a CommitLog file gone), the per-queue read continues
   from that offset with the rest of the budget. It decides tails, races and
   errors as it always has: a corrupt record stops its queue with the typed
   error naming file and offset, and no other queue. ``build_segment`` runs
   it alone for a job no pass was given (an LMQ queue, a step after a gap):
   the per-queue read has no other way in.

The segments are those the per-queue build makes: same records, same
boundaries (the budget rule of ``QueueCursor`` is kept, including "the
first record of a segment is taken whatever its size"), same bytes.
"""

from __future__ import annotations

import os
import resource
import time
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tiered.dispatcher.segment import BuiltSegment, SegmentBuilder
from tiered.dispatcher.segment import ragged
from tiered.errors import CorruptRecordError, ExpiredLocallyError
from tiered.format.batch import COPY_FIELDS, CQ_DTYPE, check_copy_runs, copies_in_stretches, run_tails
from tiered.format.keyindex import BadProperties, record_key_hashes
from tiered.format.codec import CQ_ENTRY_SIZE, CQ_FILLER_SIZE, crc32
from tiered.store.localstore import LocalStore
from tiered.store.mappedfiles import QueueFiles
from tiered.store.preads import close_kept, read_files, read_kept
from tiered.store.queuecursor import NO_LIMIT

# a window's pages are mapped at once when the records read fill at least 1/_DENSE of it
_DENSE = 4
# a window's copy is bound by memory bandwidth well before more threads
MAX_THREADS = 8


@dataclass(frozen=True, kw_only=True)
class PassOptions:
    """How a pass reads: ``threads`` is ``dispatch.pass_threads``; the rest
    are fixed in the product and set by tests for small stores."""

    # threads checking and copying a window (without the GIL, in the compiled
    # call); None: the cores this process may run on, at most MAX_THREADS
    threads: int | None = None
    # A window of one CommitLog file is mapped in one call and given back
    # behind the pass. Its array work costs ~100 us a queue whatever their
    # records, so a pass over many queues takes wider windows: ``window``
    # more bytes every ``queues_per_step`` queues, up to ``max_window``. A
    # sparse pass (records filling less than 1/_DENSE of their span) takes
    # ``max_window`` windows, copied in stretches of ``window``.
    window: int = 32 << 20
    max_window: int = 128 << 20
    queues_per_step: int = 256
    # ConsumeQueue entries read at first by ``_pending``, then four times more
    # each step; and read past those the round's look found written
    # (``QueueFiles.written``): what the broker may have added since
    scan: int = 1024
    slack: int = 64

    def window_bytes(self, queues: int) -> int:
        """The window of a pass over ``queues`` queues."""
        return min(self.max_window, self.window * max(1, -(-queues // self.queues_per_step)))

    def pass_threads(self) -> int:
        """The threads a pass's windows are checked and copied on."""
        if self.threads is not None:
            return max(1, self.threads)
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


@dataclass(frozen=True, kw_only=True)
class BuildJob:
    """One segment to build: ``queue_id`` of ``topic`` from queue offset
    ``start``, its bytes numbered from cold CommitLog byte ``cl_start``."""

    prefix: str
    topic: str
    queue_id: int
    start: int
    cl_start: int
    segment_bytes: int
    key_index: bool
    layout: int = 2
    compression: str = "none"
    batch: bool = False  # a BatchCQ queue (``SegmentBuilder``'s ``batch``)

    def builder(self) -> SegmentBuilder:
        return SegmentBuilder(self.prefix, self.start, self.cl_start, key_index=self.key_index, layout=self.layout,
                              compression=self.compression, batch=self.batch)


@dataclass(slots=True)
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


def build_pass(local: LocalStore, jobs: list[BuildJob], options: PassOptions = PassOptions()
               ) -> tuple[dict[tuple[str, int], Planned], PassStats]:
    """The next segment of every job's queue, as ``build_segment`` builds
    it, from one CommitLog pass. Returns (topic, queue) -> (job,
    builder, stop) and what the pass read: ``builder.build()`` (when it holds
    records) gives the segment; ``stop`` is the corrupt record or expired
    offset that ended it early, as in ``build_segment``. Raises nothing for
    a queue's data."""
    started, cpu = time.perf_counter(), time.thread_time()
    confirmed = local.confirmed_offset()
    phys_limit = confirmed if confirmed is not None else NO_LIMIT
    local.commitlog.refresh()  # files the broker started or deleted since the last look
    queues, every, kept = _gather(local, jobs, phys_limit, options)
    try:
        records, nbytes, windows, helpers_cpu = _walk(local, queues, every, options)
        _recheck_last(local, queues, kept)
    finally:
        if kept is not None:
            close_kept(kept)  # what the recheck did not close (it raised, or the walk did)
    out: dict[tuple[str, int], Planned] = {}
    continued = 0
    for q in queues:
        if _finish(local, q):
            continued += 1
            local.release_queue(q.job.topic, q.job.queue_id)  # what the per-queue read mapped
        out[(q.job.topic, q.job.queue_id)] = (q.job, q.builder, q.stop)
    stats = PassStats(queues=len(jobs), records=records, nbytes=nbytes, windows=windows, continued=continued,
                      seconds=time.perf_counter() - started,
                      cpu_seconds=time.thread_time() - cpu + helpers_cpu)
    return out, stats


def _keep_limit() -> int:
    """How many ConsumeQueue files a pass keeps open between its two reads of
    them (the heads, then the last entries: a read each, not an open, a
    read and a close each): a quarter of the descriptors this process may
    open, whose mapped ConsumeQueue files hold one each already."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return NO_LIMIT if soft == resource.RLIM_INFINITY else soft // 4


@dataclass(frozen=True, kw_only=True)
class _Heads:
    """The first read of every job's ConsumeQueue entries (``_read_heads``),
    one item a job. Entries ``first[i]:first[i] + count[i]`` of ``table``
    are job i's from its start offset, in the file of that offset."""

    files: list[QueueFiles]
    start: np.ndarray  # int64: that file's start byte; -1: there is none (before the first file)
    rel: np.ndarray  # the job's start byte in that file
    end: np.ndarray  # where that file's entries end (``entries_end``); -1: not read (no file, or gone)
    asked: np.ndarray  # entries asked for
    first: np.ndarray
    count: np.ndarray  # entries read, up to ``end``
    table: np.ndarray  # CQ_DTYPE
    # each job's file left open for the recheck (preads.read_kept; -1: none), or None: not kept
    kept: np.ndarray | None


def _read_heads(local: LocalStore, jobs: list[BuildJob], options: PassOptions) -> _Heads:
    """Each job's ConsumeQueue entries from its start offset, every job's read
    in one call (``preads.read_files``: the GIL given up once, not four times
    a queue). As many entries as the round's look at the queue found written
    after the start, and ``options.slack`` more, at most ``options.scan``."""
    n = len(jobs)
    scan, slack = options.scan, options.slack
    files = [local.queue_files(job.topic, job.queue_id) for job in jobs]
    # per queue: plain Python lists, made arrays once (a numpy item set a queue costs more)
    start, bound, asked = [-1] * n, [NO_LIMIT] * n, [0] * n  # bound: the next file's start, relative
    read: list[int] = []
    paths: list[str] = []
    for i, job, f in zip(range(n), jobs, files):
        byte = job.start * CQ_ENTRY_SIZE
        starts = f.starts
        j = bisect_right(starts, byte) - 1  # files.locate
        if j < 0:
            continue  # the per-queue read says why
        s = start[i] = starts[j]
        if j + 1 < len(starts):
            bound[i] = (starts[j + 1] - s) // CQ_ENTRY_SIZE * CQ_ENTRY_SIZE
        written = f.written.get(s)
        if written is None:
            ask = scan
        else:
            ask = written - (byte - s) // CQ_ENTRY_SIZE
            ask = (ask if ask > 0 else 0) + slack
            ask = ask if ask < scan else scan
        asked[i] = ask
        read.append(i)
        paths.append(f.name(s))
    rows = np.asarray(read, np.int64)
    starts_, asked_ = np.asarray(start, np.int64), np.asarray(asked, np.int64)
    rel = np.fromiter((job.start for job in jobs), np.int64, n) * CQ_ENTRY_SIZE - starts_
    spans = read_files(paths, rel[rows], asked_[rows] * CQ_ENTRY_SIZE, sizes=True, keep=len(paths) <= _keep_limit())
    kept = None
    if spans.kept is not None:
        kept = np.full(n, -1, np.int64)
        kept[rows] = spans.kept  # the descriptors now live here only: closed through this array, once
    end = np.full(n, -1, np.int64)
    # entries_end: the next file's start bounds them; missing files stay -1
    end[rows] = np.where(spans.got >= 0, np.minimum(spans.sizes, np.asarray(bound, np.int64)[rows]), -1)
    count = np.zeros(n, np.int64)
    count[rows] = np.maximum(np.minimum(spans.got, end[rows] - rel[rows]), 0) // CQ_ENTRY_SIZE
    first = np.zeros(n, np.int64)
    first[rows] = spans.at // CQ_ENTRY_SIZE
    return _Heads(files=files, start=starts_, rel=rel, end=end, asked=asked_, first=first, count=count,
                  table=spans.data.view(CQ_DTYPE), kept=kept)


def _gather(local: LocalStore, jobs: list[BuildJob], phys_limit: int, options: PassOptions
            ) -> tuple[list[_Queue], np.ndarray, np.ndarray | None]:
    """Each job's queue with the plain entries the pass reads, those entries
    of every queue one after the other (``_Columns.every``), and the
    ConsumeQueue files left open for the recheck (``_Heads.kept``: the
    caller closes them). What ``_pending`` reads for each queue, found for
    all of them at once in their heads (``_read_heads``); a queue whose head
    does not reach its written end or an entry the pass cannot take (more
    pending than the head holds) reads on by itself."""
    heads = _read_heads(local, jobs, options)
    try:
        queues, every = _queues_of(jobs, heads, phys_limit)
    except BaseException:
        if heads.kept is not None:
            close_kept(heads.kept)
        raise
    return queues, every, heads.kept


def _queues_of(jobs: list[BuildJob], heads: _Heads, phys_limit: int) -> tuple[list[_Queue], np.ndarray]:
    """``_gather``'s queues and entries from the heads read."""
    n = len(jobs)
    budgets = np.fromiter((job.segment_bytes for job in jobs), np.int64, n)
    # _pending's first step, every queue at once: a chunk of the head, up to
    # the first entry of size 0 (the written end) or the end of the file
    at = heads.rel // CQ_ENTRY_SIZE
    last = heads.end // CQ_ENTRY_SIZE
    some = (heads.end >= 0) & (heads.rel + CQ_ENTRY_SIZE <= heads.end)  # else the per-queue read says why
    chunk = np.where(some, np.minimum(heads.asked, last - at), 0)
    alone = some & (chunk > heads.count)  # the head is short of the chunk: _pending reads it itself
    chunk[alone] = 0
    zero = _first_in_runs(heads.table["size"] == 0, heads.first, chunk)
    read = np.minimum(zero, chunk)  # entries up to the written end
    ended = some & ~alone & ((zero < chunk) | (at + chunk >= last))
    hi = np.where(ended, at + read, -1)  # the written end, where it was found
    k, full, nbytes = _plain_runs(heads.table, heads.first, read, phys_limit, budgets)
    # entries all plain up to the head's end, the written end not in sight: read on
    alone |= some & ~ended & ~alone & (k == read)
    parts: dict[int, tuple[np.ndarray, int | None]] = {}
    for i in np.flatnonzero(alone).tolist():
        head = heads.table[int(heads.first[i]):int(heads.first[i] + heads.count[i])]
        entries, end_ = _read_on(heads.files[i], int(heads.start[i]), int(heads.rel[i]), int(heads.end[i]), head,
                                 int(heads.asked[i]), phys_limit, int(budgets[i]))
        parts[i] = entries, end_
        k[i], full[i] = _plain(entries, phys_limit, int(budgets[i]))
        nbytes[i] = int(entries["size"][:k[i]].astype(np.int64).sum())
        read[i], hi[i] = len(entries), -1 if end_ is None else end_
    every = _taken(heads, parts, k)
    firsts = np.cumsum(k) - k
    # the last written entry may be the one the broker is writing: it is read
    # again after its record, as QueueCursor._one_entry does
    recheck = (k > 0) & (k == read) & (hi >= 0)
    at_end = (recheck & (hi * CQ_ENTRY_SIZE < heads.end)).tolist()
    last_byte = ((hi - 1) * CQ_ENTRY_SIZE).tolist()
    queues = []
    for job, k_, full_, nbytes_, first, again, start, byte, end in zip(
            jobs, k.tolist(), full.tolist(), nbytes.tolist(), firsts.tolist(), recheck.tolist(), heads.start.tolist(),
            last_byte, at_end):
        builder = job.builder()
        q = _Queue(job, builder, every[first:first + k_], k_, 0, full_)
        if k_:
            builder.reserve(nbytes_, k_)  # what the pass will copy, allocated once
        if again:
            q.last = (start, byte, every[first + k_ - 1:first + k_].tobytes())
            q.at_end = end
        queues.append(q)
    return queues, every


def _first_in_runs(flags: np.ndarray, firsts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """For each run r (``flags[firsts[r]:firsts[r] + counts[r]]``), the index in
    the run of its first True flag, or ``counts[r]``."""
    hits = np.append(np.flatnonzero(flags), len(flags))
    return np.minimum(hits[np.searchsorted(hits, firsts)] - firsts, counts)


def _taken(heads: _Heads, parts: dict[int, tuple[np.ndarray, int | None]], k: np.ndarray) -> np.ndarray:
    """The first ``k[i]`` entries read for each queue i, one queue after the
    other: from its head, or from ``parts`` for a queue that read on."""
    if not parts:
        return heads.table.take(ragged(heads.first, k))
    # the parts behind the heads' table, as rows of one array
    source = _joined([heads.table, *(entries for entries, _end in parts.values())])
    starts = heads.first.copy()
    behind = np.cumsum([len(heads.table)] + [len(entries) for entries, _end in parts.values()])
    for (i, _part), row in zip(parts.items(), behind[:-1].tolist()):
        starts[i] = row
    return source.take(ragged(starts, k))


def _read_on(files: QueueFiles, start: int, rel: int, end: int, head: np.ndarray, step: int, phys_limit: int,
             budget: int) -> tuple[np.ndarray, int | None]:
    """``_pending`` of a queue from its start, in ConsumeQueue file ``start``
    whose entries end at ``end``, the first entries from ``head`` (read
    already), the next read from the file."""

    def read(at: int, n: int) -> np.ndarray | None:
        if at == rel // CQ_ENTRY_SIZE and n <= len(head):
            return head[:n]
        try:
            more = files.read_bytes(start, at * CQ_ENTRY_SIZE, n * CQ_ENTRY_SIZE)
        except FileNotFoundError:
            return None  # deleted since the first read: the per-queue read goes on from here and reports it
        return np.frombuffer(more, CQ_DTYPE, count=len(more) // CQ_ENTRY_SIZE)

    return _pending(read, rel // CQ_ENTRY_SIZE, end // CQ_ENTRY_SIZE, phys_limit, budget, step)


def _pending(read: Callable[[int, int], np.ndarray | None], first: int, last: int, phys_limit: int,
             budget: int, step: int) -> tuple[np.ndarray, int | None]:
    """The entries from ``first`` up to the written end (the first entry of
    size 0, or ``last``; entries are written in order), and that end; or,
    when an entry the pass cannot take (``_plain``) comes first, the entries
    up to and past it, and None. Read forward in growing steps by
    ``read(at, n)`` (up to ``n`` entries from entry ``at``, not a view of
    mapped pages; fewer: the file ends there now; None: it cannot be read
    any more, and the entries read so far are returned with None): what a
    segment takes and a step more, where finding the written end by
    bisection over the whole file faulted in a page for each probe (a
    fifth of the pass's CPU at 1,000 queues). The first step reads ``step``
    entries, each next four times more."""
    parts: list[np.ndarray] = []
    at, step = first, max(1, step)
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


def _plain_runs(table: np.ndarray, firsts: np.ndarray, counts: np.ndarray, phys_limit: int, budgets: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``_plain`` of every queue's entries at once, queue i's being
    ``table[firsts[i]:firsts[i] + counts[i]]`` (runs in order, not
    overlapping; rows between them are not read): a dozen numpy calls a
    queue cost more than its few entries at 1,000 queues. For each, how
    many leading entries the pass takes, whether the one after them passes
    the budget, and the bytes of those taken."""
    n = len(counts)
    if not counts.sum():
        zeros = np.zeros(n, np.int64)
        return zeros, zeros.astype(bool), zeros
    rows = ragged(firsts, counts)
    every = table.take(rows) if len(rows) != len(table) else table
    firsts = np.cumsum(counts) - counts  # of each queue's entries in ``every``
    ends = firsts + counts
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


def _recheck_last(local: LocalStore, queues: list[_Queue], kept: np.ndarray | None) -> None:
    """Each queue's last entry read again now that its record was read (every
    queue's in one call, through the files ``_read_heads`` kept open, which
    it closes; else by name): when it changed, it was being written, and
    what the pass took from it is not to be trusted; the per-queue read
    does the queue again. (Through a kept file, a file the broker deleted
    meanwhile still reads as it was: its entry was not being written.)"""
    due = [i for i, q in enumerate(queues) if q.last is not None and q.taken == len(q.entries)]
    lasts = [last for last in (queues[i].last for i in due) if last is not None]
    if kept is not None:
        los, ns = np.zeros(len(queues), np.int64), np.zeros(len(queues), np.int64)
        los[due] = [at for _s, at, _seen in lasts]
        ns[due] = CQ_ENTRY_SIZE
        spans = read_kept(kept, los, ns)  # and every file closed, due or not
        got, now = spans.got[due], spans.data.reshape(-1, CQ_ENTRY_SIZE)
    elif due:
        paths = [local.queue_files(queues[i].job.topic, queues[i].job.queue_id).name(start)
                 for i, (start, _at, _seen) in zip(due, lasts)]
        spans = read_files(paths, np.fromiter((at for _s, at, _seen in lasts), np.int64, len(lasts)),
                           np.full(len(lasts), CQ_ENTRY_SIZE, np.int64))
        got, now = spans.got, spans.data.reshape(-1, CQ_ENTRY_SIZE)
    if not due:
        return
    # a file gone reads as nothing: not what was seen
    seen = np.frombuffer(b"".join(s for _s, _at, s in lasts), np.uint8).reshape(-1, CQ_ENTRY_SIZE)
    same = (got == CQ_ENTRY_SIZE) & (now == seen).all(axis=1)
    for i, same_ in zip(due, same.tolist()):
        queues[i].redo = not same_


class _Columns:
    """The pass's per-queue state as arrays, one item a queue of ``queues``:
    a window updates it with array operations over all its queues (a Python
    step a queue a window cost more than the queue's records at 1,000
    queues). The records a window takes are kept as arrays too and handed to
    each builder once, at the end of the walk (``flush``), with their keys,
    read from the builders' buffers then (a window's pages may be given back
    before its Python work is done)."""

    def __init__(self, queues: list[_Queue], every: np.ndarray) -> None:
        """``every``: the queues' entries one after the other (``_gather``)."""
        n = len(queues)
        self.queues = queues
        counts = np.fromiter((len(q.entries) for q in queues), np.int64, n)
        self.first = np.cumsum(counts) - counts  # of each queue's entries in ``every``
        self.every = every
        self.limit = np.fromiter((q.limit for q in queues), np.int64, n)
        self.taken = np.zeros(n, np.int64)
        self.filled = np.fromiter((q.builder.nbytes for q in queues), np.int64, n)  # bytes in its buffer
        self.crc = np.fromiter((q.builder.crc() for q in queues), np.int64, n)  # CRC-32 of those bytes
        self.flushed = self.filled.copy()  # bytes in its buffer at the last flush
        # each builder's buffer (``SegmentBuilder.buffer``) and its length, asked once
        self.buffers = [q.builder.buffer(q.builder.nbytes) for q in queues]
        self.room = np.fromiter(map(len, self.buffers), np.int64, n)
        self.start = np.fromiter((q.job.start for q in queues), np.int64, n)
        self.queue_id = np.fromiter((q.job.queue_id for q in queues), np.int64, n)
        self.keyed = np.fromiter((q.job.key_index for q in queues), bool, n)
        # each topic's tail once: a pass over 1,000 queues has a few topics
        topics: dict[str, int] = {}
        of_topic = np.fromiter((topics.setdefault(q.job.topic, len(topics)) for q in queues), np.int64, n)
        tails, self.blob = run_tails([topic.encode("utf-8") for topic in topics])
        self.tails = tails.take(of_topic, axis=0)
        # check_copy_runs's answers, each record's at its entry's row of ``every``: a
        # queue's records stay in order with no sort; handed to its builder from ``given``
        self.out = np.empty((6, len(self.every)), np.int64)
        self.given = np.zeros(n, np.int64)

    def flush(self) -> None:
        """Every builder given the records taken for it since the last flush,
        and their keys (``_keys``)."""
        due = np.flatnonzero(self.taken > self.given)
        if not len(due):
            return
        keys = [self._keys(qi) for qi in due.tolist()]  # may cut a queue short: first
        first = self.first[due]
        lo, hi = first + self.given[due], first + self.taken[due]
        offsets = np.concatenate([at for at, _h in keys]) if keys else np.zeros(0, np.int64)
        hashes = np.concatenate([h for _at, h in keys]) if keys else np.zeros(0, np.uint64)
        bounds = np.concatenate(([0], np.cumsum([len(at) for at, _h in keys]))).astype(np.int64)
        queues = self.queues
        SegmentBuilder.extend_many([queues[qi].builder for qi in due.tolist()], self.filled[due], self.out[1],
                                   self.out[2], self.out[3], self.out[4], lo, hi, offsets, hashes, bounds,
                                   self.crc[due])
        self.given[due] = self.taken[due]
        self.flushed[due] = self.filled[due]

    def _keys(self, qi: int) -> tuple[np.ndarray, np.ndarray]:
        """The keys of queue ``qi``'s records taken since the last flush, found
        in its buffer as ``SegmentBuilder.add`` would find them: (each key's
        entry index in the queue, its hash). A record whose properties are
        not UTF-8 ends what the pass takes of the queue there (its records
        before it kept, their CRC counted again): the per-queue read takes
        the queue on from it and stops it with the builder's own error."""
        lo, hi = int(self.first[qi] + self.given[qi]), int(self.first[qi] + self.taken[qi])
        if not self.keyed[qi]:
            return np.zeros(0, np.int64), np.zeros(0, np.uint64)
        sizes = self.out[1, lo:hi]
        at = int(self.flushed[qi]) + np.concatenate(([0], np.cumsum(sizes[:-1])))  # in the buffer
        starts, ends = at + (self.out[5, lo:hi] - self.out[0, lo:hi]), at + sizes
        buf = self.buffers[qi]
        try:
            rows, hashes = record_key_hashes(buf, starts, ends)
        except BadProperties as bad:
            k = bad.record
            rows, hashes = record_key_hashes(buf, starts[:k], ends[:k])
            self.taken[qi] = self.given[qi] + k
            self.limit[qi] = min(int(self.limit[qi]), int(self.taken[qi]))
            self.filled[qi] = int(at[k])
            with memoryview(buf) as view:
                self.crc[qi] = crc32(view[:int(self.filled[qi])])
        return rows + int(self.given[qi]), hashes

    def settle(self) -> None:
        """The arrays' word written back to each queue, after the walk."""
        self.flush()
        for q, limit, taken in zip(self.queues, self.limit.tolist(), self.taken.tolist()):
            q.limit, q.taken = limit, taken


def _walk(local: LocalStore, queues: list[_Queue], every: np.ndarray, options: PassOptions
          ) -> tuple[int, int, int, float]:
    """Every queue's plain entries read in physical order, window by window
    (``every``: see ``_Columns``). Returns (records, bytes, windows) read and
    the CPU seconds of the threads the windows started."""
    counts = [q.limit for q in queues]
    if not sum(counts):
        return 0, 0, 0, 0.0
    cols = _Columns(queues, every)
    phys, size = cols.every["phys"].astype(np.int64), cols.every["size"].astype(np.int64)
    before = np.zeros(len(size) + 1, np.int64)  # the bytes of the entries before each one
    np.cumsum(size, out=before[1:])
    threads = options.pass_threads()
    owner = np.repeat(np.arange(len(queues)), counts)
    index = np.arange(len(phys)) - np.repeat(cols.first, counts)  # in its queue's entries
    order = np.argsort(phys, kind="stable")
    # (take: a third of the time of indexing with an array)
    phys, size, owner, index = phys.take(order), size.take(order), owner.take(order), index.take(order)
    commitlog = local.commitlog
    starts = np.asarray(commitlog.starts, np.int64)
    file_at = np.searchsorted(starts, phys, side="right") - 1
    # windows: one CommitLog file each, cut every window_bytes of it (or, for a
    # sparse pass the compiled copy takes in stretches, every max_window)
    width, stretch = options.window_bytes(sum(1 for n in counts if n)), 0
    if _in_stretches(phys, size):
        width, stretch = options.max_window, options.window
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
        if not stretch and int(w_size.sum()) * _DENSE >= r_hi - r_lo:
            commitlog.populate(base, r_lo, r_hi)
        source = str(commitlog.path(base))
        try:
            n, b, cpu = _window(cols, view, base, source, w_owner, w_index, before, threads, stretch)
        finally:
            commitlog.release(base, r_lo, r_hi)  # the builders copied what they keep
        records += n
        nbytes += b
        windows += 1
        helpers_cpu += cpu
    cols.settle()
    return records, nbytes, windows, helpers_cpu


def _in_stretches(phys: np.ndarray, size: np.ndarray) -> bool:
    """Whether a pass over these records takes ``max_window`` windows, copied
    in stretches of ``window``: a sparse pass, with the compiled copy."""
    return bool(len(phys)) and copies_in_stretches() and int(size.sum()) * _DENSE < int((phys + size).max()
                                                                                        - phys.min())


_RAW = np.dtype(f"V{CQ_DTYPE.itemsize}")


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    """CQ_DTYPE arrays one after the other, joined as raw bytes: numpy joins
    structured arrays field by field, promoting each array's dtype (~3 us an
    array, a thousand arrays a window at 1,000 queues)."""
    # (as CQ_DTYPE first: numpy's own joins hand back the native byte order, the same values)
    return np.concatenate([np.asarray(p, CQ_DTYPE).view(_RAW) for p in parts]).view(CQ_DTYPE)


def _window(cols: _Columns, view: memoryview, base: int, source: str, owners: np.ndarray, indices: np.ndarray,
            before: np.ndarray, threads: int, stretch: int = 0) -> tuple[int, int, float]:
    """Each queue's entries of one window checked as ``check_run`` checks
    them and copied into their builders' buffers, each segment's CRC-32
    continued over the records kept: every queue's run in one compiled call
    (a queue's entries in a window are consecutive), cut by bytes over
    ``threads`` threads (in stretches of ``stretch`` bytes, each given back
    behind it, when > 0). ``before``: the bytes of ``cols.every``'s entries before each row (and
    after the last). Returns (records, bytes, CPU seconds of the threads
    started)."""
    by_queue = np.argsort(owners, kind="stable")
    owners, indices = owners.take(by_queue), indices.take(by_queue)
    cuts = np.flatnonzero(owners[1:] != owners[:-1]) + 1
    firsts, lasts = np.concatenate(([0], cuts)), np.concatenate((cuts, [len(owners)])) - 1
    qs, i0 = owners[firsts], indices[firsts]
    i1 = np.minimum(indices[lasts] + 1, cols.limit[qs])
    go = (i0 == cols.taken[qs]) & (i1 > i0)  # else stopped earlier: the per-queue read's
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
                                        source=source, out=cols.out, threads=threads, release_bytes=stretch)
    k = table[:, 7]
    short = k < counts
    cols.limit[qs[short]] = i0[short] + k[short]  # the per-queue read decides the next
    some = k > 0
    qs, i0, k, rows, kept, crcs = qs[some], i0[some], k[some], rows[some], table[some, 10], table[some, 9]
    if not len(qs):
        return 0, 0, helpers_cpu
    cols.filled[qs] = at[some] + kept
    cols.crc[qs] = crcs
    cols.taken[qs] += k
    return int(k.sum()), int(kept.sum()), helpers_cpu


def _room(cols: _Columns, qs: np.ndarray, need: np.ndarray) -> None:
    """The buffers of queues ``qs`` grown to ``need`` bytes where they are
    shorter (the room was reserved for every entry the pass reads: never,
    unless that changed)."""
    short = need > cols.room[qs]
    for qi, end in zip(qs[short].tolist(), need[short].tolist()):
        cols.buffers[qi] = cols.queues[qi].builder.buffer(end)
        cols.room[qi] = len(cols.buffers[qi])


def _finish(local: LocalStore, q: _Queue) -> int:
    """The per-queue read from where the pass left the queue, with the rest of
    its budget; 1 when it ran."""
    q.limit = q.taken
    job = q.job
    if q.redo:
        q.builder = job.builder()
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


def build_segment(local: LocalStore, job: BuildJob, now_ms: int) -> tuple[BuiltSegment | None, Exception | None]:
    """The job's segment from the per-queue read alone: the pass's fallback
    (``_finish``) from the job's start, for a queue the pass was not given.
    Returns the segment (None: no record) and the corrupt record or locally
    expired offset that ended it early."""
    q = _Queue(job, job.builder(), np.zeros(0, CQ_DTYPE), 0)
    _finish(local, q)
    return (q.builder.build(now_ms) if q.builder.count else None), q.stop
