"""The native core's run check (tiered/_native.c) against the numpy one.

Both answer ``check_run``: how many leading records of a run are plainly
valid, and their positions, sizes, tags codes, timestamps and properties
offsets. On valid runs, and on runs with bytes changed anywhere in their
records (a body, a stored CRC, a length, a host flag, the topic), the two
must give exactly the same batch: the compiled loop decides nothing the
numpy path (held to the record-by-record decoder by test_codec_fuzz.py)
would not.
"""

from __future__ import annotations

import mmap
import struct
import tempfile
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zlib_ng.zlib_ng import crc32

from tiered.format import batch
from tiered.format.batch import CQ_DTYPE, RecordBatch, check_run_numpy
from tiered.format.codec import Host
from tiered.store.storewriter import StoreWriter

from nativekit import need_native

FILE = 1 << 20
V6 = Host("2001:db8::7", 50000)
TOPICS = ("T", "t" * 200)  # 200 bytes: magic v2 and a 2-byte topic length

pytestmark = pytest.mark.timeout(120)


def test_the_install_built_the_compiled_check() -> None:
    # the extension is optional at build time: a silent build failure would
    # quietly fall back to the slower path, so the test environment says it
    core = need_native()
    assert batch._native is core
    assert core.crc32(b"123456789") == 0xCBF43926
    data = bytes(range(256)) * 41
    assert core.crc32(memoryview(data)[3:-5]) == zlib.crc32(data[3:-5])


def _runs(tmp: Path) -> dict[tuple[str, int], tuple[bytes, np.ndarray]]:
    """(CommitLog bytes, ConsumeQueue entries) of each queue of a small store
    with IPv4 and IPv6 hosts, empty and large bodies, v1 and v2 topics."""
    with StoreWriter(tmp, commitlog_file_size=FILE, cq_entries_per_file=1000, store_host=Host("10.0.0.1", 10911)) as w:
        for i in range(120):
            topic = TOPICS[i % 2]
            w.put(topic, i % 3 % 2, bytes([i % 256]) * (i * 37 % 700), tags=f"t{i % 5}", keys=[f"k{i}"],
                  store_timestamp=1_700_000_000_000 + i, born_timestamp=1_600_000_000_000 - i,
                  born_host=V6 if i % 4 == 1 else None, store_host=V6 if i % 7 == 3 else None)
    data = (tmp / "commitlog" / f"{0:020d}").read_bytes()
    out = {}
    for topic in TOPICS:
        for q in (0, 1):
            raw = (tmp / "consumequeue" / topic / str(q) / f"{0:020d}").read_bytes()
            entries = np.frombuffer(raw, CQ_DTYPE)
            out[(topic, q)] = (data, entries[entries["size"] != 0].copy())
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, int], tuple[bytes, np.ndarray]]:
    return _runs(tmp_path_factory.mktemp("runcheck"))


def _fields(b: RecordBatch | None) -> tuple[object, ...] | None:
    if b is None:
        return None
    return (b.first_offset, b.source, b.positions.tolist(), b.sizes.tolist(), b.tags.tolist(), b.store_ms.tolist(),
            b.born_ms.tolist(), b.props_at.tolist())


# how check_copy_runs runs: compiled on one thread, compiled on 4 threads with runs
# cut into pieces of about this many bytes (records are 100-1,000 bytes here), numpy;
# and a fourth item, when given: the view a file mapping, copied in stretches of
# that many bytes, each stretch's pages given back behind it
COMPILED, NUMPY = ("compiled", 1, 0), ("numpy", 1, 0)


def _pieces(piece: int, release: int = 0) -> tuple[str, int, int] | tuple[str, int, int, int]:
    return ("compiled", 4, piece, release) if release else ("compiled", 4, piece)


def _mapped(data: bytes) -> mmap.mmap:
    """``data`` as the CommitLog pass sees a file: a read-only shared
    mapping (pages given back are read again from the page cache)."""
    with tempfile.TemporaryFile() as fh:
        fh.write(data)
        fh.flush()
        return mmap.mmap(fh.fileno(), len(data), access=mmap.ACCESS_READ)


