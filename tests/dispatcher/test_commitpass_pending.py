"""The pass's reading of a queue's pending ConsumeQueue entries
(dispatcher.commitpass._pending and _plain): read forward in steps, it
must take exactly what reading up to the written end found by bisection
(queuecursor._written_end) and checking every entry took."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher import commitpass
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
    saved, commitpass._SCAN = commitpass._SCAN, scan  # steps of one entry and more: every step boundary
    try:
        got, hi = commitpass._pending(_reader(view), first, capacity, phys_limit, budget)
    finally:
        commitpass._SCAN = saved
    k, full = commitpass._plain(got, phys_limit, budget)
    assert (got[:k].tolist(), full, hi if k == len(got) else None) == _by_bisection(view, first, capacity,
                                                                                   phys_limit, budget)
    assert (k, full) == _reference_plain(got, phys_limit, budget)
    assert hi is None or hi == max(first, len(rows))  # the first entry of size 0


def test_a_file_written_to_its_end_is_read_to_its_end():
    table = np.zeros(5000, CQ_DTYPE)
    table["phys"], table["size"] = np.arange(5000) * 10, 10
    got, hi = commitpass._pending(_reader(memoryview(table.tobytes())), 3, 5000, 1 << 62, 1 << 40)
    assert hi == 5000 and got.tolist() == table[3:].tolist()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.lists(_SIZES, max_size=40), st.integers(0, 3), st.sampled_from([1000, 5000, 1 << 40])),
                max_size=12),
       st.sampled_from([1 << 62, 20_000, 60_000]))
def test_plain_many_answers_as_plain_queue_by_queue(queues, phys_limit):
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
    k, full, nbytes = commitpass._plain_many(parts, phys_limit, np.array(budgets, np.int64))
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

    saved, commitpass._SCAN = commitpass._SCAN, 2
    try:
        got, hi = commitpass._pending(read, 0, 40, 1 << 62, 1 << 40)
    finally:
        commitpass._SCAN = saved
    assert calls == [(0, 2), (2, 8), (10, 30)]
    assert hi is None and got.tobytes() == table[:10].tobytes()
