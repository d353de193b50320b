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
   changed, the queue is read again by the per-queue read.
2. ``_walk``: every queue's entries merged by physical offset (one argsort),
   cut into windows of one CommitLog file, each window's pages mapped in one
   call and given back behind it. In a window each queue's entries are
   checked by ``batch.check_runs`` (one call for all of them), exactly as
   the per-queue read's ``check_run`` checks them, and added to the
   queue's ``SegmentBuilder`` (one copy, while the
   pages are mapped: copying later, at the upload, would map every page
   again for every queue whose records it holds; measured 0.19 s more for
   64 MiB over 16 queues).
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

import time
from dataclasses import dataclass

import numpy as np

from dispatcher.buildpool import BuildJob
from dispatcher.segment import SegmentBuilder
from tiered.errors import CorruptRecordError, ExpiredLocallyError
from tiered.format.batch import CQ_DTYPE, RecordBatch, check_runs
from tiered.format.keyindex import BadProperties, record_key_hashes
from tiered.format.codec import CQ_ENTRY_SIZE, CQ_FILLER_SIZE
from tiered.store.localstore import LocalStore
from tiered.store.queuecursor import NO_LIMIT

# A window of one CommitLog file: mapped in one call, given back behind the
# pass. Each queue with records in a window costs a check and an add (~100 us
# of numpy calls, whatever its record count), so a pass over many queues
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
    # the pass's own CPU (it runs in one thread): its wall time also counts
    # waiting for the GIL while upload threads run Python
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
    queues = [_gather(local, job, phys_limit) for job in jobs]
    records, nbytes, windows = _walk(local, queues)
    out: dict[tuple[str, int], Planned] = {}
    continued = 0
    for q in queues:
        _recheck_last(local, q)
        if _finish(local, q):
            continued += 1
            local.release_queue(q.job.topic, q.job.queue_id)  # what the per-queue read mapped
        out[(q.job.topic, q.job.queue_id)] = (q.job, q.builder, q.stop)
    stats = PassStats(queues=len(jobs), records=records, nbytes=nbytes, windows=windows, continued=continued,
                      seconds=time.perf_counter() - started, cpu_seconds=time.thread_time() - cpu)
    return out, stats