def _copied(view: memoryview, entries: np.ndarray, runs: list[tuple[int, bytes, int, int]],
            how: tuple, *, verify_crc: bool = True) -> list[tuple[object, ...] | None]:
    """``check_copy_runs`` over runs given as (entry count, topic, queue id,
    first queue offset), one after the other in ``entries``, each into its
    own destination behind a few bytes already there: each run's answer as
    a batch's fields. Asserts what every way must give: the destination's
    bytes kept are the records' bytes, one after the other, its CRC the
    zlib-ng CRC-32 of the destination up to them, and nothing before them
    changed."""
    tails, blob = batch.run_tails([topic for _count, topic, _queue_id, _first in runs])
    counts = np.array([r[0] for r in runs], np.int64)
    table = np.zeros((len(runs), batch.COPY_FIELDS), np.int64)
    table[:, 0] = np.cumsum(counts) - counts
    table[:, 1] = np.where(tails[:, 0] != 0, counts, 0)  # a topic no record can hold: a run of none
    table[:, 2] = [r[2] for r in runs]
    table[:, 3] = [r[3] for r in runs]
    table[:, 4:7] = tails
    heads = [f"segment {r} so far:".encode() for r in range(len(runs))]
    table[:, 8] = [len(h) for h in heads]
    table[:, 9] = [crc32(h) for h in heads]
    room = [int(entries["size"][at:at + n].astype(np.int64).clip(0).sum()) for at, n in table[:, :2].tolist()]
    dsts = [bytearray(h + b"\xee" * (n + 3)) for h, n in zip(heads, room)]
    kind, threads, piece, *stretch = how
    mapped = _mapped(bytes(view)) if stretch else None
    view = memoryview(mapped) if mapped is not None else view
    native = need_native() if kind == "compiled" else batch._native
    batch._native = native if kind == "compiled" else None
    try:
        out, _cpu = batch.check_copy_runs(view, 0, entries, table, blob, dsts, source="cl", verify_crc=verify_crc,
                                          threads=threads, piece_bytes=piece, release_bytes=stretch[0] if stretch else 0)
    finally:
        batch._native = native
    answers = []
    for (_n, _topic, _queue_id, first), head, dst, (row, k, at, crc, kept) in zip(
            runs, heads, dsts, table[:, [0, 7, 8, 9, 10]].tolist()):
        columns = dict(zip(("positions", "sizes", "tags", "store_ms", "born_ms", "props_at"), out[:, row:row + k]))
        got = RecordBatch(first_offset=first, view=view, source="cl", **columns) if k else None
        records = b"".join(bytes(view[p:p + n]) for p, n in zip(out[0, row:row + k].tolist(),
                                                               out[1, row:row + k].tolist()))
        assert kept == len(records) and bytes(dst[:at + kept]) == head + records
        assert crc == crc32(bytes(dst[:at + kept])), how
        answers.append(_fields(got))
    if mapped is not None:
        got = None  # its arrays hold the view
        view.release()
        mapped.close()
    return answers


def _both(data: bytes, entries: np.ndarray, topic: str, q: int, first: int = 0, base: int = 0,
          verify_crc: bool = True) -> tuple[object, object]:
    kw = dict(topic=topic.encode(), queue_id=q, first_offset=first, source="cl", verify_crc=verify_crc)
    native = batch.check_run(memoryview(data), base, entries, **kw)  # type: ignore[arg-type]
    numpy = check_run_numpy(memoryview(data), base, entries, **kw)  # type: ignore[arg-type]
    return _fields(native), _fields(numpy)


@pytest.mark.parametrize("key", [(t, q) for t in TOPICS for q in (0, 1)], ids=["v1-0", "v1-1", "v2-0", "v2-1"])
def test_valid_runs_give_the_same_batch(runs: dict, key: tuple[str, int]) -> None:
    data, entries = runs[key]
    native, numpy = _both(data, entries, *key)
    assert native == numpy
    assert native is not None and len(native[2]) == len(entries)  # type: ignore[index, arg-type]
    # a run that starts later: queue offsets, and the window's base
    start = int(entries["phys"][5]) - 1000
    native, numpy = _both(data[start:], entries[5:], *key, first=5, base=start)
    assert native == numpy and len(native[2]) == len(entries) - 5  # type: ignore[index]


