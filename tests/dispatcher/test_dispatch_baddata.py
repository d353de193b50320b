"""Bad local data. Files the broker deleted before they were archived become
a recorded gap (metric, loud log, continue); a corrupt record stops its
queue at exactly that offset (metric, log) while the other queues go on,
unless quarantining is switched on."""

from __future__ import annotations

import logging
import struct
from pathlib import Path

import pytest

from dispatchkit import BROKER, CLUSTER, assert_exact, new_dispatcher, new_writer, produce, read_manifest
from tiered.format.codec import CQ_ENTRY_SIZE
from tiered.archive.coldtier import ColdTier
from tiered.store.localstore import LocalStore
from tiered.ops.verify import verify

A = ("Expiring", 0)
B = ("Expiring", 1)


def _expire_below(store_dir: Path, cut: int) -> None:
    """What broker retention does: delete CommitLog files wholly below
    ``cut`` and ConsumeQueue files whose entries all point below it."""
    for f in sorted((store_dir / "commitlog").iterdir()):
        start = int(f.name)
        size = f.stat().st_size
        if start + size <= cut:
            f.unlink()
    for qdir in (store_dir / "consumequeue").glob("*/*"):
        files = sorted(qdir.iterdir())
        for f in files[:-1]:  # never the last (active) file
            data = f.read_bytes()
            used = [struct.unpack_from(">qi", data, i)[0] for i in range(0, len(data), CQ_ENTRY_SIZE)
                    if struct.unpack_from(">i", data, i + 8)[0] != 0]
            if used and max(used) < cut:
                f.unlink()


def _commitlog_starts(store_dir: Path) -> list[int]:
    return sorted(int(f.name) for f in (store_dir / "commitlog").iterdir())


def test_expired_local_data_becomes_a_recorded_gap(cold_url, open_cold, tmp_path, clock, recorder, caplog):
    store = open_cold(cold_url, recorder=recorder)
    sd = tmp_path / "store"
    w = new_writer(sd)
    for q in (A, B):
        produce(w, *q, 20, clock=clock, body_size=300)
    local = LocalStore(sd)
    d = new_dispatcher(store, local, tmp_path / "state", clock, recorder=recorder, upload_bytes=1, max_delay_ms=0,
                       segment_bytes=4000)
    assert d.run_round().ok
    archived_to = {q: read_manifest(store, *q).next_offset for q in (A, B)}
    # the sidecar falls behind; the broker's retention deletes what it has not archived
    for step in range(20):
        for q in (A, B):
            produce(w, *q, 20, clock=clock, body_size=300, seed=step)
    starts = _commitlog_starts(sd)
    assert len(starts) >= 5
    _expire_below(sd, starts[3])
    expected_min = {q: LocalStore(sd).queue_range(*q).min_offset for q in (A, B)}
    assert all(expected_min[q] > archived_to[q] for q in (A, B))

    caplog.set_level(logging.ERROR, logger="tiered.dispatcher")
    result = d.run_round()
    assert result.ok, result.errors
    assert result.gaps == 2
    for q in (A, B):
        m = read_manifest(store, *q)
        assert len(m.gaps) == 1
        gap = m.gaps[0]
        assert (gap.q_start, gap.q_end, gap.reason) == (archived_to[q], expected_min[q], "expired_locally")
        assert recorder.gaps[q] == expected_min[q] - archived_to[q]
        assert any(f"{q[0]}/{q[1]} offsets [{archived_to[q]}, {expected_min[q]})" in r.getMessage()
                   for r in caplog.records), [r.getMessage() for r in caplog.records]
    w.close()
    assert_exact(store, local, [A, B])
    report = verify(ColdTier(store, CLUSTER, BROKER), LocalStore(sd))
    assert report.ok, report.problems
    assert report.gaps == 2


def test_files_deleted_in_the_middle_of_a_round(tmp_path, clock, recorder, open_cold):
    """The broker deletes files after the round looked at the queue and
    before it read the records: the build meets the deletion, records a gap
    from the first offset not archived, and carries on."""
    store = open_cold(f"file://{tmp_path / 'cold'}", recorder=recorder)
    sd = tmp_path / "store"
    w = new_writer(sd)
    produce(w, *A, 10, clock=clock, body_size=300)
    local = LocalStore(sd)
    d = new_dispatcher(store, local, tmp_path / "state", clock, recorder=recorder, upload_bytes=1, max_delay_ms=0,
                       segment_bytes=1 << 20)
    assert d.run_round().ok
    produce(w, *A, 400, clock=clock, body_size=300)
    starts = _commitlog_starts(sd)
    real_pending = local.pending
    done = {"x": False}

    def pending_then_expire(*args, **kw):  # noqa: ANN002, ANN003, ANN202
        out = real_pending(*args, **kw)
        if not done["x"]:
            done["x"] = True
            _expire_below(sd, starts[2])
        return out

    local.pending = pending_then_expire  # type: ignore[method-assign]
    result = d.run_round()
    assert result.ok, result.errors
    assert done["x"]
    m = read_manifest(store, *A)
    # What could still be read (a file mapped before its deletion) is archived;
    # from the first record that could not, a gap up to the new local start.
    assert len(m.gaps) == 1 and m.gaps[0].reason == "expired_locally"
    gap = m.gaps[0]
    assert gap.q_start >= 10
    assert gap.q_start == max([s.q_end for s in m.segments if s.q_end <= gap.q_start])
    assert gap.q_end == LocalStore(sd).queue_range(*A).min_offset
    assert recorder.gaps[A] == gap.q_end - gap.q_start
    w.close()
    assert_exact(store, local, [A])


