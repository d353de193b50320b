"""A queue's first-seen start outlives a sidecar restart: data the broker
deletes between the dispatcher first seeing a queue and its first commit is
a recorded gap even when the sidecar restarted in between. The start is
local state (a cache): lost, unreadable or unwritable, the dispatcher falls
back to fixing it again from what the store holds then."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from tiered.dispatcher import TopicFilter
from dispatchkit import (BROKER, CLUSTER, assert_exact, expire_below, new_dispatcher, new_writer, produce,
                         read_manifest)
from tiered.metrics import PrometheusRecorder
from tiered.clock import ManualClock
from tiered.store.localstore import LocalStore
from tiered.archive.storage import ObjectStore, S3Options, open_store

A0, A1, B0 = ("Orders", 0), ("Orders", 1), ("Audit", 0)
HOUR_MS = 3_600_000


def _starts_file(state: Path) -> Path:
    return state / "first-starts" / CLUSTER / f"{BROKER}.json"


def _recorded(state: Path) -> dict[tuple[str, int], int]:
    doc = json.loads(_starts_file(state).read_text())
    assert doc["version"] == 1
    return {(e["topic"], e["queue"]): e["offset"] for e in doc["starts"]}


def _fill(sd: Path, clock: ManualClock) -> None:
    """Orders/0 spread over several CommitLog and ConsumeQueue files, then
    two small queues written last (retention leaves them whole)."""
    with new_writer(sd) as w:
        produce(w, *A0, 300, clock=clock, body_size=300)
        produce(w, *A1, 20, clock=clock)
        produce(w, *B0, 10, clock=clock)


def _expire_oldest(sd: Path) -> int:
    """The broker deletes the two oldest CommitLog files (and the ConsumeQueue
    files pointing only into them); returns Orders/0's new first offset."""
    starts = sorted(int(f.name) for f in (sd / "commitlog").iterdir())
    expire_below(sd, starts[2])
    first = LocalStore(sd).queue_range(*A0).min_offset
    assert first > 0
    return first


def _gaps(store: ObjectStore, q: tuple[str, int]) -> list[tuple[int, int, str]]:
    m = read_manifest(store, *q)
    assert m is not None
    return [(g.q_start, g.q_end, g.reason) for g in m.gaps]


@pytest.mark.s3
def test_a_restart_before_the_first_commit_keeps_the_gap(tmp_path: Path, moto_endpoint: str, s3_bucket: str) -> None:
    clock = ManualClock()
    sd, state = tmp_path / "store", tmp_path / "state"
    store = open_store(f"s3://{s3_bucket}/archive", s3=S3Options(endpoint_url=moto_endpoint))
    _fill(sd, clock)
    # first life: every queue seen from offset 0, none due yet (the delay)
    first_life = new_dispatcher(store, LocalStore(sd), state, clock, max_delay_ms=HOUR_MS)
    assert first_life.run_round().ok
    assert [read_manifest(store, *q) for q in (A0, A1, B0)] == [None, None, None]
    assert _recorded(state) == {A0: 0, A1: 0, B0: 0}
    del first_life  # the sidecar stops

    first = _expire_oldest(tmp_path / "store")
    clock.advance(3600)  # the old lease expired meanwhile; everything is due now
    # second life: a new process, metrics from zero, Audit no longer watched
    registry = CollectorRegistry()
    rec = PrometheusRecorder(registry, started_s=clock.now_ms() / 1000)
    local = LocalStore(sd)
    second_life = new_dispatcher(store, local, state, clock, recorder=rec, max_delay_ms=HOUR_MS,
                                 topic_filter=TopicFilter(exclude=("Audit",)))
    result = second_life.run_round()
    assert result.ok, result.errors
    assert result.gaps == 1
    assert _gaps(store, A0) == [(0, first, "expired_locally")]
    m = read_manifest(store, *A0)
    assert m is not None and (m.first_offset, m.next_offset) == (0, 300)
    assert _gaps(store, A1) == []
    assert read_manifest(store, *B0) is None
    assert registry.get_sample_value("tiered_gaps_total", {"topic": "Orders"}) == 1
    assert registry.get_sample_value("tiered_gap_messages_total", {"topic": "Orders"}) == first
    assert_exact(store, local, [A0, A1])
    # archived queues have their manifest to go on; Audit is not watched
    assert _recorded(state) == {}