@pytest.mark.parametrize("key", [("T", 0), ("t" * 200, 1)], ids=["v1", "v2"])
def test_records_re_packed_as_a_segment_holds_them_pass_only_without_the_offset_check(runs: dict,
                                                                                       key: tuple[str, int]) -> None:
    """A segment holds a queue's records one after the other, each keeping
    the broker's physical offset while its entry points into the segment
    (replay's windows): ``check_phys=False`` accepts them, alike both ways;
    the check as the CommitLog is read refuses them at the first record."""
    need_native()
    data, entries = runs[key]
    entries = entries[3:]
    segment = b"".join(data[p:p + n] for p, n in zip(entries["phys"].tolist(), entries["size"].tolist()))
    packed = entries.copy()
    packed["phys"] = np.cumsum(entries["size"].astype(np.int64)) - entries["size"] + 64  # the segment at 64
    kw = dict(topic=key[0].encode(), queue_id=key[1], first_offset=3, source="seg")
    native = batch.check_run(memoryview(segment), 64, packed, check_phys=False, **kw)  # type: ignore[arg-type]
    numpy = check_run_numpy(memoryview(segment), 64, packed, check_phys=False, **kw)  # type: ignore[arg-type]
    assert _fields(native) == _fields(numpy) and native is not None and native.count == len(packed)
    assert native.positions.tolist() == (packed["phys"].astype(np.int64) - 64).tolist()
    assert batch.check_run(memoryview(segment), 64, packed, **kw) is None  # type: ignore[arg-type]
    assert check_run_numpy(memoryview(segment), 64, packed, **kw) is None  # type: ignore[arg-type]
    wrong = packed.copy()
    wrong["size"][4] -= 1  # any other check still holds: the run ends before that record
    got = batch.check_run(memoryview(segment), 64, wrong, check_phys=False, **kw)  # type: ignore[arg-type]
    assert got is not None and got.count == 4
    assert _fields(got) == _fields(check_run_numpy(memoryview(segment), 64, wrong, check_phys=False,
                                                   **kw))  # type: ignore[arg-type]


def test_wrong_queue_topic_or_first_offset_stop_at_the_first_record(runs: dict) -> None:
    data, entries = runs[("T", 0)]
    assert _both(data, entries, "T", 1) == (None, None)
    assert _both(data, entries, "U", 0) == (None, None)
    assert _both(data, entries, "T", 0, first=1) == (None, None)


def test_entries_that_do_not_name_a_record_inside_the_view_are_refused(runs: dict) -> None:
    # the caller keeps runs inside the window; the compiled loop checks anyway (never reads outside it)
    data, entries = runs[("T", 0)]
    bad = entries.copy()
    bad["phys"][3] = len(data) - 10
    got = batch.check_run(memoryview(data), 0, bad, topic=b"T", queue_id=0, first_offset=0, source="cl")
    assert got is not None and got.count == 3
    bad["phys"][0] = -5
    assert batch.check_run(memoryview(data), 0, bad, topic=b"T", queue_id=0, first_offset=0, source="cl") is None


