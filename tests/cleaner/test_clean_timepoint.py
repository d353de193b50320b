"""The time-point scenario (the RocketMQ tiered-store bug this project must not
have): a brand-new topic whose first message arrives at every phase, in 1 s
steps, of the 20 s dispatch cycle, against cleaner intervals of 1 s, 20 s,
60 s and 3600 s, on one ManualClock (no sleeping).

Creates and deletes are counted at the storage interface. Every message is
archived, each archived segment's objects are created exactly once, nothing
is deleted before its retention has passed, and everything is deleted (once)
after it.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from clean_support import Rig

from tiered.cleaner import CleanOptions
from tiered.clock import ManualClock
from tiered.config import RetentionSettings
from tiered.archive.storage import ObjectStore

CYCLE_S = 20
START_MS = 1_700_000_000_000  # a multiple of 20 s: phase 0 is a dispatch instant
TOPIC = "BrandNewTopic"


def run_scenario(root: Path, interval_s: int, phase_s: int, *, retention_s: int = 360, traffic_s: int = 45,
                 store: ObjectStore | None = None) -> None:
    assert START_MS % (CYCLE_S * 1000) == 0
    clock = ManualClock(START_MS)
    rig = Rig(root, store=store, clock=clock, retention=RetentionSettings(default_hours=retention_s / 3600),
              options=CleanOptions(merge=False))
    retention_ms = retention_s * 1000
    last_msg_s = phase_s + traffic_s - 1
    # the first cleaner pass at which the newest segment is past retention
    end_s = -(-(last_msg_s + retention_s + 1) // interval_s) * interval_s
    newest_of: dict[str, int] = {}  # data key -> its segment's max store time
    clean_then_dispatch = phase_s % 2 == 1  # both orders where the two coincide
    reports = []
    for s in range(end_s + 1):
        if s:
            clock.advance(1)
        if phase_s <= s <= last_msg_s:
            rig.produce(TOPIC, 0, 1)
        jobs = []
        if s % CYCLE_S == 0:
            jobs.append("dispatch")
        if s % interval_s == 0:
            jobs.append("clean")
        if clean_then_dispatch:
            jobs.reverse()
        for job in jobs:
            if job == "dispatch":
                result = rig.dispatch()
                assert result.ok, result.errors
            else:
                report = rig.clean()
                assert report.ok, report.errors
                assert report.conflicts == [] and report.busy == []
                reports.append(report)
        m = rig.cold.cached(TOPIC, 0)
        produced = rig.produced.get((TOPIC, 0), {})
        if "dispatch" in jobs:
            # every message is archived at the dispatch that follows it (max delay 0)
            assert produced == {} or (m is not None and m.next_offset == len(produced)), (s, m)
        if m is not None:
            for seg in m.segments:
                for k in seg.keys():
                    newest_of[k] = seg.max_store_ms
            # nothing young is missing: every archived record within retention is still covered
            young = [o for o, (_raw, ts) in produced.items() if ts >= clock.now_ms() - retention_ms
                     and o < m.next_offset]
            if young:
                assert m.segments and m.segments[0].q_start <= min(young), (s, m.segments)

    # -- the outcome --------------------------------------------------------------
    m = rig.manifest(TOPIC, 0)
    assert m is not None and m.next_offset == traffic_s, "the queue keeps its manifest and its progress"
    assert m.segments == () and m.gaps == ()
    segments = rig.recorder.archived_segments[(TOPIC, 0)]
    assert segments >= 1
    created = rig.events.data("put")
    created_keys = Counter(e.key for e in created)
    assert all(n == 1 for n in created_keys.values()), "an object was created twice"
    assert rig.events.kinds("put") == {"commitlog": segments, "consumequeue": segments, "index": segments}
    deleted = rig.events.data("delete")
    assert Counter(e.key for e in deleted) == created_keys, "every object deleted exactly once, after retention"
    first_msg_ms = START_MS + phase_s * 1000
    for e in deleted:
        assert e.now_ms - retention_ms > newest_of[e.key], f"{e.key} deleted before its retention passed"
        assert e.now_ms > first_msg_ms + retention_ms
    # each pass sends its deletes together; nothing else was ever deleted
    assert len(rig.events.delete_requests) <= sum(1 for r in reports if r.expired_segments)
    assert sum(r.expired_segments for r in reports) == segments
    assert not any(r.orphans for r in reports)
    rig.close()


@pytest.mark.parametrize("phase_s", range(CYCLE_S))
@pytest.mark.parametrize("interval_s", [1, 20, 60, 3600])
def test_new_topic_at_every_phase(tmp_path: Path, interval_s: int, phase_s: int) -> None:
    run_scenario(tmp_path, interval_s, phase_s)


@pytest.mark.s3
@pytest.mark.parametrize("phase_s", [0, 7, 19])
@pytest.mark.parametrize("interval_s", [1, 20, 60])
def test_new_topic_on_s3(tmp_path: Path, open_cold, s3_url: str, interval_s: int, phase_s: int) -> None:  # noqa: ANN001
    run_scenario(tmp_path, interval_s, phase_s, retention_s=60, traffic_s=25, store=open_cold(s3_url))