def test_without_the_recorded_starts_a_restart_starts_from_the_store(tmp_path: Path) -> None:
    """The state directory lost: today's behaviour, no invented gap."""
    clock = ManualClock()
    sd, state = tmp_path / "store", tmp_path / "state"
    store = open_store(f"file://{tmp_path / 'cold'}")
    _fill(sd, clock)
    assert new_dispatcher(store, LocalStore(sd), state, clock, max_delay_ms=HOUR_MS).run_round().ok
    _starts_file(state).unlink()
    first = _expire_oldest(sd)
    clock.advance(3600)
    rec = PrometheusRecorder(CollectorRegistry())
    result = new_dispatcher(store, LocalStore(sd), state, clock, recorder=rec, max_delay_ms=HOUR_MS).run_round()
    assert result.ok and result.gaps == 0
    m = read_manifest(store, *A0)
    assert m is not None and (m.first_offset, m.next_offset, m.gaps) == (first, 300, ())
    assert rec.registry.get_sample_value("tiered_gaps_total", {"topic": "Orders"}) == 0
    assert_exact(store, LocalStore(sd), [A0, A1, B0])


@pytest.mark.parametrize("content", [
    b"{not json",
    b"",
    b"[]",
    b'{"version": 2, "starts": []}',
    b'{"version": 1, "starts": {"Orders": 0}}',
    b'{"version": 1, "starts": [{"topic": "Orders", "queue": 0, "offset": -1}]}',
    b'{"version": 1, "starts": [{"topic": "Orders", "queue": true, "offset": 0}]}',
    b'{"version": 1, "starts": [{"topic": "Orders", "queue": 0}]}',
])
def test_an_unreadable_file_is_unknown(tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture) -> None:
    clock = ManualClock()
    sd, state = tmp_path / "store", tmp_path / "state"
    store = open_store(f"file://{tmp_path / 'cold'}")
    _fill(sd, clock)
    first = _expire_oldest(sd)
    path = _starts_file(state)
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    path.with_name(path.name + ".bak").write_bytes(content)  # no usable backup either
    with caplog.at_level(logging.WARNING, logger="tiered.dispatcher.firststarts"):
        d = new_dispatcher(store, LocalStore(sd), state, clock, max_delay_ms=HOUR_MS)
    assert [r.getMessage() for r in caplog.records if str(path) in r.getMessage() and "unusable" in r.getMessage()]
    assert d.run_round().ok
    # fixed again from what the store holds now, and the file is whole again
    assert _recorded(state) == {A0: first, A1: 0, B0: 0}
    clock.advance(3600)
    result = d.run_round()
    assert result.ok and result.gaps == 0
    m = read_manifest(store, *A0)
    assert m is not None and (m.first_offset, m.gaps) == (first, ())
    assert _recorded(state) == {}


def test_a_start_past_the_store_end_is_fixed_again(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A store wiped (or a topic re-created) since: its offsets start over."""
    clock = ManualClock()
    sd, state = tmp_path / "store", tmp_path / "state"
    store = open_store(f"file://{tmp_path / 'cold'}")
    _fill(sd, clock)
    path = _starts_file(state)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"version": 1, "starts": [{"topic": "Orders", "queue": 0, "offset": 5000},
                                                         {"topic": "Orders", "queue": 1, "offset": 7}]}))
    d = new_dispatcher(store, LocalStore(sd), state, clock, max_delay_ms=HOUR_MS)
    with caplog.at_level(logging.WARNING, logger="tiered.dispatcher.archiver"):
        assert d.run_round().ok
    assert [r.getMessage() for r in caplog.records] == [
        "Orders/0: first-seen start 5000 is past the store's end 300; fixing it again"]
    assert _recorded(state) == {A0: 0, A1: 7, B0: 0}
    clock.advance(3600)
    assert d.run_round().ok
    assert [(m.first_offset, m.next_offset, m.gaps) for m in (read_manifest(store, *A0), read_manifest(store, *A1))
            ] == [(0, 300, ()), (7, 20, ())]


def test_an_unwritable_state_keeps_the_start_in_memory(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = ManualClock()
    sd, state = tmp_path / "store", tmp_path / "state"
    store = open_store(f"file://{tmp_path / 'cold'}")
    _fill(sd, clock)
    state.mkdir()
    (state / "first-starts").write_text("a file where the directory should be")
    rec = PrometheusRecorder(CollectorRegistry())
    d = new_dispatcher(store, LocalStore(sd), state, clock, recorder=rec, max_delay_ms=HOUR_MS)
    with caplog.at_level(logging.ERROR, logger="tiered.dispatcher.firststarts"):
        assert d.run_round().ok
        first = _expire_oldest(sd)
        clock.advance(3600)
        result = d.run_round()
    assert result.ok and result.gaps == 1
    assert _gaps(store, A0) == [(0, first, "expired_locally")]
    assert rec.registry.get_sample_value("tiered_gap_messages_total", {"topic": "Orders"}) == first
    # once, not every round: the second round had nothing new to record
    assert len([r for r in caplog.records if "cannot record the first-seen starts" in r.getMessage()]) == 1