@settings(max_examples=300, deadline=2000, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(st.sampled_from([(t, q) for t in TOPICS for q in (0, 1)]),
       st.lists(st.tuples(st.integers(0, 39), st.integers(0, 2000), st.sampled_from([">B", ">H", ">i", ">q"]),
                          st.sampled_from([0, 1, 0x10, 0x20, 0x30, 0x7F, 0x80, 0xFF, 0x7FFF, 0x8000, 0xFFFF,
                                           0x7FFFFFFF, 127, 88, 3])),
                min_size=1, max_size=3),
       st.booleans())
def test_corrupt_runs_give_the_same_batch(runs: dict, key: tuple[str, int],
                                          changes: list[tuple[int, int, str, int]], verify_crc: bool) -> None:
    data, entries = runs[key]
    buf = bytearray(data)
    for rec, at, fmt, value in changes:
        # inside record ``rec`` of the run, any field or body byte
        e = entries[rec % len(entries)]
        pos = int(e["phys"]) + at % int(e["size"])
        width = struct.calcsize(fmt)
        pos = min(pos, len(buf) - width)
        struct.pack_into(fmt, buf, pos, value & ((1 << (8 * width)) - 1) if fmt in (">B", ">H") else
                         value if fmt != ">q" else value << 8)
    native, numpy = _both(bytes(buf), entries, *key, verify_crc=verify_crc)
    assert native == numpy


_KEYS = [(t, q) for t in TOPICS for q in (0, 1)]


@settings(max_examples=200, deadline=2000, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(_KEYS), st.integers(0, 40), st.integers(0, 40), st.integers(-1, 1),
                          st.sampled_from([0, 0, 0, 1, -1])), max_size=8),
       st.lists(st.tuples(st.integers(0, 1 << 20), st.sampled_from([">B", ">I"]), st.integers(0, 0xFFFFFFFF)),
                max_size=3),
       st.booleans(), st.integers(1, 4000), st.integers(1, 40000))
def test_many_runs_in_one_call_answer_as_one_call_a_run(runs: dict, spec: list, changes: list,
                                                        verify_crc: bool, piece: int, release: int) -> None:
    # a window of the CommitLog pass: runs of several queues (parts of them,
    # with wrong queue ids or first offsets at times) over one view, bytes
    # changed anywhere in it; one compiled call on one thread, one on four
    # threads with the runs cut into pieces (a bad record in any piece: the
    # run stops there, the pieces after it count for nothing), run by run
    # with numpy, and one check_run a run all give the same batches, the
    # same bytes kept and their CRC (``_copied``); and so do both compiled
    # ways over a file mapping copied in stretches, their pages given back
    data = bytearray(next(iter(runs.values()))[0])
    # the records fill the first ~64 KiB of the 1 MiB file: changes land among them
    written = max(int((e["phys"] + e["size"]).max()) for _, e in runs.values())
    for at, fmt, value in changes:
        width = struct.calcsize(fmt)
        pos = at % (written - width + 1)
        struct.pack_into(fmt, data, pos, value & ((1 << (8 * width)) - 1))
    view = memoryview(bytes(data))
    parts, table = [], []
    for (topic, q), lo, n, q_shift, off_shift in spec:
        entries = runs[(topic, q)][1]
        lo = min(lo, len(entries))
        part = entries[lo:lo + n]
        parts.append(part)
        table.append((len(part), topic.encode(), q + q_shift, lo + off_shift, ))
    entries = np.concatenate(parts) if parts else np.zeros(0, CQ_DTYPE)
    native = _copied(view, entries, table, COMPILED, verify_crc=verify_crc)
    pieces = _copied(view, entries, table, _pieces(piece), verify_crc=verify_crc)
    numpy = _copied(view, entries, table, NUMPY, verify_crc=verify_crc)
    stretched = _copied(view, entries, table, ("compiled", 1, 0, release), verify_crc=verify_crc)
    stretched_pieces = _copied(view, entries, table, _pieces(piece, release), verify_crc=verify_crc)
    one_by_one = [batch.check_run(view, 0, part, topic=topic, queue_id=q, first_offset=first, source="cl",
                                  verify_crc=verify_crc) for part, (_n, topic, q, first) in zip(parts, table)]
    assert native == pieces == numpy == stretched == stretched_pieces == [_fields(b) for b in one_by_one]


@pytest.mark.parametrize("how", [COMPILED, _pieces(1500), NUMPY, ("compiled", 1, 0, 3000), _pieces(1500, 5000)],
                         ids=["compiled", "pieces", "numpy", "stretches", "pieces-in-stretches"])
