"""One CommitLog pass for every due queue (dispatcher.commitpass).

The pass must build exactly the segments each queue's own read builds
(same records, boundaries and bytes), read the CommitLog once in physical
order instead of once per queue, and leave bad data to the per-queue read:
a corrupt record stops its queue with the typed error, the others go on."""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from zlib_ng.zlib_ng import crc32

import tiered.dispatcher.commitpass as commitpass
from dispatchkit import BROKER, CLUSTER, assert_exact, new_dispatcher, new_writer, produce, read_manifest
from tiered.archive import segmeta
from tiered.archive.storage import open_store
from tiered.store.localstore import LocalStore

A0, A1, B0 = ("Inter", 0), ("Inter", 1), ("Other", 0)
BAD = ("Broken", 0)
LATE = ("Late", 0)  # created half way through the store, starting above offset 0
HALF = "TxHalf"  # transaction half messages: in the CommitLog, in no ConsumeQueue
QUEUES = [A0, A1, B0, BAD, LATE]
BAD_OFFSET = 23
LATE_START = 300


def _make_store(sd: Path, clock) -> None:  # noqa: ANN001
    with new_writer(sd, commitlog_file_size=16 * 1024) as w:
        w.fill_queue_head(*LATE, LATE_START)
        for i in range(60):
            for q in (A0, A1, B0, BAD):
                produce(w, *q, 1, clock=clock, body_size=150, seed=i)
            if i % 3 == 0:  # prepared (0x4) then rolled back (0xC): never dispatched to a queue
                w.put(HALF, 0, b"half" * 40, sys_flag=0x4)
                w.put(HALF, 0, b"rollback", sys_flag=0xC)
            if i >= 30:
                produce(w, *LATE, 1, clock=clock, body_size=150, seed=i)
    # the broker's reput never writes their ConsumeQueue entries
    shutil.rmtree(sd / "consumequeue" / HALF)


def _flip_body_byte(sd: Path, topic: str, qid: int, offset: int) -> None:
    local = LocalStore(sd)
    phys = next(iter(local.iter_queue(topic, qid, offset, max_count=1))).record.physical_offset
    local.close()
    start = max(int(f.name) for f in (sd / "commitlog").iterdir() if int(f.name) <= phys)
    with open(sd / "commitlog" / f"{start:020d}", "r+b") as fh:
        fh.seek(phys - start + 100)  # in the body: the CRC no longer matches
        b = fh.read(1)
        fh.seek(phys - start + 100)
        fh.write(bytes([b[0] ^ 0x5A]))


def _spoil_properties(sd: Path, topic: str, qid: int, offset: int) -> None:
    """A byte of the record's KEYS that is not UTF-8 (the body CRC does not
    cover properties: the record is whole, its properties are corrupt)."""
    local = LocalStore(sd)
    rec = next(iter(local.iter_queue(topic, qid, offset, max_count=1))).record
    at = rec.physical_offset + bytes(rec.raw).index(b"KEYS\x01") + 6
    local.close()
    start = max(int(f.name) for f in (sd / "commitlog").iterdir() if int(f.name) <= at)
    with open(sd / "commitlog" / f"{start:020d}", "r+b") as fh:
        fh.seek(at - start)
        fh.write(b"\xff")


def _segments(store, topic: str, qid: int) -> list[tuple]:  # noqa: ANN001
    """Every segment of a queue: its manifest entry (minus what names the
    bucket) and its stored parts, byte for byte."""
    m = read_manifest(store, topic, qid)
    out = []
    for seg in m.segments:
        parts = segmeta.read_parts(store, seg)
        out.append((replace(seg, created_ms=0), parts.commitlog, parts.entries, parts.index,
                    replace(parts.descriptor.segment, created_ms=0)))
    return out


@pytest.fixture(autouse=True, params=["one thread", "pieces"])
def _threads(request, monkeypatch):  # noqa: ANN001, ANN202
    """Every test twice: each window on one thread, and on three with its
    runs cut into pieces of a record or two (a window here is a few KiB,
    below what starts a thread on its own)."""
    if request.param == "pieces":
        real = commitpass.check_copy_runs
        monkeypatch.setattr(commitpass, "check_copy_runs",
                            lambda *a, **kw: real(*a, **{**kw, "threads": 3, "piece_bytes": 600}))


@pytest.fixture
def counted(monkeypatch):  # noqa: ANN001, ANN201
    """The records the pass validated, in the order it did: (file start, start, end)."""
    seen: list[tuple[int, int, int]] = []
    real = commitpass.check_copy_runs

    def check_copy_runs(view, base, entries, table, blob, dsts, **kw):  # noqa: ANN001, ANN003, ANN202
        out, cpu = real(view, base, entries, table, blob, dsts, **kw)
        file_start = int(Path(kw["source"]).name)
        for row, k in table[:, [0, 7]].tolist():
            seen.extend((file_start, p, p + n) for p, n in zip(out[0, row:row + k].tolist(),
                                                                out[1, row:row + k].tolist()))
        return out, cpu

    monkeypatch.setattr(commitpass, "check_copy_runs", check_copy_runs)
    return seen


