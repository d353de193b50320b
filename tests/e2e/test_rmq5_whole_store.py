"""The whole store RocketMQ 5.3.3 wrote (three runs, two restarts; normal,
LMQ and BatchCQ queues), end to end through the CLI: ``inspect`` agrees
with RocketMQ's own read-back on every ConsumeQueue entry; ``dispatch``
archives every queue it archives by default to its end and ``verify``
says so; ``cat`` of each queue gives RocketMQ's records (decompressed
bodies, inner messages); ``restore`` gives a store that reads back the same.
"""

from __future__ import annotations

import base64
import ipaddress
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tiered.cli import app
from tiered.store.localstore import LocalStore

CLUSTER, BROKER = "DevCluster", "broker-dev"
# what the dispatcher leaves out by default, each with its reason in status
# (docs/system-topics.md): waiting copies and broker bookkeeping
EXCLUDED = {"SCHEDULE_TOPIC_XXXX", "rmq_sys_wheel_timer", "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC"}


def run(tmp_path: Path, *args: str) -> tuple[int, str]:
    env = {"TIERED_STATE_DIR": str(tmp_path / "state"), "TIERED_CLUSTER": CLUSTER, "TIERED_BROKER": BROKER,
           "TIERED_LOG__LEVEL": "WARNING"}
    res = CliRunner().invoke(app, list(args), env=env)
    return res.exit_code, res.stdout


def host(text: str) -> str:
    """``ip:port`` in one spelling (RocketMQ prints IPv6 uncompressed)."""
    ip, _, port = text.rpartition(":")
    return f"{ipaddress.ip_address(ip.strip('[]'))}:{port}"


def props(p: dict[str, str]) -> dict[str, str]:
    # RocketMQ's MessageDecoder drops a property whose value is empty
    return {k: v for k, v in p.items() if v != ""}


def record_view(r: dict[str, Any]) -> dict[str, Any]:
    """The fields inspect and RocketMQ's read-back both give, spelt alike."""
    return {"commitlog_offset": r["commitlog_offset"], "size": r.get("size", r.get("store_size")),
            "body_crc": r["body_crc"], "sys_flag": r["sys_flag"], "flag": r["flag"],
            "born_timestamp": r["born_timestamp"], "born_host": host(r["born_host"]),
            "store_timestamp": r["store_timestamp"], "store_host": host(r["store_host"]),
            "reconsume_times": r["reconsume_times"], "prepared_transaction_offset": r["prepared_transaction_offset"],
            "msg_id": r["msg_id"], "tags": r.get("tags"), "keys": r.get("keys") or [],
            "unique_key": r.get("unique_key"), "properties": props(r["properties"])}


def by_queue(rows: list[dict[str, Any]]) -> dict[tuple[str, int], list[dict[str, Any]]]:
    out: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        out[(r["cq_topic"], r["cq_queue_id"])].append(r)
    return out


def shown_body(row: dict[str, Any]) -> bytes:
    """The body ``cat --json --body`` printed (text, or base64 when binary)."""
    if row["body_encoding"] == "utf-8":
        return row["body"].encode("utf-8")
    return base64.b64decode(row["body"])


@pytest.fixture
def archived(rmq5_store: Path, tmp_path: Path) -> str:
    cold = f"file://{tmp_path / 'cold'}"
    code, out = run(tmp_path, "dispatch", "--store", str(rmq5_store), "--cold", cold, "--all")
    assert code == 0, out
    return cold


def test_inspect_agrees_with_rocketmq_on_every_entry(rmq5_store: Path, rmq5_expected: list[dict],
                                                     tmp_path: Path) -> None:
    code, out = run(tmp_path, "inspect", "--store", str(rmq5_store), "--json")
    assert code == 0, out
    rows = [json.loads(line) for line in out.splitlines()]
    # one row per ConsumeQueue entry (a BatchConsumeQueue entry's row lists its
    # inner messages, docs/batchcq.md), in RocketMQ's order: topic, queue, offset
    entries = [e for e in rmq5_expected if e["cq_type"] != "batch"]
    singles = [r for r in rows if r.get("cq_type") != "batch"]
    assert len(singles) == len(entries)
    for row, e in zip(singles, entries):
        assert record_view(row) == record_view(e), (e["cq_topic"], e["cq_queue_id"], e["cq_offset"])
    batches = [r for r in rows if r.get("cq_type") == "batch"]
    want = [e for e in rmq5_expected if e["cq_type"] == "batch"]
    assert [(r["cq_offset"], r["cq_batch_num"], record_view(r)) for r in batches] == [
        (e["cq_offset"], e["cq_batch_num"], record_view(e)) for e in want]
    assert [[(m["queue_offset"], m["msg_id"], m["properties"]) for m in r["inner_messages"]] for r in batches] == [
        [(m["queue_offset"], m["msg_id"], m["properties"]) for m in e.get("inner_messages")
         or [{"queue_offset": e["queue_offset"], "msg_id": e["unique_key"], "properties": e["properties"]}]]
        for e in want]
    assert {e["cq_type"] for e in rmq5_expected} == {"normal", "lmq", "batch"}