@pytest.mark.parametrize("bad", [0, 7, 19, 39])
def test_a_bad_record_in_any_piece_ends_its_run_there(runs: dict, how: tuple[str, int, int], bad: int) -> None:
    """A run of 40 records cut into pieces of about two records, its body CRC
    broken at record ``bad`` (the first piece, one in the middle, the last):
    the records before it are kept, exactly their bytes and CRC, whatever
    the pieces after it copied; the other run of the window is whole. In
    stretches, the runs' records interleave across them: the one ended in
    an early stretch takes nothing in the later ones."""
    data, t0 = runs[("T", 0)]
    t1 = runs[(TOPICS[1], 1)][1]
    spoiled = bytearray(data)
    spoiled[int(t0["phys"][bad]) + 8] ^= 0x5A  # its stored body CRC
    view = memoryview(bytes(spoiled))
    entries = np.concatenate([t0, t1]).astype(CQ_DTYPE)
    got = _copied(view, entries, [(len(t0), b"T", 0, 0), (len(t1), TOPICS[1].encode(), 1, 0)], how)
    want = [batch.check_run(view, 0, e, topic=t, queue_id=q, first_offset=0, source="cl")
            for e, t, q in ((t0, b"T", 0), (t1, TOPICS[1].encode(), 1))]
    assert got == [_fields(b) for b in want]
    assert (want[0].count if want[0] is not None else 0) == bad and want[1].count == len(t1)


def _resident(path: Path) -> int:
    """Bytes of this process's mapping of ``path`` in memory (/proc/self/smaps ``Rss``)."""
    inside = False
    with open("/proc/self/smaps") as fh:
        for line in fh:
            if not line[0].isupper():  # a mapping's header line, its path last
                inside = line.rstrip("\n").endswith(" " + str(path))
            elif inside and line.startswith("Rss:"):
                return int(line.split()[1]) * 1024
    return 0


@pytest.mark.parametrize("threads", [1, 4])
def test_a_window_copied_in_stretches_holds_one_stretch_mapped(store_writer, threads: int) -> None:
    """A queue's records over 5 MiB of a mapped CommitLog, copied in stretches
    of 256 KiB: the same records, bytes and CRC as in one go, and the pages
    behind each stretch given back (what a wide window of the CommitLog pass
    relies on to keep its resident set at a stretch, not the window)."""
    with store_writer(commitlog_file_size=8 << 20) as w:
        for i in range(320):
            w.put("T", i % 2, bytes([i % 251]) * 16_000, keys=[f"k{i}"], store_timestamp=1_700_000_000_000 + i)
    path = w.root / "commitlog" / f"{0:020d}"
    raw = (w.root / "consumequeue" / "T" / "0" / f"{0:020d}").read_bytes()
    entries = np.frombuffer(raw, CQ_DTYPE)
    entries = entries[entries["size"] != 0].copy()
    tails, blob = batch.run_tails([b"T"])
    answers = []
    for release in (0, 256 << 10):
        table = np.zeros((1, batch.COPY_FIELDS), np.int64)
        table[0, 1:4] = len(entries), 0, 0
        table[0, 4:7] = tails[0]
        dst = bytearray(int(entries["size"].astype(np.int64).sum()))
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            mm.madvise(mmap.MADV_DONTNEED)  # nothing of it mapped before
            view = memoryview(mm)
            out, _cpu = batch.check_copy_runs(view, 0, entries, table, blob, [dst], source="cl", threads=threads,
                                              piece_bytes=64 << 10 if threads > 1 else 0, release_bytes=release)
            resident = _resident(path)
            view.release()
        answers.append((table[0, [7, 9, 10]].tolist(), out[:, :len(entries)].tolist(), bytes(dst)))
        if release:
            assert resident < 1 << 20, resident  # a stretch and the pages around its end
        else:
            assert resident > 2 << 20, resident  # every page read
    assert answers[0] == answers[1] and answers[0][0][0] == len(entries) == 160
    assert answers[0][0][1] == crc32(answers[0][2])


def test_stretches_are_refused_over_anything_but_a_read_only_mapped_file(runs: dict) -> None:
    """Pages given back behind a copy are read again from the file; given
    back from this process's memory or a private copy, they would be lost
    (zeroed, or the file's bytes again): refused before anything is copied."""
    data, entries = runs[("T", 0)]
    tails, blob = batch.run_tails([b"T"])
    table = np.zeros((1, batch.COPY_FIELDS), np.int64)
    table[0, 1] = len(entries)
    table[0, 4:7] = tails[0]
    dst = bytearray(int(entries["size"].astype(np.int64).sum()))
    private = mmap.mmap(-1, len(data), access=mmap.ACCESS_COPY)
    writable = mmap.mmap(-1, len(data))
    for view in (memoryview(data), memoryview(bytearray(data)), memoryview(private), memoryview(writable)):
        with pytest.raises(ValueError, match="read-only mapped file"):
            batch.check_copy_runs(view, 0, entries, table, blob, [dst], source="cl", release_bytes=4096)
        view.release()
    private.close()
    writable.close()
    assert not any(dst)


