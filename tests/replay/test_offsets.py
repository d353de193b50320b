"""Group offsets beside the archive: batched writes, conditional merges
between replicas, restarts; on file:// and on the S3 server."""

from __future__ import annotations

import json
import time

import pytest

from tiered.errors import BadRequestError, CorruptRecordError
from tiered.replay.offsets import FRESH_MS, GroupOffsets

KEY = "C/B/_replay.offsets/g.json"


def offsets(store) -> GroupOffsets:  # noqa: ANN001
    return GroupOffsets(store, "C", "B", now_ms=lambda: 1234)


def stored(store) -> dict:  # noqa: ANN001
    doc = json.loads(store.get(KEY))
    return {(r["topic"], r["queue_id"]): r["offset"] for r in doc["offsets"]}


def test_commits_are_written_in_one_batch_and_read_after_a_restart(cold_url: str, open_cold) -> None:  # noqa: ANN001
    store = open_cold(cold_url)
    a = offsets(store)
    a.refresh("g")
    assert a.get("g", "T", 0) is None
    for i in range(50):
        a.commit("g", "T", i % 2, i)
    assert store.head(KEY) is None  # nothing written per commit
    assert a.flush() == 1 and a.flush() == 0
    assert stored(store) == {("T", 0): 48, ("T", 1): 49}
    restarted = offsets(store)
    restarted.refresh("g")
    assert restarted.get("g", "T", 1) == 49


def test_two_replicas_keep_each_others_queues_through_a_lost_race(cold_url: str, open_cold) -> None:  # noqa: ANN001
    store, b_store = open_cold(cold_url), open_cold(cold_url)  # two replicas, two clients
    a, b = offsets(store), offsets(b_store)
    a.commit("g", "T", 0, 5)
    a.flush()
    b.commit("g", "T", 1, 7)
    a.commit("g", "T", 2, 9)
    real_get = b_store.get_with_etag
    raced = []

    def get_then_race(key: str):  # noqa: ANN202
        got = real_get(key)
        if not raced:  # a's write lands between b's read and b's conditional write
            raced.append(a.flush())
        return got

    b_store.get_with_etag = get_then_race
    assert b.flush() == 1
    assert raced == [1]
    assert stored(store) == {("T", 0): 5, ("T", 1): 7, ("T", 2): 9}


def test_commits_made_before_the_first_read_win_over_the_stored_ones(cold_url: str, open_cold) -> None:  # noqa: ANN001
    store = open_cold(cold_url)
    first = offsets(store)
    first.commit("g", "T", 0, 3)
    first.commit("g", "T", 1, 4)
    first.flush()
    second = offsets(store)
    second.commit("g", "T", 0, 10)
    second.refresh("g")
    assert (second.get("g", "T", 0), second.get("g", "T", 1)) == (10, 4)


def test_a_failed_flush_keeps_the_commits_and_bad_names_are_refused(tmp_path) -> None:  # noqa: ANN001
    from tiered.archive.storage import open_store

    store = open_store(f"file://{tmp_path}")
    a = offsets(store)
    store.put(KEY, b"{not json")
    a.commit("g", "T", 0, 1)
    with pytest.raises(CorruptRecordError):
        a.flush()
    with pytest.raises(CorruptRecordError):
        offsets(store).refresh("g")
    store.put(KEY, json.dumps({"format_version": 1, "group": "g", "offsets": []}).encode())
    assert a.flush() == 1 and stored(store) == {("T", 0): 1}
    for bad in ("../x", "a/b", "", "x" * 300, "é"):
        with pytest.raises(BadRequestError):
            a.commit(bad, "T", 0, 1)


def test_a_replica_sees_another_replicas_flushed_commits_when_asked_again(cold_url: str, open_cold) -> None:  # noqa: ANN001
    now = [1000]
    a = GroupOffsets(open_cold(cold_url), "C", "B", now_ms=lambda: now[0])
    b = GroupOffsets(open_cold(cold_url), "C", "B", now_ms=lambda: now[0])
    a.commit("g", "T", 0, 5)
    a.flush()
    b.refresh("g")
    assert b.get("g", "T", 0) == 5
    a.commit("g", "T", 0, 9)  # a rebalance moved queue 0 on after a's consumer went on
    a.commit("g", "T", 1, 3)
    a.flush()
    b.commit("g", "T", 2, 7)  # b's own commit, not flushed yet
    b.refresh("g")  # within FRESH_MS of the last read: one read serves the burst
    assert (b.get("g", "T", 0), b.get("g", "T", 1)) == (5, None)
    now[0] += FRESH_MS
    b.refresh("g")
    assert (b.get("g", "T", 0), b.get("g", "T", 1), b.get("g", "T", 2)) == (9, 3, 7)
    b.flush()
    assert stored(a.store) == {("T", 0): 9, ("T", 1): 3, ("T", 2): 7}


def test_a_commit_made_while_a_refresh_reads_is_kept_over_the_older_object(cold_url: str, open_cold) -> None:  # noqa: ANN001
    store = open_cold(cold_url)
    a = offsets(store)
    a.commit("g", "T", 0, 5)
    a.flush()
    real_get = store.get

    def get_then_commit_and_flush(key: str):  # noqa: ANN202
        got = real_get(key)  # the object as it was: offset 5
        a.commit("g", "T", 0, 8)
        a.flush()  # written and cleared before the read's answer is taken
        return got

    store.get = get_then_commit_and_flush
    a.refresh("g")
    assert a.get("g", "T", 0) == 8
    assert stored(store) == {("T", 0): 8}


def test_two_replay_replicas_agree_on_a_groups_offsets(tmp_path) -> None:  # noqa: ANN001
    """Two ``tiered replay`` processes over one archive, as behind one
    Service: a queue committed through one is resumed through the other
    once the first has written it (here at its shutdown), though the other
    had read the group before."""
    from replaykit import Raw, Replay, make_archive

    archived = make_archive(tmp_path)
    q = {"consumerGroup": "replicas-g", "topic": "Orders", "queueId": "0"}
    with Replay(archived.cold_url) as b:
        on_b = Raw(b.address)
        assert on_b.call(14, q).ext["offset"] == "0"  # b read the group: nothing committed yet
        with Replay(archived.cold_url) as a:
            on_a = Raw(a.address)
            assert on_a.call(15, {**q, "commitOffset": "17"}).code == 0
            on_a.close()
        # a wrote its commits as it stopped; b reads the group again when asked
        deadline = time.monotonic() + 30
        while (seen := on_b.call(14, q).ext["offset"]) != "17" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert seen == "17"
        on_b.close()