def test_expiry_before_the_first_archive_starts_at_the_earliest_local_offset(tmp_path, clock, recorder, open_cold):
    store = open_cold(f"file://{tmp_path / 'cold'}", recorder=recorder)
    sd = tmp_path / "store"
    with new_writer(sd) as w:
        produce(w, *A, 300, clock=clock, body_size=300)
    _expire_below(sd, _commitlog_starts(sd)[2])
    local = LocalStore(sd)
    first = local.queue_range(*A).min_offset
    assert first > 0
    d = new_dispatcher(store, local, tmp_path / "state", clock, recorder=recorder, upload_bytes=1, max_delay_ms=0)
    assert d.run_round().ok
    m = read_manifest(store, *A)
    assert m.first_offset == first and not m.gaps and not recorder.gaps
    assert_exact(store, local, [A])


def _flip_body_byte(store_dir: Path, local: LocalStore, topic: str, qid: int, offset: int) -> None:
    item = next(iter(local.iter_queue(topic, qid, offset, max_count=1)))
    phys = item.record.physical_offset
    starts = _commitlog_starts(store_dir)
    file_start = max(s for s in starts if s <= phys)
    path = store_dir / "commitlog" / f"{file_start:020d}"
    with open(path, "r+b") as fh:
        pos = phys - file_start + 100  # IPv4 header is 88 bytes: this is in the body
        fh.seek(pos)
        b = fh.read(1)
        fh.seek(pos)
        fh.write(bytes([b[0] ^ 0x5A]))


@pytest.mark.parametrize("quarantine", [False, True])
def test_corrupt_record_stops_its_queue_at_that_offset(quarantine, cold_url, open_cold, tmp_path, clock, recorder,
                                                       caplog):
    store = open_cold(cold_url, recorder=recorder)
    sd = tmp_path / "store"
    with new_writer(sd) as w:
        for q in (A, B):
            produce(w, *q, 30, clock=clock, body_size=200)
    bad = 17
    _flip_body_byte(sd, LocalStore(sd), *A, bad)
    local = LocalStore(sd)
    d = new_dispatcher(store, local, tmp_path / "state", clock, recorder=recorder, upload_bytes=1, max_delay_ms=0,
                       segment_bytes=2500, quarantine_corrupt=quarantine)
    caplog.set_level(logging.ERROR, logger="tiered.dispatcher")
    result = d.run_round()
    mb = read_manifest(store, *B)
    assert mb.next_offset == 30 and not mb.gaps  # the other queue is untouched by A's trouble
    ma = read_manifest(store, *A)
    if not quarantine:
        assert f"{A[0]}/{A[1]}" in result.errors
        assert ma.next_offset == bad, "the queue must stop exactly at the corrupt record"
        assert not ma.gaps
        assert recorder.corrupt[A] == 1
        msgs = [r.getMessage() for r in caplog.records]
        assert any(f"{A[0]}/{A[1]} stopped at offset {bad}" in m and "CRC" in m for m in msgs), msgs
        # later rounds stay stopped there, without counting the same record again
        for _ in range(3):
            clock.advance(600)
            d.run_round()
        assert read_manifest(store, *A).next_offset == bad
        assert recorder.corrupt[A] == 1
        assert_exact(store, local, [A], complete=False)
    else:
        assert result.ok, result.errors
        assert ma.next_offset == 30
        assert [(g.q_start, g.q_end, g.reason) for g in ma.gaps] == [(bad, bad + 1, "quarantined")]
        assert "CRC" in ma.gaps[0].detail
        assert recorder.quarantines[A] == 1
        assert_exact(store, local, [A])
    assert_exact(store, local, [B])


def test_garbage_consumequeue_entry_stops_the_queue(tmp_path, clock, recorder, open_cold):
    store = open_cold(f"file://{tmp_path / 'cold'}", recorder=recorder)
    sd = tmp_path / "store"
    with new_writer(sd) as w:
        produce(w, *A, 20, clock=clock)
    cq = sd / "consumequeue" / A[0] / str(A[1]) / f"{0:020d}"
    with open(cq, "r+b") as fh:
        phys3 = struct.unpack(">q", fh.read(CQ_ENTRY_SIZE * 4)[3 * CQ_ENTRY_SIZE:3 * CQ_ENTRY_SIZE + 8])[0]
        fh.seek(9 * CQ_ENTRY_SIZE)
        fh.write(struct.pack(">qiq", phys3 + 10, 77, 0))  # points into the middle of a written record
    local = LocalStore(sd)
    d = new_dispatcher(store, local, tmp_path / "state", clock, recorder=recorder, upload_bytes=1, max_delay_ms=0)
    result = d.run_round()
    assert result.errors
    assert read_manifest(store, *A).next_offset == 9
    assert recorder.corrupt[A] == 1