@pytest.mark.parametrize("compiled", [True, False])
def test_many_runs_refuse_tables_and_destinations_that_do_not_fit(runs: dict, monkeypatch, compiled: bool) -> None:
    if not compiled:
        monkeypatch.setattr(batch, "_native", None)
    else:
        need_native()
    data, entries = runs[("T", 0)]
    tails, blob = batch.run_tails([b"T"])
    view = memoryview(data)
    four = entries[:4].copy()
    need = int(four["size"].astype(np.int64).sum())

    def call(row: tuple[int, ...], dst: bytearray, **kw: object) -> np.ndarray:
        table = np.array([row], np.int64)
        batch.check_copy_runs(view, 0, four, table, blob, [dst], source="cl", **kw)  # type: ignore[arg-type]
        return table

    ok = (0, 4, 0, 0, *tails[0], 0, 0, 0, 0)
    with pytest.raises(ValueError, match="run 0 outside the entries or tails given"):
        call((2, 3, *ok[2:]), bytearray(need))  # entries 2..5 of 4
    with pytest.raises(ValueError, match="run 0 outside the entries or tails given"):
        call((*ok[:5], 1, 2, *ok[7:]), bytearray(need))  # a tail past the tails given
    with pytest.raises(ValueError, match="run 0 outside the entries or tails given"):
        call((*ok[:9], 1 << 32, 0), bytearray(need))  # not a CRC-32
    # a destination without room for every record the run may keep: refused before a byte is copied
    short = bytearray(b"\xee" * (need + 4))
    with pytest.raises(ValueError, match="run 0: its records do not fit its destination"):
        call((*ok[:8], 5, 0, 0), short)
    assert short == b"\xee" * (need + 4)
    # only the entries that name a record inside the view need room
    outside = four.copy()
    outside["phys"][2] = len(data) + 1
    table = np.array([ok], np.int64)
    two = int(four["size"][:2].astype(np.int64).sum())
    batch.check_copy_runs(view, 0, outside, table, blob, [bytearray(two)], source="cl")
    assert table[0, [7, 10]].tolist() == [2, two]
    with pytest.raises(ValueError, match="contiguous 6 x"):
        batch.check_copy_runs(view, 0, four, np.array([ok], np.int64), blob, [bytearray(need)], source="cl",
                              out=np.empty((6, 3), np.int64))
    with pytest.raises(ValueError, match="wrong size"):
        batch.check_copy_runs(view, 0, four, np.array([ok], np.int64), blob, [], source="cl")
    if compiled:
        with pytest.raises(BufferError):
            batch.check_copy_runs(view, 0, four, np.array([ok], np.int64), blob, [b"read-only" * 1000],  # type: ignore[list-item]
                                  source="cl")


def test_entries_in_native_byte_order_are_read_as_the_same_entries(runs: dict) -> None:
    # numpy joins CQ_DTYPE arrays into the native byte order (same values): the compiled loop reads big-endian
    data, entries = runs[("T", 0)]
    native_order = np.concatenate([entries[:0], entries])
    assert native_order.dtype != CQ_DTYPE and native_order.tolist() == entries.tolist()
    want = _fields(batch.check_run(memoryview(data), 0, entries, topic=b"T", queue_id=0, first_offset=0, source="cl"))
    got = batch.check_run(memoryview(data), 0, native_order, topic=b"T", queue_id=0, first_offset=0, source="cl")
    assert want is not None and _fields(got) == want
    for how in (COMPILED, _pieces(3000)):
        assert _copied(memoryview(data), native_order, [(len(entries), b"T", 0, 0)], how) == [want]


