"""LMQ queues of the RocketMQ 5.3.3 fixture archived and read by their own
queue and offset: dispatch, ls, status, verify, cat, find; and an LMQ entry
pointing past the CommitLog's end stops that queue alone, saying where."""

from __future__ import annotations

import base64
import json
import logging
from pathlib import Path

import pytest
from dispatchkit import new_dispatcher, read_manifest
from lmqkit import LMQ_COUNTS, cli_env, invoke, lmq_lines, point_entry, unconfirmed

from tiered.errors import CorruptRecordError
from tiered.store.localstore import LocalStore

RED = "%LMQ%room-red"


def test_lmq_queues_archived_and_read_by_their_offsets(rmq5_store: Path, rmq5_expected: list[dict], cold_url: str,
                                                        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    store = str(unconfirmed(rmq5_store))
    moto = request.getfixturevalue("moto_endpoint") if cold_url.startswith("s3://") else None
    env = cli_env(tmp_path, cold_url, moto)
    code, _out, err = invoke(env, "dispatch", "--all", "--store", store, "--cold", cold_url)
    assert code == 0, err
    code, out, err = invoke(env, "ls", "--cold", cold_url, "--json", "--topic", "%LMQ%*")
    assert code == 0, err
    assert {(r["topic"], r["queue_id"], r["first_offset"], r["next_offset"]) for r in map(json.loads, out.splitlines())
            } == {(t, 0, 0, n) for t, n in LMQ_COUNTS.items()}
    code, out, err = invoke(env, "status", "--cold", cold_url, "--store", store, "--json", "--topic", "%LMQ%*")
    assert code == 0, err
    rows = {r["topic"]: r for r in map(json.loads, out.splitlines())}
    assert set(rows) == set(LMQ_COUNTS)
    for topic, n in LMQ_COUNTS.items():
        assert (rows[topic]["local_max_offset"], rows[topic]["archived_next_offset"], rows[topic]["lag_messages"],
                rows[topic]["problem"]) == (n, n, 0, None)
    code, out, err = invoke(env, "verify", "--cold", cold_url, "--store", store, "--topic", "%LMQ%*", "--topic",
                            "ChatRoom", "--json")
    assert code == 0, out + err
    report = json.loads(out)
    assert report["records"] == report["compared_locally"] == 35 + sum(LMQ_COUNTS.values())

    want = lmq_lines(rmq5_expected, RED)
    code, out, err = invoke(env, "cat", "--cold", cold_url, "--topic", RED, "--queue", "0", "--json", "--body",
                            "--raw-body")
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert len(rows) == len(want)
    for row, e in zip(rows, want):
        assert (row["cq_topic"], row["cq_queue_id"], row["cq_offset"]) == (RED, 0, e["cq_offset"])
        assert (row["topic"], row["queue_id"], row["queue_offset"]) == (e["topic"], e["queue_id"], e["queue_offset"])
        assert (row["msg_id"], row["commitlog_offset"], row["properties"]) == (e["msg_id"], e["commitlog_offset"],
                                                                             e["properties"])
        body = base64.b64decode(row["body"]) if row["body_encoding"] == "base64" else row["body"].encode()
        assert body == base64.b64decode(e["body_b64"])
    for n in (0, 9, 16):
        code, out, err = invoke(env, "cat", "--cold", cold_url, "--topic", RED, "--queue", "0", "--offset", str(n),
                                "--limit", "1", "--json")
        assert code == 0, err
        assert json.loads(out)["msg_id"] == want[n]["msg_id"]

    # by key: the record once through each queue that holds it
    e = next(x for x in want if x.get("keys"))
    code, out, err = invoke(env, "find", "--cold", cold_url, "--key", e["keys"][0], "--json")
    assert code == 0, err
    hits = [json.loads(line) for line in out.splitlines()]
    lmqs = sorted(t for t in e["properties"]["INNER_MULTI_DISPATCH"].split(","))
    assert sorted(h.get("cq_topic", h["topic"]) for h in hits) == sorted(lmqs + ["ChatRoom"])
    assert {h["msg_id"] for h in hits} == {e["msg_id"]}
    assert next(h for h in hits if h.get("cq_topic") == RED)["cq_offset"] == e["cq_offset"]
    code, out, err = invoke(env, "find", "--cold", cold_url, "--msg-id", e["msg_id"], "--topic", RED, "--json")
    assert code == 0, err
    assert [json.loads(line)["cq_offset"] for line in out.splitlines()] == [e["cq_offset"]]


def test_lmq_entry_past_the_commitlog_end_stops_that_queue_alone(rmq5_store: Path, rmq5_expected: list[dict],
                                                                  tmp_path: Path, clock, recorder, caplog,
                                                                  open_cold) -> None:
    store = unconfirmed(rmq5_store)
    bad = 5
    end = max(e["commitlog_offset"] + e["store_size"] for e in rmq5_expected)
    cq = point_entry(store, RED, bad, end + 4096)
    local = LocalStore(store)
    with pytest.raises(CorruptRecordError) as info:
        list(local.iter_queue(RED, 0, 0))
    err = info.value
    assert (err.source, err.offset) == (str(store / "commitlog" / f"{2097152:020d}"), end + 4096 - 2097152)
    assert "queue offset 5" in err.reason and "past the end of the CommitLog" in err.reason
    assert cq.name == f"{0:020d}"

    cold = open_cold(f"file://{tmp_path / 'cold'}", recorder=recorder)
    d = new_dispatcher(cold, local, tmp_path / "state", clock, recorder=recorder, upload_bytes=1, max_delay_ms=0)
    caplog.set_level(logging.ERROR, logger="tiered.dispatcher")
    result = d.run_round()
    assert f"{RED}/0" in result.errors
    assert read_manifest(cold, RED, 0).next_offset == bad  # stopped exactly at the bad entry
    assert recorder.corrupt[(RED, 0)] == 1
    assert any(f"{RED}/0 stopped at offset {bad}" in r.getMessage() and "past the end" in r.getMessage()
               for r in caplog.records)
    # every other queue, the other LMQ queues and the parent included, archived to its end
    for topic, n in {**LMQ_COUNTS, "ChatRoom": None}.items():
        if topic != RED:
            for qid in local.queue_ids(topic):
                assert read_manifest(cold, topic, qid).next_offset == local.max_offset(topic, qid), topic
    assert read_manifest(cold, "Shipment", 0).next_offset == 911
    # the compiled pass took the 21 other queues, never an LMQ queue (the per-queue read did)
    assert d.archiver.passes and sum(p.queues for p in d.archiver.passes) == 21
    local.close()
