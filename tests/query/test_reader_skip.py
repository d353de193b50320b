"""``skip_corrupt`` skips only what is bad: a CommitLog object cut short loses
the records past its end, not the whole piece or slice; the records before
the cut are read."""

from __future__ import annotations

import pytest

from readerkit import BROKER, CLUSTER
from tiered.query.columnar import BatchDecoder, QueueInfo
from tiered.errors import CorruptRecordError
from tiered.query.reader import Archive, QueueRef
from tiered.query.scan import SliceResult, manifest_slices, read_slice


def test_cut_object_loses_only_the_records_past_its_end(archived_v1) -> None:
    store = archived_v1.store  # layout 1: the CommitLog object alone is cut
    ref = QueueRef(CLUSTER, BROKER, "Orders", 0)
    m = Archive(store).manifest(ref)
    seg = m.segments[1]
    cq = store.get(seg.consumequeue_key)
    entries = [(int.from_bytes(cq[i * 20:i * 20 + 8], "big") - seg.cl_start,
                int.from_bytes(cq[i * 20 + 8:i * 20 + 12], "big")) for i in range(seg.messages)]
    k = seg.messages // 2
    cut = entries[k][0] + entries[k][1] // 2  # inside record k
    store.put(seg.commitlog_key, store.get(seg.commitlog_key)[:cut])
    (sl,) = manifest_slices(ref, m, seg.q_start, seg.q_end, 1 << 30)

    def read(skip: bool) -> tuple[list[int], SliceResult]:
        decoder = BatchDecoder(QueueInfo(CLUSTER, BROKER, "Orders", 0), ("queue_offset",), skip_corrupt=skip)
        result = SliceResult()
        got = [o for b in read_slice(store, sl, decoder, result=result) for o in b.column("queue_offset").to_pylist()]
        return got, result

    got, result = read(True)
    assert got == list(range(seg.q_start, seg.q_start + k))
    assert result.skipped == seg.messages - k
    assert result.problems == [f"{seg.commitlog_key} @ {cut}: object ends before its manifest's range"]
    with pytest.raises(CorruptRecordError) as info:
        read(False)
    assert (info.value.source, info.value.offset) == (seg.commitlog_key, cut)


def test_list_dirs_is_one_delimiter_listing_on_every_store(archived) -> None:
    from tiered.query.reader import list_dirs
    from tiered.archive.storage import ObjectStore

    store = archived.store
    assert list_dirs(store) == [CLUSTER] and list_dirs(store, CLUSTER) == [BROKER]
    assert sorted(store.list_dirs(f"{CLUSTER}/{BROKER}"))[:2] == ["%DLQ%billing", "Orders"]
    assert store.list_dirs("no/such/prefix") == []
    # the generic fallback (stores without a delimiter listing) agrees
    assert ObjectStore._raw_list_dirs(store, f"{CLUSTER}/{BROKER}") == store.list_dirs(f"{CLUSTER}/{BROKER}")
    assert archived.counter.ops["list"] >= 4  # every listing went through the store's metered call
