"""Group offsets beside the archive: batched writes, conditional merges
between replicas, restarts; on file:// and on the S3 server."""

from __future__ import annotations

import json

import pytest

from tiered.errors import BadRequestError, CorruptRecordError
from tiered.replay.offsets import GroupOffsets

KEY = "C/B/_replay.offsets/g.json"


def offsets(store) -> GroupOffsets:  # noqa: ANN001
    return GroupOffsets(store, "C", "B", now_ms=lambda: 1234)


def stored(store) -> dict:  # noqa: ANN001
    doc = json.loads(store.get(KEY))
    return {(r["topic"], r["queue_id"]): r["offset"] for r in doc["offsets"]}


def test_commits_are_written_in_one_batch_and_read_after_a_restart(cold_url: str, open_cold) -> None:  # noqa: ANN001
    store = open_cold(cold_url)
    a = offsets(store)
    a.load("g")
    assert a.get("g", "T", 0) is None
    for i in range(50):
        a.commit("g", "T", i % 2, i)
    assert store.head(KEY) is None  # nothing written per commit
    assert a.flush() == 1 and a.flush() == 0
    assert stored(store) == {("T", 0): 48, ("T", 1): 49}
    restarted = offsets(store)
    restarted.load("g")
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


def test_commits_made_before_the_first_load_win_over_the_stored_ones(cold_url: str, open_cold) -> None:  # noqa: ANN001
    store = open_cold(cold_url)
    first = offsets(store)
    first.commit("g", "T", 0, 3)
    first.commit("g", "T", 1, 4)
    first.flush()
    second = offsets(store)
    second.commit("g", "T", 0, 10)
    second.load("g")
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
        offsets(store).load("g")
    store.put(KEY, json.dumps({"format_version": 1, "group": "g", "offsets": []}).encode())
    assert a.flush() == 1 and stored(store) == {("T", 0): 1}
    for bad in ("../x", "a/b", "", "x" * 300, "é"):
        with pytest.raises(BadRequestError):
            a.commit(bad, "T", 0, 1)