def _as_per_queue(local: LocalStore, job, planned: dict, *context: object):  # noqa: ANN001, ANN202
    """The pass's segment (None: no record) and stop for ``job``, asserted to
    be exactly what the per-queue build (``build_segment``) makes of it."""
    from tiered.dispatcher.commitpass import build_segment

    want, want_stop = build_segment(local, job, 5)
    got_job, builder, stop = planned[(job.topic, job.queue_id)]
    got = builder.build(5) if builder.count else None
    assert got_job == job and (got is None) == (want is None), (job, *context)
    if got is not None:  # the CRC kept as the records came in: the final bytes'
        assert got.segment.commitlog_crc == crc32(bytes(got.commitlog)), (job, *context)
    if want is not None:
        assert got.segment == want.segment and bytes(got.commitlog) == bytes(want.commitlog), (job, *context)
        assert got.consumequeue == want.consumequeue and got.index == want.index, (job, *context)
    assert type(stop) is type(want_stop) and str(stop) == str(want_stop), (job, *context)
    return got, stop


def _watched(local: LocalStore, monkeypatch) -> dict[str, list[tuple[int, int, int]]]:  # noqa: ANN001
    """Pages mapped ahead (populate) and CommitLog files entered by a per-queue
    read (``commitlog_window``: once per file per queue read)."""
    calls: dict[str, list[tuple[int, int, int]]] = {"populate": [], "entered": []}
    populate, window = local.commitlog.populate, local.commitlog_window

    def watch_populate(start: int, lo: int, hi: int) -> None:
        calls["populate"].append((start, lo, hi))
        populate(start, lo, hi)

    def watch_window(phys: int, size: int):  # noqa: ANN202
        calls["entered"].append((phys, size, 0))
        return window(phys, size)

    monkeypatch.setattr(local.commitlog, "populate", watch_populate)
    monkeypatch.setattr(local, "commitlog_window", watch_window)
    return calls


