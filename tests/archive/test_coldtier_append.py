"""``ColdTier.append``, the one write entry point into the archive: a built
segment of either layout goes in whole (objects, then the conditional
manifest write) and comes back as the committed manifest; a writer that
moved the manifest meanwhile makes it raise, the archive left as that
writer committed it."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatchkit import BROKER, CLUSTER, archived_records, assert_exact, local_records, new_writer, produce
from dispatchkit import read_manifest
from tiered.archive import layout, segmeta
from tiered.archive.coldtier import ColdTier
from tiered.archive.manifest import Gap, queue_prefix
from tiered.dispatcher.commitpass import BuildJob, build_segment
from tiered.dispatcher.segment import BuiltSegment
from tiered.errors import ConflictError
from tiered.store.localstore import LocalStore

TOPIC, QID = "Appended", 3


def _built(local: LocalStore, start: int, cl_start: int, seg_layout: int, now_ms: int) -> BuiltSegment:
    job = BuildJob(prefix=queue_prefix(CLUSTER, BROKER, TOPIC, QID), topic=TOPIC, queue_id=QID, start=start,
                   cl_start=cl_start, segment_bytes=1500, key_index=True, layout=seg_layout)
    built, stop = build_segment(local, job, now_ms)
    assert built is not None and stop is None
    return built


def _local(tmp_path: Path, clock, count: int) -> LocalStore:  # noqa: ANN001
    w = new_writer(tmp_path / "store")
    produce(w, TOPIC, QID, count, clock=clock)
    w.close()
    return LocalStore(tmp_path / "store")


@pytest.mark.parametrize("seg_layout", [1, 2])
def test_append_writes_the_segment_and_returns_the_committed_manifest(
        seg_layout: int, cold_url, open_cold, tmp_path, clock, caplog) -> None:  # noqa: ANN001
    store = open_cold(cold_url)
    local = _local(tmp_path, clock, 30)
    cold = ColdTier(store, CLUSTER, BROKER, clock=clock)
    first = _built(local, 0, 0, seg_layout, clock.now_ms())
    records = bytes(first.commitlog)  # v2 packs the object in this buffer: a copy to compare with
    m1 = cold.append(TOPIC, QID, None, first)
    # the queue was looked up before its object was written, not rebuilt from that object after
    assert "rebuilt" not in caplog.text
    seg = first.segment
    assert m1.next_offset == seg.q_end and m1.cl_next == seg.cl_start + seg.nbytes
    assert m1.generation == 1 and m1.history == cold.history_for(TOPIC, QID, 0)
    [stored] = m1.segments
    assert stored.q_start == 0 and stored.messages == seg.messages and stored.layout == seg_layout
    assert layout.read_part(store, stored.commitlog_key) == records
    if seg_layout == 2:
        whole = store.get(stored.keys()[0])
        assert stored.keys() == (seg.keys()[0],) and stored.stored_bytes == len(whole)
        assert whole[:seg.nbytes] == records
        desc = segmeta.parse(whole, stored.keys()[0])
    else:
        assert stored.keys() == seg.keys()
        desc = segmeta.parse(store.get(stored.consumequeue_key), stored.consumequeue_key)
    assert desc is not None and desc.segment.q_start == 0 and desc.history == m1.history
    assert read_manifest(store, TOPIC, QID).to_bytes() == m1.to_bytes()
    # the next segment continues the manifest append returned
    second = _built(local, m1.next_offset, m1.cl_next, seg_layout, clock.now_ms())
    m2 = cold.append(TOPIC, QID, m1, second)
    assert m2.generation == 2 and m2.segments[:-1] == m1.segments and m2.next_offset == second.segment.q_end
    assert cold.cached(TOPIC, QID) == m2 and read_manifest(store, TOPIC, QID).to_bytes() == m2.to_bytes()
    assert archived_records(store, TOPIC, QID) == local_records(local, TOPIC, QID)[:m2.next_offset]
    assert_exact(store, local, [(TOPIC, QID)], complete=False)


@pytest.mark.parametrize("seg_layout", [1, 2])
def test_a_writer_moving_the_manifest_makes_append_raise_and_leaves_its_commit(
        seg_layout: int, cold_url, open_cold, tmp_path, clock) -> None:  # noqa: ANN001
    store = open_cold(cold_url)
    local = _local(tmp_path, clock, 30)
    ours = ColdTier(store, CLUSTER, BROKER, clock=clock)
    m1 = ours.append(TOPIC, QID, None, _built(local, 0, 0, seg_layout, clock.now_ms()))
    theirs = ColdTier(store, CLUSTER, BROKER, clock=clock)
    moved = theirs.append_gap(TOPIC, QID, theirs.current(TOPIC, QID),
                              Gap(m1.next_offset, m1.next_offset + 2, "quarantined", clock.now_ms(), "theirs"))
    assert moved.next_offset == m1.next_offset + 2 and moved.generation == 2
    late = _built(local, m1.next_offset, m1.cl_next, seg_layout, clock.now_ms())
    with pytest.raises(ConflictError, match="archive moved to"):
        ours.append(TOPIC, QID, m1, late)  # built on m1: the manifest no longer ends there
    assert read_manifest(store, TOPIC, QID).to_bytes() == moved.to_bytes()
    assert ours.cached(TOPIC, QID) == moved  # re-read: the next attempt starts from what is committed
    assert archived_records(store, TOPIC, QID) == local_records(local, TOPIC, QID)[:m1.next_offset]
    with pytest.raises(ConflictError, match="archive moved to"):
        ours.append_gap(TOPIC, QID, m1, Gap(m1.next_offset, m1.next_offset + 1, "quarantined", clock.now_ms()))
    assert read_manifest(store, TOPIC, QID).to_bytes() == moved.to_bytes()


def test_append_of_a_segment_already_committed_writes_no_manifest(cold_url, open_cold, tmp_path, clock) -> None:  # noqa: ANN001
    """A commit whose response was lost: the same segment appended again on
    the same base finds it committed and returns that manifest unchanged."""
    store = open_cold(cold_url)
    local = _local(tmp_path, clock, 30)
    cold = ColdTier(store, CLUSTER, BROKER, clock=clock)
    m1 = cold.append(TOPIC, QID, None, _built(local, 0, 0, 2, clock.now_ms()))
    stale = ColdTier(store, CLUSTER, BROKER, clock=clock)
    assert stale.current(TOPIC, QID).to_bytes() == m1.to_bytes()
    m2 = cold.append(TOPIC, QID, m1, _built(local, m1.next_offset, m1.cl_next, 2, clock.now_ms()))
    again = stale.append(TOPIC, QID, m1, _built(local, m1.next_offset, m1.cl_next, 2, clock.now_ms()))
    assert again.to_bytes() == m2.to_bytes() and again.generation == 2
    assert read_manifest(store, TOPIC, QID).to_bytes() == m2.to_bytes()