def test_every_queue_archived_to_its_end_across_restarts(rmq5_store: Path, rmq5_expected: list[dict],
                                                         archived: str, tmp_path: Path) -> None:
    code, out = run(tmp_path, "status", "--store", str(rmq5_store), "--cold", archived, "--json")
    assert code == 0, out
    rows = {(r["topic"], r["queue_id"]): r for r in map(json.loads, out.splitlines()) if "kind" not in r}
    local = LocalStore(rmq5_store)
    expected = by_queue(rmq5_expected)
    for (topic, qid), entries in expected.items():
        if topic in EXCLUDED:
            assert (topic, qid) not in rows
            continue
        row = rows[(topic, qid)]
        last = entries[-1]
        end = last["cq_offset"] + last["cq_batch_num"]  # a batch entry holds batch_num offsets
        assert (row["archived_next_offset"], row["lag_messages"], row["problem"]) == (end, 0, None), (topic, qid)
    # the records of the last run (after the second restart) are archived too
    assert max(e["commitlog_offset"] for e in rmq5_expected if e["cq_topic"] not in EXCLUDED) > 2860626
    local.close()
    code, out = run(tmp_path, "verify", "--store", str(rmq5_store), "--cold", archived)
    assert code == 0 and out.rstrip().endswith("OK"), out


def test_cat_of_every_queue_is_rocketmq_s_read_back(rmq5_expected: list[dict], archived: str,
                                                    tmp_path: Path) -> None:
    for (topic, qid), entries in by_queue(rmq5_expected).items():
        if topic in EXCLUDED:
            continue
        code, out = run(tmp_path, "cat", "--cold", archived, "--topic", topic, "--queue", str(qid), "--json",
                        "--body")
        assert code == 0, out
        got = [json.loads(line) for line in out.splitlines()]
        want = [(e, inner) for e in entries for inner in (e.get("inner_messages") or [None])]
        assert len(got) == len(want), (topic, qid)
        for g, (e, inner) in zip(got, want):
            body = e.get("body_decompressed_b64", e["body_b64"]) if inner is None else inner["body_b64"]
            assert shown_body(g) == base64.b64decode(body), (topic, qid, e["cq_offset"])
            if inner is None:
                assert record_view(g) == record_view(e)
                assert g.get("cq_offset", g["queue_offset"]) == e["cq_offset"]
            else:
                # RocketMQ's read-back gives an inner message's client id (UNIQ_KEY) as
                # its msg_id; tiered's msg_id is the offset id, the batch record's
                assert (g["queue_offset"], g["unique_key"], g["msg_id"], props(g["properties"])) == (
                    inner["queue_offset"], inner["msg_id"], e["msg_id"], props(inner["properties"]))


def test_restore_reads_back_as_the_original(rmq5_store: Path, rmq5_expected: list[dict], archived: str,
                                            tmp_path: Path) -> None:
    restored = tmp_path / "restored"
    code, out = run(tmp_path, "restore", "--cold", archived, "--to", str(restored), "--commitlog-file-size",
                    str(1 << 20), "--cq-entries", "250", "--index-hash-slots", "1500", "--index-entries", "6000")
    assert code == 0, out
    # every file named by its start, sized as the broker maps it
    for f in (restored / "commitlog").iterdir():
        assert f.stat().st_size == 1 << 20 and int(f.name) % (1 << 20) == 0
    for f in (restored / "consumequeue").glob("*/*/*"):
        assert f.stat().st_size == 5000 and int(f.name) % 5000 == 0, f
    code, out = run(tmp_path, "inspect", "--store", str(restored), "--json")
    assert code == 0, out
    rows = [json.loads(line) for line in out.splitlines()]
    want = [e for e in rmq5_expected if e["cq_topic"] not in EXCLUDED]
    assert len(rows) == len(want)
    for row, e in zip(rows, want):
        # the same record at a new CommitLog offset (and so a new offset id)
        mine, theirs = record_view(row), record_view(e)
        for moved in ("commitlog_offset", "msg_id"):
            mine.pop(moved), theirs.pop(moved)
        assert mine == theirs, (e["cq_topic"], e["cq_queue_id"], e["cq_offset"])
