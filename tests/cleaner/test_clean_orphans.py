"""Orphan collection. Object mtimes come from the store's clock (the file
system, or the S3 server's LastModified), so these rigs start their
ManualClock at the real time and move it past the grace period."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from clean_support import PREFIX, Rig

from tiered.cleaner import CleanOptions
from tiered.config import RetentionSettings
from tiered.archive.manifest import CATALOG, LEASE

GRACE_S = 3600


def real_clock_rig(root: Path, **kw) -> Rig:  # noqa: ANN003
    from tiered.clock import ManualClock

    kw.setdefault("options", CleanOptions(merge=False, orphan_grace_ms=GRACE_S * 1000,
                                          orphan_scan_interval_ms=6 * 3600 * 1000))
    kw.setdefault("retention", RetentionSettings(default_hours=72))
    return Rig(root, clock=ManualClock(time.time_ns() // 1_000_000), **kw)


@pytest.fixture
def rig(tmp_path: Path, cold_url: str, open_cold) -> Rig:  # noqa: ANN001
    r = real_clock_rig(tmp_path, store=open_cold(cold_url))
    yield r
    r.close()


def test_orphans_older_than_grace_are_collected_and_counted(rig: Rig) -> None:
    rig.produce("T", 0, 3)
    rig.dispatch()
    rig.produce("T", 0, 2)
    orphans = rig.crash_before_commit(rig.dispatch)
    assert len(orphans) == 3
    rig.restart()
    rig.objects.put(f"{PREFIX}/T/0/notes.txt", b"not ours")
    rig.produce("T", 0, 1)  # the retried upload now covers 3 records: new names; the old ones are orphans
    rig.dispatch()
    rep = rig.clean()
    assert rep.orphan_scan and rep.orphans == [] and rep.ok  # all younger than the grace period
    rig.advance(GRACE_S + 60)
    rep = rig.clean(orphans=True)
    assert sorted(rep.orphans) == orphans and rig.recorder.orphans == 3
    for k in orphans:
        assert rig.objects.head(k) is None
    # referenced data, manifests, the catalog and foreign objects are untouched
    assert rig.archive("T") == rig.expected("T")
    assert rig.objects.head(f"{PREFIX}/T/0/notes.txt") is not None
    assert rig.objects.head(f"{PREFIX}/T/0/manifest.json") is not None
    assert rig.objects.head(f"{PREFIX}/{CATALOG}") is not None


def test_retried_upload_of_the_same_range_is_not_an_orphan(rig: Rig) -> None:
    rig.produce("T", 0, 3)
    leftovers = rig.crash_before_commit(rig.dispatch)
    rig.advance(GRACE_S + 60)
    rig.restart()
    rig.dispatch()  # same records, same names, same bytes: now referenced
    rep = rig.clean(orphans=True)
    assert rep.orphans == []
    assert {k for s in rig.manifest("T").segments for k in s.keys()} == set(leftovers)
    assert rig.archive("T") == rig.expected("T")


def test_objects_of_a_queue_without_manifest_are_kept(rig: Rig) -> None:
    rig.produce("T", 0, 2)
    rig.dispatch()
    rig.produce("N", 0, 2)
    leftovers = rig.crash_before_commit(rig.dispatch)  # N's first segment, never committed
    assert leftovers and all("/N/0/" in k for k in leftovers)
    rig.advance(GRACE_S + 60)
    rep = rig.clean(orphans=True)
    assert rep.orphans == [] and rep.unmanaged == {"N/0": 3}
    assert all(rig.objects.head(k) for k in leftovers)


def test_pending_deletes_are_not_orphans(tmp_path: Path) -> None:
    rig = real_clock_rig(tmp_path, options=CleanOptions(merge=True, merge_fanin=2, merge_min_bytes=1 << 20,
                                                        orphan_grace_ms=GRACE_S * 1000))
    for _ in range(2):
        rig.produce("T", 0, 2)
        rig.dispatch()
    old_keys = {k for s in rig.manifest("T").segments for k in s.keys()}
    rig.advance(GRACE_S + 60)  # old objects are older than the grace period now
    rep = rig.clean(orphans=True)
    assert rep.merged_segments == 2 and rep.orphans == []
    assert {k for p in rig.manifest("T").pending_deletes for k in p.keys} == old_keys
    assert all(rig.objects.head(k) for k in old_keys)
    rig.close()


def test_orphan_scan_runs_on_its_own_cadence(rig: Rig) -> None:
    rig.produce("T", 0, 2)
    rig.dispatch()
    assert rig.clean().orphan_scan  # first pass of the process
    rig.recorder.requests.clear()
    rig.advance(3600)
    rep = rig.clean()
    assert not rep.orphan_scan and rig.recorder.total_requests() == 0
    rig.advance(5 * 3600)
    assert rig.clean().orphan_scan and rig.recorder.ops["list"] == 1


def test_dry_run_lists_but_deletes_nothing(rig: Rig) -> None:
    rig.produce("T", 0, 2)
    rig.dispatch()
    rig.produce("T", 0, 1)
    orphans = rig.crash_before_commit(rig.dispatch)
    rig.restart()
    rig.advance(GRACE_S + 60)
    rep = rig.clean(dry_run=True, orphans=True)
    assert sorted(rep.orphans) == orphans
    assert all(rig.objects.head(k) for k in orphans)
    assert rig.events.data("delete") == []


def test_busy_queue_orphans_wait(rig: Rig) -> None:
    rig.produce("T", 0, 2)
    rig.dispatch()
    rig.produce("T", 0, 1)
    orphans = rig.crash_before_commit(rig.dispatch)
    rig.restart()
    rig.produce("T", 0, 1)
    rig.dispatch()
    rig.advance(GRACE_S + 60)
    with rig.cold.lock("T", 0):
        rep = rig.clean(orphans=True)
    assert rep.busy == [("T", 0)] and rep.orphans == []
    rep = rig.clean(orphans=True)
    assert sorted(rep.orphans) == orphans


def test_lease_object_is_never_touched(rig: Rig) -> None:
    rig.objects.put(f"{PREFIX}/{LEASE}", b"{}")
    rig.produce("T", 0, 2)
    rig.dispatch()
    rig.advance(10 * 3600)
    rig.clean(orphans=True)
    assert rig.objects.head(f"{PREFIX}/{LEASE}") is not None