@pytest.mark.parametrize("how", [COMPILED, _pieces(700), NUMPY], ids=["compiled", "pieces", "numpy"])
def test_a_table_of_runs_at_any_rows_answers_as_check_run(runs: dict, how: tuple[str, int, int]) -> None:
    """``check_copy_runs`` (the CommitLog pass's call): runs taking rows of
    one entries array in any order, one cut short by a flipped CRC, one of a
    wrong queue id, one of a topic no record can hold; answers written at
    their entries' rows of the ``out`` given, the rows of no run untouched,
    each run's records copied behind the bytes its destination held."""
    data = bytearray(runs[("T", 0)][0])
    t0, t1 = runs[("T", 0)][1], runs[(TOPICS[1], 1)][1]
    every = np.concatenate([t0, t1]).astype(CQ_DTYPE)
    flipped = int(t1["phys"][6]) + 8  # record 6's stored body CRC: it no longer matches
    data[flipped] ^= 0x5A
    view = memoryview(bytes(data))
    topics = [TOPICS[1].encode(), b"T", b"T", b"x" * 0x10000]
    tails, blob = batch.run_tails(topics)
    # (first row, count, queue id, first queue offset): t1 from entry 2, t0 from entry 3, t0 with queue 5, too long a topic
    spec = [(len(t0) + 2, 8, 1, 2), (3, 5, 0, 3), (9, 2, 5, 9), (12, 2, 0, 12)]
    table = np.zeros((len(spec), batch.COPY_FIELDS), np.int64)
    for r, (row, count, qid, first) in enumerate(spec):
        table[r, :4] = (row, count if tails[r, 0] else 0, qid, first)
        table[r, 4:7] = tails[r]
        table[r, 8:10] = (3, crc32(b"abc"))
    dsts = [bytearray(b"abc" + bytes(1 << 16)) for _ in spec]
    out = np.full((6, len(every)), -7, np.int64)
    kind, threads, piece = how
    saved = need_native() if kind == "compiled" else batch._native
    batch._native = saved if kind == "compiled" else None
    try:
        got, _cpu = batch.check_copy_runs(view, 0, every, table, blob, dsts, source="cl", out=out, threads=threads,
                                          piece_bytes=piece)
    finally:
        batch._native = saved
    assert got is out
    assert table[:, 7].tolist() == [4, 5, 0, 0]  # t1 stops at entry 6 (2 + 4), the wrong queue and topic at once
    of_runs = set()
    for (row, count, qid, first), k, kept, crc, dst, topic in zip(spec, table[:, 7].tolist(), table[:, 10].tolist(),
                                                                  table[:, 9].tolist(), dsts, topics):
        want = batch.check_run(view, 0, every[row:row + count], topic=topic, queue_id=qid, first_offset=first,
                               source="cl") if len(topic) <= 0xFFFF else None
        assert (want.count if want is not None else 0) == k
        if k:
            assert [out[f, row:row + k].tolist() for f in range(6)] == [
                c.tolist() for c in (want.positions, want.sizes, want.tags, want.store_ms, want.born_ms,
                                     want.props_at)]
        records = b"".join(bytes(view[p:p + n]) for p, n in zip(out[0, row:row + k].tolist(),
                                                               out[1, row:row + k].tolist()))
        assert kept == len(records) and dst[:3 + kept] == b"abc" + records and crc == crc32(dst[:3 + kept])
        of_runs.update(range(row, row + count))
    untouched = [i for i in range(len(every)) if i not in of_runs]
    assert (out[:, untouched] == -7).all()


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=3000), st.integers(0, 3000), st.integers(0, 0xFFFFFFFF))
def test_crc32_combine_is_the_crc_of_the_two_parts_one_after_the_other(data: bytes, cut: int, start: int) -> None:
    """The compiled call joins its pieces' CRCs with zlib's crc32_combine,
    linked at build time."""
    a, b = data[:cut], data[cut:]
    core = need_native()
    assert core.crc32_combine(crc32(a, start), crc32(b), len(b)) == crc32(data, start)
    assert core.crc32_combine(crc32(a), crc32(b), len(b)) == zlib.crc32(data)
