"""Replay's group lag metric and its cap on open connections."""

from __future__ import annotations

import time
import urllib.request

import pytest
from prometheus_client import CollectorRegistry

from replaykit import BROKER, CLUSTER, Archived, Raw, Replay, local_raw
from tiered.archive.storage import open_store
from tiered.replay.lag import GroupLagCollector
from tiered.replay.offsets import GroupOffsets
from tiered.replay.source import ArchiveSource

pytestmark = pytest.mark.timeout(120)


def test_group_lag_is_the_archive_end_minus_each_committed_offset(archived: Archived) -> None:
    store = open_store(archived.cold_url)
    source = ArchiveSource(store, CLUSTER, BROKER)
    offsets = GroupOffsets(store, CLUSTER, BROKER, now_ms=lambda: 0)
    registry = CollectorRegistry()
    registry.register(GroupLagCollector([(source, offsets)]))
    ends = {q: len(local_raw(archived.root, "Orders", q)) for q in range(3)}
    audit_end = len(local_raw(archived.root, "Audit", 0))
    assert registry.get_sample_value("tiered_replay_group_lag_messages", {"group": "a", "topic": "Orders"}) is None
    offsets.commit("a", "Orders", 0, 3)
    offsets.commit("a", "Orders", 1, ends[1] + 50)  # past the end: counts 0, never negative
    offsets.commit("a", "Audit", 0, 0)
    offsets.commit("b", "Orders", 2, ends[2] - 1)
    offsets.commit("b", "Gone", 0, 5)  # a topic not archived: no series
    got = {(s.labels["group"], s.labels["topic"]): s.value
           for fam in registry.collect() for s in fam.samples}
    # queue 2 of group a was never committed: not counted
    assert got == {("a", "Orders"): float(ends[0] - 3), ("a", "Audit"): float(audit_end), ("b", "Orders"): 1.0}


def _refused(url: str) -> float:
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    line = next(x for x in text.splitlines() if x.startswith("tiered_replay_refused_connections_total "))
    return float(line.split()[1])


def test_connections_beyond_the_cap_are_closed(archived: Archived) -> None:
    with Replay(archived.cold_url, "--max-connections", "2") as replay:
        first, second = Raw(replay.address), Raw(replay.address)
        for raw in (first, second):
            assert raw.call(30, {"topic": "Orders", "queueId": "0"}).code == 0
        third = Raw(replay.address)
        assert third.closed()
        third.close()
        assert _refused(replay.metrics_url) == 1.0
        first.close()
        deadline = time.monotonic() + 30  # the server notices the close on its next read
        while True:
            fourth = Raw(replay.address)
            try:
                if fourth.call(30, {"topic": "Orders", "queueId": "0"}).code == 0:
                    break
            except (AssertionError, OSError):  # closed at once: the slot is not free yet
                assert time.monotonic() < deadline, "the freed slot was never reused"
            finally:
                fourth.close()
        assert second.call(30, {"topic": "Orders", "queueId": "0"}).code == 0
        second.close()


def test_the_cap_comes_from_the_environment(archived: Archived) -> None:
    with Replay(archived.cold_url, env={"TIERED_REPLAY__MAX_CONNECTIONS": "1"}) as replay:
        first = Raw(replay.address)
        assert first.call(30, {"topic": "Orders", "queueId": "0"}).code == 0
        second = Raw(replay.address)
        assert second.closed()
        second.close()
        first.close()