def _gather(local: LocalStore, job: BuildJob, phys_limit: int) -> _Queue:
    builder = SegmentBuilder(job.prefix, job.start, job.cl_start, key_index=job.key_index, layout=job.layout,
                             compression=job.compression)
    none = np.zeros(0, CQ_DTYPE)
    files = local._queue(job.topic, job.queue_id)
    byte = job.start * CQ_ENTRY_SIZE
    start = files.locate(byte)
    if start is None:
        return _Queue(job, builder, none, 0)  # the per-queue read says why (expired, nothing yet)
    try:
        view = files.view(start, byte - start + CQ_ENTRY_SIZE)
    except FileNotFoundError:
        return _Queue(job, builder, none, 0)
    rel = byte - start
    end = min(len(view), files.entries_per_file(start, view) * CQ_ENTRY_SIZE)
    if rel + CQ_ENTRY_SIZE > end:
        return _Queue(job, builder, none, 0)
    try:
        entries, hi = _pending(view, rel // CQ_ENTRY_SIZE, end // CQ_ENTRY_SIZE, phys_limit, job.segment_bytes)
    finally:
        files.release(start, rel, end)  # copied: 20 bytes a record, and the ConsumeQueue pages read are given back
    k, full = _plain(entries, phys_limit, job.segment_bytes)
    q = _Queue(job, builder, entries[:k], k, full=full)
    builder.reserve(int(entries["size"][:k].sum(dtype=np.int64)), k)  # what the pass will copy, allocated once
    if k and k == len(entries) and hi is not None:
        # the last written entry may be the one the broker is writing: it is
        # read again after its record, as QueueCursor._one_entry does
        q.last = (start, (hi - 1) * CQ_ENTRY_SIZE, bytes(view[(hi - 1) * CQ_ENTRY_SIZE:hi * CQ_ENTRY_SIZE]))
        q.at_end = hi * CQ_ENTRY_SIZE < end
    return q


# ConsumeQueue entries read at first by ``_pending``, then four times more each step
_SCAN = 1024


def _pending(view: memoryview, first: int, last: int, phys_limit: int, budget: int) -> tuple[np.ndarray, int | None]:
    """The entries from ``first`` (copied) up to the written end (the first
    entry of size 0, or ``last``; entries are written in order), and that
    end; or, when an entry the pass cannot take (``_plain``) comes first,
    the entries up to and past it, and None. Read forward in growing steps:
    what a segment takes and a step more, where finding the written end by
    bisection over the whole file faulted in a page for each probe (a
    fifth of the pass's CPU at 1,000 queues)."""
    parts: list[np.ndarray] = []
    at, step = first, _SCAN
    while True:
        n = min(step, last - at)
        chunk = np.frombuffer(view, CQ_DTYPE, count=n, offset=at * CQ_ENTRY_SIZE)
        zero = np.flatnonzero(chunk["size"] == 0)
        if len(zero):
            n = int(zero[0])
        parts.append(chunk[:n].copy())
        at += n
        entries = parts[0] if len(parts) == 1 else _joined(parts)
        if len(zero) or at >= last:
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


def _recheck_last(local: LocalStore, q: _Queue) -> None:
    """The queue's last entry read again now that its record was read: when
    it changed, it was being written, and what the pass took from it is
    not to be trusted; the per-queue read does the queue again."""
    if q.last is None or q.taken != len(q.entries):
        return
    start, at, seen = q.last
    files = local._queue(q.job.topic, q.job.queue_id)
    try:
        view = files.view(start, at + CQ_ENTRY_SIZE)
        now = bytes(view[at:at + CQ_ENTRY_SIZE])
        files.release(start, at, at + CQ_ENTRY_SIZE)
    except FileNotFoundError:
        now = b""
    q.redo = now != seen


def _walk(local: LocalStore, queues: list[_Queue]) -> tuple[int, int, int]:
    """Every queue's plain entries read in physical order, window by window.
    Returns (records, bytes, windows) read."""
    counts = [q.limit for q in queues]
    if not sum(counts):
        return 0, 0, 0
    every = _joined([q.entries for q in queues])
    phys, size = every["phys"].astype(np.int64), every["size"].astype(np.int64)
    owner = np.repeat(np.arange(len(queues)), counts)
    index = np.concatenate([np.arange(n) for n in counts])  # in its queue's entries
    order = np.argsort(phys, kind="stable")
    phys, size, owner, index = phys[order], size[order], owner[order], index[order]
    commitlog = local.commitlog
    starts = np.asarray(commitlog.starts, np.int64)
    file_at = np.searchsorted(starts, phys, side="right") - 1
    # windows: one CommitLog file each, cut every window_bytes of it
    width = window_bytes(sum(1 for n in counts if n))
    key = file_at * (1 << 40) + np.where(file_at >= 0, phys - starts[np.maximum(file_at, 0)], 0) // width
    cuts = np.flatnonzero(key[1:] != key[:-1]) + 1
    records = nbytes = windows = 0
    for lo, hi in zip(np.concatenate(([0], cuts)).tolist(), np.concatenate((cuts, [len(phys)])).tolist()):
        f = int(file_at[lo])
        w_phys, w_size, w_owner, w_index = phys[lo:hi], size[lo:hi], owner[lo:hi], index[lo:hi]
        if f < 0:
            _stop_at(queues, w_owner, w_index)  # before the first file: the per-queue read reports it
            continue
        base = int(starts[f])
        try:
            view = commitlog.view(base, int((w_phys + w_size).max()) - base)
        except FileNotFoundError:
            _stop_at(queues, w_owner, w_index)  # deleted meanwhile: the per-queue read reports the gap
            continue
        inside = w_phys + w_size - base <= len(view)
        if not inside.all():  # the file ends before them: a tail, which the per-queue read decides
            _stop_at(queues, w_owner[~inside], w_index[~inside])
        r_lo, r_hi = int(w_phys[0]) - base, int((w_phys + w_size).max()) - base
        if int(w_size.sum()) * _DENSE >= r_hi - r_lo:
            commitlog.populate(base, r_lo, r_hi)
        source = str(commitlog.path(base))
        try:
            n, b = _window(queues, view, base, source, w_owner, w_index)
        finally:
            commitlog.release(base, r_lo, r_hi)  # the builders copied what they keep
        records += n
        nbytes += b
        windows += 1
    return records, nbytes, windows


_RAW = np.dtype(f"V{CQ_DTYPE.itemsize}")


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    """CQ_DTYPE arrays one after the other, joined as raw bytes: numpy joins
    structured arrays field by field, promoting each array's dtype (~3 us an
    array, a thousand arrays a window at 1,000 queues)."""
    # (as CQ_DTYPE first: numpy's own joins hand back the native byte order, the same values)
    return np.concatenate([np.asarray(p, CQ_DTYPE).view(_RAW) for p in parts]).view(CQ_DTYPE)


def _stop_at(queues: list[_Queue], owners: np.ndarray, indices: np.ndarray) -> None:
    for qi, i in zip(owners.tolist(), indices.tolist()):
        queues[qi].limit = min(queues[qi].limit, i)


def _window(queues: list[_Queue], view: memoryview, base: int, source: str, owners: np.ndarray,
            indices: np.ndarray) -> tuple[int, int]:
    """Each queue's entries of one window, checked as ``check_run`` checks
    them, every queue's run in one call (a queue's entries in a window are
    consecutive), their keys found at once for the whole window, then added.
    Returns (records, bytes)."""
    by_queue = np.argsort(owners, kind="stable")
    owners, indices = owners[by_queue], indices[by_queue]
    cuts = np.flatnonzero(owners[1:] != owners[:-1]) + 1
    firsts, lasts = np.concatenate(([0], cuts)), np.concatenate((cuts, [len(owners)])) - 1
    runs: list[tuple[_Queue, int, int]] = []
    for qi, first, last in zip(owners[firsts].tolist(), indices[firsts].tolist(), indices[lasts].tolist()):
        q = queues[qi]
        i0, i1 = first, min(last + 1, q.limit)
        if q.stop is not None or i0 != q.taken or i1 <= i0:
            continue  # stopped earlier in the pass: the rest is the per-queue read's
        runs.append((q, i0, i1))
    if not runs:
        return 0, 0
    # every queue's run checked in one call (a call a queue cost more than its records at 1,000 queues)
    batches = check_runs(view, base, _joined([q.entries[i0:i1] for q, i0, i1 in runs]),
                         [(i1 - i0, q.job.topic.encode("utf-8"), q.job.queue_id, q.job.start + i0) for q, i0, i1 in runs],
                         source=source)
    checked: list[tuple[_Queue, RecordBatch, int, int]] = []
    for (q, i0, i1), batch in zip(runs, batches):
        if batch is None or batch.count < i1 - i0:
            q.limit = i0 + (batch.count if batch is not None else 0)  # the per-queue read decides the next
        if batch is not None:
            checked.append((q, batch, i0, i1))
    keys = _window_keys(view, [b for q, b, _i0, _i1 in checked if q.job.key_index])
    # keys found (or none indexed): those queues' records copied in one call
    ready = [(q, b, i0) for q, b, i0, _i1 in checked if not q.job.key_index or id(b) in keys]
    SegmentBuilder.add_many([(q.builder, b, keys.get(id(b))) for q, b, _i0 in ready])
    records = nbytes = 0
    for q, batch, i0 in ready:
        records += batch.count
        nbytes += int(batch.sizes.sum())
        q.taken = i0 + batch.count
    # properties that were not UTF-8 in the window: each builder finds its own keys
    for q, batch, i0, _i1 in checked:
        if not q.job.key_index or id(batch) in keys:
            continue
        before = q.builder.count
        try:
            q.builder.add(batch)
        except CorruptRecordError as exc:
            q.stop = exc  # properties that are not UTF-8: the records before it are kept
        got = q.builder.count - before
        records += got
        nbytes += int(batch.sizes[:got].sum())
        q.taken = i0 + got
    return records, nbytes


def _window_keys(view: memoryview, batches: list[RecordBatch]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """The keys of every record of ``batches`` (all read from ``view``), found
    in one go: id(batch) -> (record index in the batch, key hash), as
    ``SegmentBuilder.add`` would find them batch by batch. Empty when a
    record's properties are not UTF-8: each builder then finds its own keys
    and stops its queue at that record."""
    if not batches:
        return {}
    counts = np.fromiter((b.count for b in batches), np.int64, len(batches))
    props_at = np.concatenate([b.props_at for b in batches])
    # array operations once per window, not once per batch (1,000 queues: 1,000 batches a window)
    ends = np.concatenate([b.positions for b in batches]) + np.concatenate([b.sizes for b in batches])
    try:
        owners, hashes = record_key_hashes(view, props_at, ends)
    except BadProperties:
        return {}
    order = np.argsort(owners, kind="stable")
    owners, hashes = owners[order], hashes[order]
    bounds = np.concatenate(([0], np.cumsum(counts)))
    cut = np.searchsorted(owners, bounds).tolist()
    local = owners - np.repeat(bounds[:-1], counts)[owners]  # record index in its own batch
    return {id(b): (local[cut[i]:cut[i + 1]], hashes[cut[i]:cut[i + 1]]) for i, b in enumerate(batches)}


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
