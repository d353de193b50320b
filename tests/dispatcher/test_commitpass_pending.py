"""The pass's reading of a queue's pending ConsumeQueue entries
(dispatcher.commitpass._pending and _plain): read forward in steps, it
must take exactly what reading up to the written end found by bisection
(queuecursor._written_end) and checking every entry took."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tiered.dispatcher import commitpass
from tiered.format.batch import CQ_DTYPE
from tiered.format.codec import CQ_ENTRY_SIZE, CQ_FILLER_SIZE
from tiered.store.queuecursor import _written_end


def _by_bisection(view: memoryview, first: int, last: int, phys_limit: int,
                  budget: int) -> tuple[list[tuple[int, int, int]], bool, int | None]:
    """Entries taken, full, and the written end when every entry read is taken: as the pass read them before."""
    hi = _written_end(view, first, last)
    entries = np.frombuffer(view, CQ_DTYPE, count=hi - first, offset=first * 20)
    k, full = commitpass._plain(entries, phys_limit, budget)
    return entries[:k].tolist(), full, hi if k == len(entries) else None


def _reference_plain(entries: np.ndarray, phys_limit: int, budget: int) -> tuple[int, bool]:
    # the checks written out entry by entry
    total, prev_end = 0, None
    for i, (phys, size, _tags) in enumerate(entries.tolist()):
        total += size
        can_be = size > 0 and size != CQ_FILLER_SIZE and phys >= 0 and phys + size <= phys_limit
        ok = can_be and total <= budget and (prev_end is None or phys >= prev_end)
        if not ok:
            return i, i > 0 and can_be and total > budget
        prev_end = phys + size
    return len(entries), False


def _reader(view: memoryview):  # noqa: ANN202
    """``_pending``'s read over a ConsumeQueue file's bytes."""
    def read(at: int, n: int) -> np.ndarray:
        return np.frombuffer(view, CQ_DTYPE, count=n, offset=at * CQ_ENTRY_SIZE)
    return read


_SIZES = st.one_of(st.integers(1, 3000), st.sampled_from([-5, CQ_FILLER_SIZE, 1 << 20]))


@settings(max_examples=300, deadline=None)
@given(st.lists(_SIZES, max_size=300), st.integers(0, 200), st.integers(0, 250), st.integers(0, 3),
       st.sampled_from([1 << 62, 50_000, 200_000]), st.sampled_from([1000, 100_000, 4 << 20, 1 << 40]),
       st.sampled_from([1, 3, 1024]))
def test_reading_forward_takes_what_bisection_took(sizes, written_gap, first, back_steps, phys_limit, budget, scan):
    # written entries (phys growing, with a step back now and then), then zeros
    rows, phys = [], 0
    for i, size in enumerate(sizes):
        if back_steps and i % 37 == 20:
            phys -= 10
        rows.append((phys, size, i))
        phys += abs(size) if size != CQ_FILLER_SIZE else 100
    capacity = len(rows) + written_gap + 1
    table = np.zeros(capacity, CQ_DTYPE)
    table[:len(rows)] = rows
    view = memoryview(table.tobytes())
    first = min(first, capacity - 1)
    # steps of one entry and more: every step boundary
    got, hi = commitpass._pending(_reader(view), first, capacity, phys_limit, budget, scan)
    k, full = commitpass._plain(got, phys_limit, budget)
    assert (got[:k].tolist(), full, hi if k == len(got) else None) == _by_bisection(view, first, capacity,
                                                                                   phys_limit, budget)
    assert (k, full) == _reference_plain(got, phys_limit, budget)
    assert hi is None or hi == max(first, len(rows))  # the first entry of size 0


def test_a_file_written_to_its_end_is_read_to_its_end():
    table = np.zeros(5000, CQ_DTYPE)
    table["phys"], table["size"] = np.arange(5000) * 10, 10
    got, hi = commitpass._pending(_reader(memoryview(table.tobytes())), 3, 5000, 1 << 62, 1 << 40, 1024)
    assert hi == 5000 and got.tolist() == table[3:].tolist()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.lists(_SIZES, max_size=40), st.integers(0, 3), st.sampled_from([1000, 5000, 1 << 40])),
                max_size=12),
       st.sampled_from([1 << 62, 20_000, 60_000]))
def test_plain_runs_answer_as_plain_queue_by_queue(queues, phys_limit):
    # queues interleaved in one physical space, some stepping back; empty ones among them
    parts, budgets, phys = [], [], 0
    for sizes, back, budget in queues:
        rows = []
        for i, size in enumerate(sizes):
            if back and i % 7 == back:
                phys -= 10
            rows.append((phys, size, i))
            phys += abs(size) if size != CQ_FILLER_SIZE else 100
        parts.append(np.array(rows, CQ_DTYPE) if rows else np.zeros(0, CQ_DTYPE))
        budgets.append(budget)
    # the runs in one table with a row of garbage before each, which must not be read
    junk = np.array([(0, CQ_FILLER_SIZE, 0)], CQ_DTYPE)
    table = np.concatenate([np.concatenate([junk, p]) for p in parts] or [junk])
    counts = np.array([len(p) for p in parts], np.int64)
    firsts = np.cumsum(counts + 1) - counts
    k, full, nbytes = commitpass._plain_runs(table, firsts, counts, phys_limit, np.array(budgets, np.int64))
    for i, (entries, budget) in enumerate(zip(parts, budgets)):
        want_k, want_full = _reference_plain(entries, phys_limit, budget)
        assert (int(k[i]), bool(full[i])) == (want_k, want_full), i
        assert int(nbytes[i]) == int(entries["size"][:want_k].astype(np.int64).sum()), i


def test_a_file_gone_mid_read_hands_the_queue_to_the_per_queue_read():
    # entries read in steps of 2, 8, 32 (no zero entry yet); the file is gone at the third
    # step: what was read is returned, with no written end (so the pass trusts no last entry)
    table = np.zeros(40, CQ_DTYPE)
    table[:] = [(i * 100, 100, i) for i in range(40)]
    calls = []

    def read(at: int, n: int):
        calls.append((at, n))
        return table[at:at + n] if len(calls) < 3 else None

    got, hi = commitpass._pending(read, 0, 40, 1 << 62, 1 << 40, 2)
    assert calls == [(0, 2), (2, 8), (10, 30)]
    assert hi is None and got.tobytes() == table[:10].tobytes()


# --- _gather: every queue's head read at once, against the per-queue read ------------------------------------


def _per_queue_gather(local, job, phys_limit: int, scan: int):  # noqa: ANN001, ANN202
    """What the pass took for one queue when it read each queue on its own
    (before ``_read_heads``): its plain entries, whether the next passes the
    budget, the bytes taken, the last entry to read again and whether the
    written data ends in its file."""
    files = local.queue_files(job.topic, job.queue_id)
    byte = job.start * CQ_ENTRY_SIZE
    start = files.locate(byte)
    nothing = (b"", False, 0, None, False)
    if start is None:
        return nothing
    rel = byte - start
    try:
        head, size = files.read(start, rel, scan * CQ_ENTRY_SIZE)
    except FileNotFoundError:
        return nothing
    end = files.entries_end(start, size)
    if rel + CQ_ENTRY_SIZE > end:
        return nothing
    first = np.frombuffer(head, CQ_DTYPE, count=min(len(head), end - rel) // CQ_ENTRY_SIZE)

    def read(at: int, n: int):  # noqa: ANN202
        if at == rel // CQ_ENTRY_SIZE and n <= len(first):
            return first[:n]
        try:
            more = files.read_bytes(start, at * CQ_ENTRY_SIZE, n * CQ_ENTRY_SIZE)
        except FileNotFoundError:
            return None
        return np.frombuffer(more, CQ_DTYPE, count=len(more) // CQ_ENTRY_SIZE)

    entries, hi = commitpass._pending(read, rel // CQ_ENTRY_SIZE, end // CQ_ENTRY_SIZE, phys_limit, job.segment_bytes,
                                      scan)
    k, full = commitpass._plain(entries, phys_limit, job.segment_bytes)
    nbytes = int(entries["size"][:k].astype(np.int64).sum())
    last = at_end = None
    if k and k == len(entries) and hi is not None:
        last = (start, (hi - 1) * CQ_ENTRY_SIZE, entries[k - 1:k].tobytes())
        at_end = hi * CQ_ENTRY_SIZE < end
    return entries[:k].tobytes(), full, nbytes, last, bool(at_end)


_ENTRY = st.one_of(st.integers(1, 300), st.integers(1, 300), st.integers(1, 3000),
                   st.sampled_from([0, -5, CQ_FILLER_SIZE, 1 << 20]))
# a queue: its ConsumeQueue files (index of the first one, each file's entries then
# how it ends), where its job starts (past its first file's start, or anywhere),
# whether its entries step back now and then, the round's look at it
_FILE = st.tuples(st.lists(_ENTRY, max_size=20), st.sampled_from(["zeros", "end", "cut", "short", "long"]))
_QUEUE = st.tuples(st.integers(0, 2), st.lists(_FILE, max_size=3),
                   st.one_of(st.integers(0, 20), st.integers(-2, 80).map(lambda s: -1000 - s)), st.booleans(),
                   st.sampled_from(["", "", "", "gone", "hint", "stale"]))


@settings(max_examples=200, deadline=None)
@given(st.lists(_QUEUE, min_size=1, max_size=12), st.sampled_from([1 << 62, 60_000, 150_000]),
       st.sampled_from([1000, 20_000, 1 << 40]), st.sampled_from([(1024, 64), (2, 1), (7, 3), (16, 64)]),
       st.booleans())
def test_every_queue_at_once_takes_what_each_queue_read_alone_took(tmp_path_factory, queues, phys_limit, budget,
                                                                   scan_slack, compiled):
    """ConsumeQueue files of any shape (written up to the end or not, cut
    inside an entry, shorter than their slot, fillers and impossible sizes,
    physical offsets stepping back), jobs starting anywhere (before the first
    file, in a middle one, past the end), a queue whose directory is gone,
    a file longer than its slot (entries past the next file's start), the
    round's look at a queue fresh, stale or absent, compiled reads or
    not: ``_gather`` gives each queue exactly what reading it alone gave."""
    import shutil

    from tiered.dispatcher.commitpass import BuildJob
    from tiered.store import preads
    from tiered.store.localstore import LocalStore

    root = tmp_path_factory.mktemp("cq")
    per_file = 16  # entries a ConsumeQueue file holds
    jobs, phys = [], 0
    for qi, (first_file, files, start, back, look) in enumerate(queues):
        d = root / "consumequeue" / f"T{qi % 3}" / str(qi)
        d.mkdir(parents=True)
        start = first_file * per_file + start if start >= 0 else -1000 - start  # in its files, or anywhere
        for fi, (sizes, ending) in enumerate(files):
            rows = []
            for size in sizes[:per_file]:
                if back and len(rows) % 9 == 5:
                    phys -= 30  # a step back: not plain
                rows.append((phys, size, qi))
                phys += abs(size) if size != CQ_FILLER_SIZE else 100
            table = np.zeros(per_file, CQ_DTYPE)
            table[:len(rows)] = rows
            data = table.tobytes()
            if ending == "end":
                data = data[:len(rows) * CQ_ENTRY_SIZE]
            elif ending == "cut":
                data = data[:max(0, len(rows) * CQ_ENTRY_SIZE - 7)]
            elif ending == "short":
                data = data[:(len(rows) + 2) * CQ_ENTRY_SIZE]
            elif ending == "long":  # past the next file's start (a crashed writer's): those entries do not count
                data = np.array(rows + [(phys + i * 10, 10, qi) for i in range(per_file + 3 - len(rows))],
                                CQ_DTYPE).tobytes()
            (d / f"{(first_file + fi) * per_file * CQ_ENTRY_SIZE:020d}").write_bytes(data)
        jobs.append(BuildJob(prefix=f"p/{qi}", topic=f"T{qi % 3}", queue_id=qi, start=max(0, start), cl_start=0,
                             segment_bytes=budget, key_index=True, layout=2))
    local = LocalStore(root)
    for qi, (_first, _files, _start, _back, look) in enumerate(queues):
        files = local.queue_files(f"T{qi % 3}", qi)  # the round's look: files listed, maybe counted
        if look == "hint":
            local.max_offset(f"T{qi % 3}", qi)
        elif look == "stale":
            files.written.update({s: (s // CQ_ENTRY_SIZE + 3) % 7 for s in files.starts})
        elif look == "gone":
            shutil.rmtree(root / "consumequeue" / f"T{qi % 3}" / str(qi))
    options = commitpass.PassOptions(scan=scan_slack[0], slack=scan_slack[1])
    saved = preads._native
    if not compiled:
        preads._native = None
    try:
        got, every, kept = commitpass._gather(local, jobs, phys_limit, options)
        if kept is not None:
            preads.close_kept(kept)
        want = [_per_queue_gather(local, job, phys_limit, options.scan) for job in jobs]
    finally:
        preads._native = saved
    assert every.tobytes() == b"".join(w[0] for w in want)
    for job, q, (entries, full, nbytes, last, at_end) in zip(jobs, got, want):
        assert q.job is job and q.taken == 0 and q.stop is None and not q.redo
        assert (q.entries.tobytes(), q.limit, q.full, q.last, q.at_end) == (
            entries, len(entries) // CQ_ENTRY_SIZE, full, last, at_end), job
        if nbytes:  # room for what the pass copies, allocated once
            assert len(q.builder.buffer(q.builder.nbytes)) >= nbytes