@pytest.mark.parametrize(("segment_bytes", "pass_bytes"), [(1 << 20, 1 << 30), (2000, 1 << 30), (2000, 5000)])
def test_one_pass_builds_the_per_queue_segments(tmp_path, clock, recorder, monkeypatch, counted, caplog,
                                                 segment_bytes, pass_bytes):
    sd = tmp_path / "store"
    _make_store(sd, clock)
    _flip_body_byte(sd, *BAD, BAD_OFFSET)
    clock.advance(1)
    stores, locals_, watched, segments = {}, {}, {}, 0
    caplog.set_level(logging.ERROR, logger="tiered.dispatcher")
    for single in (True, False):
        store = stores[single] = open_store(f"file://{tmp_path / f'cold-{single}'}")
        local = locals_[single] = LocalStore(sd)
        watched[single] = _watched(local, monkeypatch)
        d = new_dispatcher(store, local, tmp_path / f"state-{single}", clock, recorder=recorder if single else None,
                           upload_bytes=1, max_delay_ms=0, segment_bytes=segment_bytes, layout=2,
                           parallelism=2, pass_bytes=pass_bytes)
        if not single:  # nothing built ahead: every segment from the pass's per-queue fallback
            monkeypatch.setattr(d.archiver, "prebuild", lambda jobs: None)
        result = d.run_round()
        watched[single] = {k: list(v) for k, v in watched[single].items()}  # not what the checks below read
        # only the corrupt queue stops, at the corrupt record, with its typed error
        assert list(result.errors) == [f"{BAD[0]}/{BAD[1]}"], result.errors
        assert "CRC" in result.errors[f"{BAD[0]}/{BAD[1]}"]
        assert read_manifest(store, *BAD).next_offset == BAD_OFFSET
        assert_exact(store, local, [A0, A1, B0, LATE])
        assert_exact(store, local, [BAD], complete=False)
        assert read_manifest(store, *LATE).first_offset == LATE_START
        if single:
            segments = result.segments
            # one pass for the first segment of every queue when they fit pass_bytes;
            # else one per wave of queues that do; one more per later segment
            if segment_bytes == 1 << 20:
                assert len(d.archiver.passes) == 1, d.archiver.passes
            else:
                assert len(d.archiver.passes) > (1 if pass_bytes == 1 << 30 else 4), d.archiver.passes
                # two waves at once (one uploading): each holds half of pass_bytes
                assert d.archiver.passes[0].queues == (len(QUEUES) if pass_bytes == 1 << 30 else 2)
            stats = d.archiver.passes[0]
            assert stats.records > 0 and stats.cpu_seconds > 0
    assert recorder.corrupt[BAD] == 1
    assert any("stopped at offset 23" in r.getMessage() for r in caplog.records)
    # byte for byte the segments the per-queue reads build
    for q in QUEUES:
        assert _segments(stores[True], *q) == _segments(stores[False], *q), q
    # Read once: no byte of the CommitLog is validated twice
    spans = sorted((f + lo, f + hi) for f, lo, hi in counted)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), "a CommitLog record was read twice"
    if segment_bytes == 1 << 20:
        # one pass, window after window in physical order, as the broker wrote them
        windows = [(f, lo // commitpass.PassOptions().window_bytes(len(QUEUES))) for f, lo, _hi in counted]
        assert windows == sorted(windows)
        # the pass read every record but the tails the per-queue read completes
        # (each queue's last entry, the corrupt record and what follows)
        assert stats.records >= 4 * 60 + 30 - len(QUEUES) - (60 - BAD_OFFSET)
        # each page mapped ahead once, in order (all queues together fill the windows)
        mapped = [(f + lo, f + hi) for f, lo, hi in watched[True]["populate"]]
        assert mapped and all(a[1] <= b[0] for a, b in zip(mapped, mapped[1:])), str(mapped)
        # per-queue reads enter every CommitLog file once per queue; with the pass
        # only the tail reads do (at most one per queue step)
        files = len(list((sd / "commitlog").iterdir()))
        assert files >= 3
        assert len(watched[True]["entered"]) <= segments + 1
        assert len(watched[False]["entered"]) >= 4 * (files - 1)


@pytest.mark.parametrize("stretches", [False, True], ids=["windows", "stretches"])
def test_pass_and_per_queue_build_agree_on_every_start(tmp_path, clock, monkeypatch, stretches):
    """The pass's segment from any offset (mid-store, mid-file, at the
    corrupt record, at properties that are not UTF-8) equals
    ``build_segment``'s, record and stop alike; also with every pass taken
    as sparse, in 16 KiB windows copied in 4 KiB stretches whose pages are
    given back behind them."""
    from tiered.dispatcher.commitpass import BuildJob, PassOptions

    options = PassOptions()
    if stretches:
        options = PassOptions(window=4096, max_window=16384)
        monkeypatch.setattr(commitpass, "_in_stretches", lambda phys, size: True)

    sd = tmp_path / "store"
    _make_store(sd, clock)
    _flip_body_byte(sd, *BAD, BAD_OFFSET)
    _spoil_properties(sd, *B0, BAD_OFFSET)
    local = LocalStore(sd)
    stops = set()
    for start in (0, 7, BAD_OFFSET - 3, BAD_OFFSET, 59):
        for budget in (1500, 1 << 20):
            jobs = [BuildJob(prefix=f"p/{t}/{q}", topic=t, queue_id=q, start=start + (LATE_START if (t, q) == LATE
                                                                                          else 0),
                             cl_start=100, segment_bytes=budget, key_index=True, layout=2) for t, q in QUEUES]
            planned, _stats = commitpass.build_pass(local, jobs, options)
            for job in jobs:
                _got, got_stop = _as_per_queue(local, job, planned, start, budget)
                stops.add(str(got_stop))
    assert [(t, q) for t, q in local.queues()] == sorted(QUEUES)  # the half messages are in no queue
    assert any("CRC" in x for x in stops) and any("UTF-8" in x for x in stops), stops



def test_a_last_entry_written_during_the_pass_is_read_again(tmp_path, clock, monkeypatch):
    """The broker may be writing a queue's last ConsumeQueue entry while the
    pass reads it (its tags code last): the entry is read again after its
    record; when it changed, the queue is read again by the per-queue read,
    which sees the completed entry."""
    from tiered.dispatcher.commitpass import BuildJob, build_segment
    from tiered.format.codec import CQ_ENTRY, CQ_ENTRY_SIZE

    sd = tmp_path / "store"
    _make_store(sd, clock)
    local = LocalStore(sd)
    last = local.max_offset(*A1) - 1
    cq = sd / "consumequeue" / A1[0] / str(A1[1]) / f"{0:020d}"
    phys, size, tags = CQ_ENTRY.unpack_from(cq.read_bytes(), last * CQ_ENTRY_SIZE)
    real_walk = commitpass._walk

    def walk_then_complete(local_, queues, *more):  # noqa: ANN001, ANN002, ANN202
        out = real_walk(local_, queues, *more)
        with open(cq, "r+b") as fh:  # the broker completes the entry: its tags code lands now
            fh.seek(last * CQ_ENTRY_SIZE)
            fh.write(CQ_ENTRY.pack(phys, size, tags ^ 0x5A5A))
        return out

    monkeypatch.setattr(commitpass, "_walk", walk_then_complete)
    jobs = [BuildJob(prefix=f"p/{t}/{q}", topic=t, queue_id=q, start=0, cl_start=0, segment_bytes=1 << 20,
                     key_index=True, layout=2) for t, q in (A0, A1)]
    planned, stats = commitpass.build_pass(local, jobs)
    assert stats.continued == 1  # A1 only, read again; A0 ended in the pass
    built = {}
    for job in jobs:
        want, want_stop = build_segment(LocalStore(sd), job, 5)
        _job, builder, stop = planned[(job.topic, job.queue_id)]
        got = built[(job.topic, job.queue_id)] = builder.build(5)
        assert stop is None and want_stop is None
        assert got.segment == want.segment and got.consumequeue == want.consumequeue
        assert bytes(got.commitlog) == bytes(want.commitlog)
        assert got.segment.commitlog_crc == crc32(bytes(got.commitlog))  # A1's: its builder's, begun again
    assert built[A1].segment.messages == last + 1
    assert CQ_ENTRY.unpack_from(built[A1].consumequeue, last * CQ_ENTRY_SIZE)[2] == tags ^ 0x5A5A


def test_window_widens_with_the_queues_of_a_pass():
    options = commitpass.PassOptions()
    assert options.window_bytes(1) == options.window_bytes(256) == 32 << 20
    assert options.window_bytes(257) == 64 << 20
    assert options.window_bytes(1000) == options.window_bytes(10_000) == 128 << 20
    small = commitpass.PassOptions(window=4096, max_window=10_000, queues_per_step=2)
    assert (small.window_bytes(2), small.window_bytes(3), small.window_bytes(9)) == (4096, 8192, 10_000)


def _threads_seen(monkeypatch) -> list[int]:  # noqa: ANN001
    """The threads each window of every pass from now on is handed to."""
    seen: list[int] = []
    real = commitpass.check_copy_runs

    def check_copy_runs(*a, **kw):  # noqa: ANN002, ANN003, ANN202
        seen.append(kw["threads"])
        return real(*a, **kw)

    monkeypatch.setattr(commitpass, "check_copy_runs", check_copy_runs)
    return seen


def test_windows_go_on_the_cores_available_at_most_max_threads(tmp_path, clock, monkeypatch):
    """The pass hands each window to as many threads as the cores this
    process may run on (its affinity, not the machine's), at most
    MAX_THREADS, or ``PassOptions.threads`` when set."""
    seen = _threads_seen(monkeypatch)
    queues, local, _biggest = _five_queues(tmp_path, clock)
    from tiered.dispatcher.commitpass import BuildJob

    jobs = [BuildJob(prefix=f"p/{t}/{q}", topic=t, queue_id=q, start=0, cl_start=0, segment_bytes=1 << 20,
                     key_index=True, layout=2) for t, q in queues]
    for cores, configured, want in ((set(range(40)), None, commitpass.MAX_THREADS), ({3}, None, 1),
                                    ({0, 5, 9}, None, 3), (set(range(40)), 12, 12), ({1}, 0, 1)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid, cores=cores: cores)
        seen.clear()
        planned, stats = commitpass.build_pass(local, jobs, commitpass.PassOptions(threads=configured))
        assert seen and set(seen) == {want} and stats.records == 100, (cores, configured)


def _five_queues(tmp_path: Path, clock) -> tuple[list[tuple[str, int]], LocalStore, int]:  # noqa: ANN001
    """Five queues of 20 small messages; the pending bytes of the biggest."""
    queues = [("Turn", q) for q in range(5)]
    with new_writer(tmp_path / "store") as w:
        for q in queues:
            produce(w, *q, 20, clock=clock, body_size=100, seed=7)
    local = LocalStore(tmp_path / "store")
    return queues, local, max(local.pending(t, q, 0)[1] for t, q in queues)


def test_a_wave_cut_by_the_budget_is_whole_turns_of_the_upload_pool(tmp_path, clock):
    """Five queues, about three fit a wave's budget, two upload at once: a
    wave cut by the budget is whole turns of the pool (2, or 4 when the
    estimates of the queues' next segments come out small), never 3 whose
    last upload would run alone while the next wave waits; the last wave
    takes what is left. The archive is exact all the same."""
    queues, local, biggest = _five_queues(tmp_path, clock)
    store = open_store(f"file://{tmp_path / 'cold'}")
    # each wave holds half of pass_bytes (the next one is built meanwhile):
    # a budget of 2.5 queues takes 3 before it is used up
    d = new_dispatcher(store, local, tmp_path / "state", clock, upload_bytes=1, max_delay_ms=0, layout=2,
                       segment_bytes=1 << 20, parallelism=2, pass_bytes=5 * biggest)
    r = d.run_round()
    assert r.ok and r.segments == 5, r.errors
    waves = [p.queues for p in d.archiver.passes]
    assert len(waves) >= 2 and sum(waves) == 5, waves  # the budget cut, and every queue in one wave
    assert all(n % 2 == 0 for n in waves[:-1]), waves
    assert_exact(store, local, queues)


def test_the_next_wave_uploads_as_soon_as_a_thread_is_free(tmp_path, clock):
    """Two threads, waves of two queues then three: while one upload of the first wave
    is held back, the other thread goes on with the second wave (waves no
    longer wait for each other's last upload); the archive is exact."""
    import threading

    from tiered.archive.storage import FileStore

    queues, local, biggest = _five_queues(tmp_path, clock)
    second_wave_started = threading.Event()
    waited: list[bool] = []

    class Held(FileStore):
        def put(self, key: str, data: bytes, *, crc: int | None = None) -> None:
            if "/Turn/2/segment/" in key or "/Turn/3/segment/" in key:
                second_wave_started.set()
            if "/Turn/0/segment/" in key:
                # lockstep waves never get there: the wait times out (False)
                waited.append(second_wave_started.wait(timeout=30))
            super().put(key, data, crc=crc)

    store = Held(str(tmp_path / "cold"))
    d = new_dispatcher(store, local, tmp_path / "state", clock, upload_bytes=1, max_delay_ms=0, layout=2,
                       segment_bytes=1 << 20, parallelism=2, pass_bytes=4 * biggest)
    r = d.run_round()
    assert r.ok and r.segments == 5, r.errors
    # the first wave is two queues; how the other three split depends on when
    # the held upload lets its thread go ([2, 3] or [2, 2, 1]), each once
    waves = [p.queues for p in d.archiver.passes]
    assert waves[0] == 2 and sum(waves) == 5, waves
    assert waited == [True]  # the second wave uploaded while the first still did
    assert_exact(store, local, queues)


MANY = [(f"Many{i % 7}", i // 7) for i in range(70)]


@pytest.mark.parametrize(("compiled", "scan"), [(True, 1024), (False, 1024), (True, 2)])
def test_a_corrupt_record_in_a_window_of_many_queues_stops_only_its_queue(tmp_path, clock, monkeypatch, compiled,
                                                                          scan):
    """70 queues interleaved in one window, checked by one ``check_copy_runs``
    call: the queue with a corrupt body stops at that record with the typed
    error naming the CommitLog file and the record's offset, the queue with
    properties that are not UTF-8 at its record, every other queue is built
    whole; all exactly as ``build_segment`` builds them, compiled or not."""
    from tiered.dispatcher.commitpass import BuildJob
    from tiered.errors import CorruptRecordError
    from tiered.format import batch as batch_module

    if not compiled:
        monkeypatch.setattr(batch_module, "_native", None)
    sd = tmp_path / "store"
    with new_writer(sd, commitlog_file_size=1 << 20) as w:
        for i in range(12):
            for q in MANY:
                produce(w, *q, 1, clock=clock, body_size=120, seed=i)
    bad, spoiled = MANY[33], MANY[50]
    local = LocalStore(sd)
    phys = next(iter(local.iter_queue(*bad, 5, max_count=1))).record.physical_offset
    _flip_body_byte(sd, *bad, 5)
    _spoil_properties(sd, *spoiled, 9)
    calls = []
    real = commitpass.check_copy_runs
    monkeypatch.setattr(commitpass, "check_copy_runs", lambda *a, **kw: calls.append(len(a[3])) or real(*a, **kw))
    jobs = [BuildJob(prefix=f"p/{t}/{q}", topic=t, queue_id=q, start=0, cl_start=0, segment_bytes=1 << 20,
                     key_index=True, layout=2) for t, q in MANY]
    # scan 2: the entries read in several steps, joined
    planned, stats = commitpass.build_pass(local, jobs, commitpass.PassOptions(scan=scan))
    assert calls == [70] and stats.windows == 1  # one call for every queue of the window
    for job in jobs:
        got, stop = _as_per_queue(local, job, planned)
        assert got is not None
        q = (job.topic, job.queue_id)
        if q == bad:
            assert isinstance(stop, CorruptRecordError) and "CRC" in stop.reason
            assert stop.source == str(sd / "commitlog" / f"{0:020d}") and stop.offset == phys
            assert got.segment.messages == 5
        elif q == spoiled:
            assert isinstance(stop, CorruptRecordError) and "UTF-8" in stop.reason
            assert got.segment.messages == 9
        else:
            assert stop is None and got.segment.messages == 12, q


@pytest.mark.parametrize(("compiled", "spoil_keyed"), [(True, True), (False, True), (True, False), (False, False)])
def test_queues_with_and_without_a_key_index_in_one_window(tmp_path, clock, monkeypatch, compiled, spoil_keyed):
    """Jobs with and without a key index in one window (the pass finds the
    keys of the keyed queues' records only): every segment is the one
    ``build_segment`` builds. Properties that are not UTF-8 stop a keyed
    queue at that record (the window's builders then find their own keys);
    an unkeyed queue never reads them and takes it (the window's keys are
    found at once)."""
    from tiered.dispatcher.commitpass import BuildJob
    from tiered.errors import CorruptRecordError
    from tiered.format import batch as batch_module

    if not compiled:
        monkeypatch.setattr(batch_module, "_native", None)
    sd = tmp_path / "store"
    with new_writer(sd, commitlog_file_size=1 << 20) as w:
        for i in range(10):
            for q in MANY[:20]:
                produce(w, *q, 1, clock=clock, body_size=100, seed=i)
    keyed_bad, unkeyed_bad = MANY[4], MANY[5]  # queue 4 keyed, queue 5 not
    if spoil_keyed:
        _spoil_properties(sd, *keyed_bad, 6)
    _spoil_properties(sd, *unkeyed_bad, 3)
    local = LocalStore(sd)
    jobs = [BuildJob(prefix=f"p/{t}/{q}", topic=t, queue_id=q, start=0, cl_start=0, segment_bytes=1 << 20,
                     key_index=i % 2 == 0, layout=2) for i, (t, q) in enumerate(MANY[:20])]
    planned, stats = commitpass.build_pass(local, jobs)
    assert stats.windows == 1
    for job in jobs:
        got, stop = _as_per_queue(local, job, planned)
        assert got is not None
        if spoil_keyed and (job.topic, job.queue_id) == keyed_bad:
            assert isinstance(stop, CorruptRecordError) and "UTF-8" in stop.reason and got.segment.messages == 6
        else:
            assert stop is None and got.segment.messages == 10
            assert (got.index is not None) == job.key_index


def _small_queues(sd: Path, clock, queues: list[tuple[str, int]], records: int, **kw) -> None:  # noqa: ANN001, ANN003
    with new_writer(sd, commitlog_file_size=1 << 20, cq_entries_per_file=64, **kw) as w:
        for i in range(records):
            for q in queues:
                produce(w, *q, 1, clock=clock, body_size=60, seed=i)


def _jobs(queues: list[tuple[str, int]], segment_bytes: int = 1 << 20) -> list:
    from tiered.dispatcher.commitpass import BuildJob

    return [BuildJob(prefix=f"p/{t}/{q}", topic=t, queue_id=q, start=0, cl_start=0, segment_bytes=segment_bytes,
                     key_index=True, layout=2) for t, q in queues]


@pytest.mark.parametrize("kept", [True, False])
@pytest.mark.parametrize(("damage", "mapped"), [("deleted", False), ("deleted", True), ("truncated", False),
                                               ("cut_inside_an_entry", False), ("queue_directory_gone", False),
                                               ("queue_directory_gone", True)])
def test_a_consumequeue_file_damaged_between_the_gather_and_the_walk(tmp_path, clock, monkeypatch, damage, mapped,
                                                                      kept):
    """The broker deletes or cuts a queue's ConsumeQueue file after the pass
    read its entries and before it read their records. Cut: the queue's last
    entry no longer reads as it did, so the per-queue read does the queue
    again and decides, exactly as ``build_segment`` decides through a store
    that looked at the files as the pass's did. Deleted: through the file
    the pass kept open it still reads as it was (its entry was not being
    written): the segment is the one read before the deletion; without the
    file kept (past the descriptors a pass may keep), the entry reads as
    gone and the per-queue read decides: expired (files listed only), or the
    records read through the mapping a round's look left (a deleted file
    stays readable through it). The other queues are built whole. (A file
    cut while mapped is not a case: reading past its new end faults, which
    is why the pass reads with pread.)"""
    from tiered.dispatcher.commitpass import build_segment
    from tiered.errors import ExpiredLocallyError
    from tiered.format.codec import CQ_ENTRY_SIZE

    if not kept:
        monkeypatch.setattr(commitpass, "_keep_limit", lambda: 0)
    queues = [("Dmg", q) for q in range(6)]
    sd = tmp_path / "store"
    _small_queues(sd, clock, queues, 20)
    victim = queues[3]
    cq_dir = sd / "consumequeue" / victim[0] / str(victim[1])
    cq = cq_dir / f"{0:020d}"
    jobs = _jobs(queues)
    before = build_segment(LocalStore(sd), jobs[3], 5)[0]
    local = LocalStore(sd)
    seen = LocalStore(sd)  # the per-queue read's, which looked at the files before the damage too
    for store in (local, seen):
        for q in queues:
            store.max_offset(*q) if mapped else store.queue_files(*q)
            store.release_queue(*q)
    real_walk = commitpass._walk

    def damage_then_walk(local_, queues_, *more):  # noqa: ANN001, ANN002, ANN202
        if damage == "deleted":
            cq.unlink()
        elif damage == "truncated":
            os.truncate(cq, 12 * CQ_ENTRY_SIZE)  # entries 12.. are gone
        elif damage == "cut_inside_an_entry":
            os.truncate(cq, 12 * CQ_ENTRY_SIZE + 7)
        else:
            shutil.rmtree(cq_dir)
        return real_walk(local_, queues_, *more)

    monkeypatch.setattr(commitpass, "_walk", damage_then_walk)
    real_gather, gathered = commitpass._gather, []

    def gather(*args):  # noqa: ANN002, ANN202
        out = real_gather(*args)
        gathered.append(out[2])
        return out

    monkeypatch.setattr(commitpass, "_gather", gather)
    planned, stats = commitpass.build_pass(local, jobs)
    if kept:  # every file the pass kept open is closed
        assert gathered[0] is not None and gathered[0].tolist() == [-1] * len(jobs)
    else:
        assert gathered == [None]
    monkeypatch.setattr(commitpass, "_walk", real_walk)
    gone = damage in ("deleted", "queue_directory_gone")
    assert stats.continued == (0 if gone and kept else 1)  # at most the damaged queue, read again on its own
    for job in jobs:
        if (job.topic, job.queue_id) == victim and gone and kept:
            _job, builder, stop = planned[(job.topic, job.queue_id)]
            got = builder.build(5)
            assert stop is None and got.segment == before.segment and bytes(got.commitlog) == bytes(before.commitlog)
            continue
        got, stop = _as_per_queue(seen, job, planned)
        if (job.topic, job.queue_id) != victim or mapped:
            assert stop is None and got.segment.messages == 20
        elif gone:
            assert got is None and isinstance(stop, ExpiredLocallyError)
        else:  # the entries left are read; a cut entry is not one
            assert stop is None and got.segment.messages == 12, stop


@pytest.mark.parametrize("mapped", [False, True])
def test_a_queue_gone_before_the_pass_is_left_to_its_own_read(tmp_path, clock, mapped):
    """A queue whose directory vanished after the round looked at its files:
    the pass reads nothing for it (one read for all queues, the missing one
    reading as gone) and its own read decides: expired, or (the file still
    mapped from the look) the records read through the mapping, as
    ``build_segment`` decides; the others are built whole."""
    from tiered.errors import ExpiredLocallyError

    queues = [("Gone", q) for q in range(5)]
    sd = tmp_path / "store"
    _small_queues(sd, clock, queues, 10)
    local, seen = LocalStore(sd), LocalStore(sd)  # the pass's, and build_segment's in the same state
    for store in (local, seen):
        for q in queues:  # the round's look: files listed (and mapped, counting them)
            store.max_offset(*q) if mapped else store.queue_files(*q)
            store.release_queue(*q)
    shutil.rmtree(sd / "consumequeue" / "Gone" / "2")
    jobs = _jobs(queues)
    planned, stats = commitpass.build_pass(local, jobs)
    assert stats.queues == 5 and stats.continued == 1
    for job in jobs:
        got, stop = _as_per_queue(seen, job, planned)
        if job.queue_id == 2 and not mapped:
            assert got is None and isinstance(stop, ExpiredLocallyError), stop
        else:
            assert stop is None and got.segment.messages == 10


def test_a_thousand_queues_with_one_corrupt_among_them(tmp_path, clock):
    """A pass over 1,000 queues (their entries read in one call, their
    records in one window): the queue with a corrupt record stops there with
    the typed error naming the CommitLog file and the record's offset; the
    999 others are built whole, each exactly as its own read builds it."""
    from tiered.errors import CorruptRecordError

    queues = [(f"K{i % 4}", i // 4) for i in range(1000)]
    sd = tmp_path / "store"
    with new_writer(sd, commitlog_file_size=4 << 20, cq_entries_per_file=32) as w:
        for i in range(3):
            for q in queues:
                produce(w, *q, 1, clock=clock, body_size=40, seed=i)
    bad = queues[617]
    local = LocalStore(sd)
    phys = next(iter(local.iter_queue(*bad, 1, max_count=1))).record.physical_offset
    _flip_body_byte(sd, *bad, 1)
    jobs = _jobs(queues)
    planned, stats = commitpass.build_pass(local, jobs)
    assert stats.queues == 1000 and stats.windows == 1
    stops = {}
    for job in jobs:
        got, stop = _as_per_queue(local, job, planned)
        stops[(job.topic, job.queue_id)] = stop
        assert got is not None and got.segment.messages == (1 if (job.topic, job.queue_id) == bad else 3)
    assert [k for k, s in stops.items() if s is not None] == [bad]
    assert isinstance(stops[bad], CorruptRecordError) and "CRC" in stops[bad].reason
    assert stops[bad].source == str(sd / "commitlog" / f"{0:020d}") and stops[bad].offset == phys


@pytest.mark.parametrize("fails", ["walk", "recheck"])
def test_files_kept_open_by_a_pass_are_closed_when_it_fails(tmp_path, clock, monkeypatch, fails):
    """The ConsumeQueue files the pass keeps open between its two reads are
    closed, once, when the walk or the recheck raises."""
    queues = [("Shut", q) for q in range(4)]
    sd = tmp_path / "store"
    _small_queues(sd, clock, queues, 5)
    local = LocalStore(sd)
    real_gather, gathered = commitpass._gather, []

    def gather(*args):  # noqa: ANN002, ANN202
        out = real_gather(*args)
        gathered.append((out[2], out[2].tolist()))
        return out

    def boom(*args):  # noqa: ANN002, ANN202
        raise RuntimeError("boom")

    monkeypatch.setattr(commitpass, "_gather", gather)
    monkeypatch.setattr(commitpass, "_walk" if fails == "walk" else "read_kept", boom)
    with pytest.raises(RuntimeError, match="boom"):
        commitpass.build_pass(local, _jobs(queues))
    kept, numbers = gathered[0]
    assert len(numbers) == 4 and min(numbers) >= 0 and kept.tolist() == [-1] * 4
    for fd in numbers:  # none of them still open on a ConsumeQueue file
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except FileNotFoundError:
            continue
        assert "consumequeue" not in target, target


@pytest.mark.parametrize("source", ["yaml", "env", "default"])
def test_dispatch_pass_bytes_from_the_configuration_sets_the_waves(tmp_path, clock, monkeypatch, source):
    """``dispatch.pass_bytes`` (config file or TIERED_DISPATCH__PASS_BYTES)
    reaches the round through the service's wiring: a budget of 2.5 queues
    cuts the five queues into waves of whole turns of the pool, the default
    (parallelism x segment_bytes, 2 MiB here) takes them in one pass. The
    archive is exact either way."""
    from tiered.cli.wiring import make_dispatcher
    from tiered.config import load_settings

    queues, local, biggest = _five_queues(tmp_path, clock)
    lines = [f"store: {tmp_path / 'store'}", f"cold_url: file://{tmp_path / 'cold'}",
             f"state_dir: {tmp_path / 'state'}", f"cluster: {CLUSTER}", f"broker: {BROKER}",
             "dispatch: {upload_bytes: 1, segment_bytes: 1MiB, parallelism: 2"
             + (f", pass_bytes: {5 * biggest}" if source == "yaml" else "") + "}"]
    if source == "env":
        monkeypatch.setenv("TIERED_DISPATCH__PASS_BYTES", f"{5 * biggest}")
    (tmp_path / "tiered.yaml").write_text("\n".join(lines) + "\n")
    settings = load_settings(tmp_path / "tiered.yaml")
    assert settings.dispatch.pass_bytes == (None if source == "default" else 5 * biggest)
    d = make_dispatcher(settings, local, clock=clock)
    d.start()
    r = d.run_round()
    assert r.ok and r.segments == 5, r.errors
    waves = [p.queues for p in d.archiver.passes]
    if source == "default":
        assert waves == [5], waves
    else:
        assert len(waves) >= 2 and sum(waves) == 5 and all(n % 2 == 0 for n in waves[:-1]), waves
    assert_exact(d.cold.store, local, queues)


def test_the_configured_pass_options_reach_every_pass_of_a_round(tmp_path, clock, monkeypatch):
    """``dispatch.pass_threads`` reaches the round's passes through
    ``ArchiveOptions.commit_pass``."""
    from tiered.cli.wiring import make_dispatcher
    from tiered.config import Settings

    seen = _threads_seen(monkeypatch)
    queues, local, _biggest = _five_queues(tmp_path, clock)
    settings = Settings(store=tmp_path / "store", cold_url=f"file://{tmp_path / 'cold'}", state_dir=tmp_path / "s",
                        dispatch={"pass_threads": 3, "upload_bytes": 1, "max_delay": 0.001})
    clock.advance(1)
    d = make_dispatcher(settings, local, clock=clock)
    assert d.options.archive.commit_pass == commitpass.PassOptions(threads=3)
    assert d.options.archive.layout == 2
    result = d.run_round()
    assert result.ok and result.messages == 100 and d.archiver.passes, result
    assert seen and set(seen) == {3}
