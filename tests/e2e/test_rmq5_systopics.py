"""On the store RocketMQ 5.3.3 wrote: every broker topic in ``status`` with
why it is archived or not, the timer and transaction properties of what is
archived, and whatever in the store tiered does not understand named by
``status`` and counted by the dispatcher."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pyarrow.parquet as pq
from prometheus_client import generate_latest
from typer.testing import CliRunner

from tiered.metrics import PrometheusRecorder
from tiered.cli import app
from tiered.cli.wiring import make_dispatcher
from tiered.config import Settings
from tiered.store.localstore import LocalStore

# the fixture's broker topics with a queue on disk: (archived, what the reason must say)
BROKER_TOPICS = {
    "RMQ_SYS_TRANS_HALF_TOPIC": (False, "transaction half messages: a committed one is archived under its real topic"),
    "RMQ_SYS_TRANS_OP_HALF_TOPIC": (False, "transaction op records"),
    "SCHEDULE_TOPIC_XXXX": (False, "delay-level messages waiting for their time"),
    "rmq_sys_wheel_timer": (False, "timer wheel: timer messages waiting, their roll copies and recall markers"),
}
ORDINARY = ("%DLQ%dev-cg", "%RETRY%dev-cg", "AuditLog", "ChatRoom", "Reminder", "Shipment", "Telemetry")


def env_for(tmp_path: Path) -> dict[str, str]:
    return {"TIERED_STATE_DIR": str(tmp_path / "state"), "TIERED_CLUSTER": "DevCluster",
            "TIERED_BROKER": "broker-dev", "TIERED_LOG__LEVEL": "WARNING"}


def invoke(env: dict[str, str], *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args), env=env)
    return result.exit_code, result.stdout


def status_json(env: dict[str, str], store: Path, cold: str) -> tuple[int, list[dict]]:
    """``status --json`` rows; a first round makes the archive (status of a
    URL with nothing under it is an error)."""
    if not Path(cold.removeprefix("file://")).exists():
        invoke(env, "dispatch", "--all", "--store", str(store), "--cold", cold)
    code, out = invoke(env, "status", "--json", "--store", str(store), "--cold", cold)
    return code, [json.loads(line) for line in out.splitlines()]


def test_status_names_each_broker_topic_with_its_reason(rmq5_store: Path, tmp_path: Path) -> None:
    env, cold = env_for(tmp_path), f"file://{tmp_path / 'cold'}"
    code, rows = status_json(env, rmq5_store, cold)
    assert code == 0, rows
    notes = {r["topic"]: (r["archived"], r["reason"]) for r in rows
             if r.get("kind") == "topic" and not r["topic"].startswith("%LMQ%")}  # LMQ: another change's
    assert set(notes) == set(BROKER_TOPICS)
    for topic, (archived, says) in BROKER_TOPICS.items():
        assert notes[topic][0] is archived and notes[topic][1].startswith(says), topic
    assert [r for r in rows if r.get("kind") == "finding"] == []  # RocketMQ's own store: nothing unknown
    queues = {r["topic"] for r in rows if "kind" not in r}
    assert not queues & set(BROKER_TOPICS) and set(ORDINARY) <= queues

    code, out = invoke(env, "status", "--store", str(rmq5_store), "--cold", cold)
    assert code == 0, out
    assert "EXCLUDED rmq_sys_wheel_timer: timer wheel: timer messages waiting" in out
    assert "EXCLUDED RMQ_SYS_TRANS_HALF_TOPIC: transaction half messages" in out
    assert "UNKNOWN" not in out

    # named in topics.include, the timer wheel is archived, and status says so
    env["TIERED_TOPICS__INCLUDE"] = '["*", "rmq_sys_wheel_timer"]'
    code, rows = status_json(env, rmq5_store, cold)
    assert code == 0, rows
    note = next(r for r in rows if r.get("kind") == "topic" and r["topic"] == "rmq_sys_wheel_timer")
    assert note["archived"] is True and note["reason"].endswith("archived: named in topics.include")
    assert [r["lag_messages"] for r in rows if r.get("topic") == "rmq_sys_wheel_timer" and "kind" not in r] == [51]


def test_cat_shows_timer_and_transaction_properties(rmq5_store: Path, rmq5_expected: list[dict],
                                                   tmp_path: Path) -> None:
    """Shipment 0/384 is a transaction commit, 0/387 and 0/388 delivered timer
    messages (RocketMQ's read-back in expected.jsonl): their properties come out whole."""
    env, cold = env_for(tmp_path), f"file://{tmp_path / 'cold'}"
    code, out = invoke(env, "dispatch", "--once", "--all", "--store", str(rmq5_store), "--cold", cold)
    assert code == 0, out
    code, out = invoke(env, "cat", "--topic", "Shipment", "--queue", "0", "--offset", "384", "--limit", "5",
                       "--json", "--cold", cold)
    assert code == 0, out
    recs = {r["queue_offset"]: r for r in map(json.loads, out.splitlines())}
    commit = recs[384]
    assert commit["sys_flag"] == 8 and commit["prepared_transaction_offset"] == 1730721
    assert commit["properties"] == {
        "CLUSTER": "DevCluster", "KEYS": "TXN-9-a TXN-9-b", "PGROUP": "txn-producer-grp", "REAL_QID": "0",
        "REAL_TOPIC": "Shipment", "TAGS": "txn", "TRAN_MSG": "true",
        "UNIQ_KEY": "FD0000000000000000000000000000020ED95FFD2B270531AB2B073E", "WAIT": "true",
        "__transactionId__": "FD0000000000000000000000000000020ED95FFD2B270531AB2B073E", "txnNo": "T9"}
    assert recs[387]["properties"] == {
        "CLUSTER": "DevCluster", "KEYS": "TMR-0-a", "REAL_QID": "0", "REAL_TOPIC": "Shipment", "TAGS": "timer",
        "TIMER_DELAY_SEC": "2", "TIMER_DEQUEUE_MS": "1796170344036", "TIMER_ENQUEUE_MS": "1796170341000",
        "TIMER_OUT_MS": "1796170343000", "UNIQ_KEY": "FD0000000000000000000000000000020ED95FFD2B270531AB42074D",
        "WAIT": "true", "kind": "delaySec"}
    assert recs[388]["properties"]["TIMER_DELIVER_MS"] == "1796170344937"

    # every timer or transaction record of the topic archived so far, as RocketMQ read it back
    special = {(r["cq_queue_id"], r["cq_offset"]): r["properties"] for r in rmq5_expected
               if r["cq_topic"] == "Shipment" and ("TIMER_OUT_MS" in r["properties"] or r["sys_flag"] & 0x8)}
    assert len(special) == 13 + 9
    seen = 0
    for qid in range(3):
        code, out = invoke(env, "cat", "--topic", "Shipment", "--queue", str(qid), "--json", "--cold", cold)
        assert code == 0, out
        for rec in map(json.loads, out.splitlines()):
            if (qid, rec["queue_offset"]) in special:
                assert rec["properties"] == special[(qid, rec["queue_offset"])], (qid, rec["queue_offset"])
                seen += 1
    assert seen >= 20  # the few past the stale confirm offset wait for another change (issue 30, item 1)

    # the columns Spark reads (the same decoder writes export's Parquet): the same maps, real_topic too
    code, out = invoke(env, "export", "--to", f"file://{tmp_path / 'export'}", "--topic", "Shipment",
                       "--parallelism", "1", "--cold", cold)
    assert code == 0, out
    table = pq.read_table(tmp_path / "export" / "topic=Shipment", columns=["queue_id", "queue_offset", "properties",
                                                                           "real_topic", "sys_flag"])
    rows = {(r["queue_id"], r["queue_offset"]): r for r in table.to_pylist()}
    assert len([k for k in special if k in rows]) == seen
    for key in special.keys() & rows.keys():
        assert dict(rows[key]["properties"]) == special[key], key
        assert rows[key]["real_topic"] == "Shipment"
    assert rows[(0, 384)]["sys_flag"] == 8 and dict(rows[(0, 388)]["properties"])["TIMER_DELIVER_MS"] == "1796170344937"


def set_queue_type(store: Path, topic: str, queue_type: str) -> None:
    path = store / "config" / "topics.json"
    doc = json.loads(path.read_text(encoding="utf-8"))
    doc["topicConfigTable"][topic].setdefault("attributes", {})["queue.type"] = queue_type
    path.write_text(json.dumps(doc), encoding="utf-8")


def test_status_names_what_it_does_not_understand(rmq5_store: Path, tmp_path: Path) -> None:
    env, cold = env_for(tmp_path), f"file://{tmp_path / 'cold'}"
    (rmq5_store / "mystery").mkdir()
    (rmq5_store / "consumequeue" / "stray").write_bytes(b"x")
    (rmq5_store / "consumequeue" / "Shipment" / "0" / "notes.txt").write_bytes(b"x")
    (rmq5_store / "commitlog" / "00000000000003145728").write_bytes(struct.pack(">iI", 100, 0x12345678) + bytes(92))
    set_queue_type(rmq5_store, "Invoice", "FancyCQ")

    code, rows = status_json(env, rmq5_store, cold)
    assert code == 1, rows
    assert [(r["unknown"], r["path"]) for r in rows if r.get("kind") == "finding"] == [
        ("directory", "mystery"),
        ("magic", "commitlog/00000000000003145728"),
        ("file", "consumequeue/Shipment/0/notes.txt"),
        ("file", "consumequeue/stray"),
        ("queue_type", "config/topics.json"),
    ]
    detail = next(r["detail"] for r in rows if r.get("unknown") == "queue_type")
    assert detail == "topic 'Invoice' has queue.type 'FancyCQ' (neither SimpleCQ nor BatchCQ): its queues are not archived"
    assert "Invoice" not in {r["topic"] for r in rows if "kind" not in r}  # not a queue to archive
    assert "Shipment" in {r["topic"] for r in rows if "kind" not in r}

    code, out = invoke(env, "status", "--store", str(rmq5_store), "--cold", cold)
    assert code == 1, out
    assert "UNKNOWN directory mystery: not a directory RocketMQ 5.3.3 writes" in out
    assert ("UNKNOWN magic commitlog/00000000000003145728: magic 0x12345678 at offset 4 is not a RocketMQ "
            "message magic") in " ".join(out.split())


def test_unknown_queue_type_is_counted_and_not_archived(rmq5_store: Path, tmp_path: Path) -> None:
    env, cold = env_for(tmp_path), f"file://{tmp_path / 'cold'}"
    set_queue_type(rmq5_store, "Invoice", "RocksDBCQ")  # a CQType RocketMQ's topic attribute does not allow
    (rmq5_store / "mystery").mkdir()
    settings = Settings(store=rmq5_store, cold_url=cold, state_dir=tmp_path / "state", cluster="DevCluster",
                        broker="broker-dev")
    recorder = PrometheusRecorder()
    with LocalStore(rmq5_store) as local:
        d = make_dispatcher(settings, local, recorder)
        assert not any(t == "Invoice" for t, _ in d.eligible_queues())
        assert {t for t, _ in d.eligible_queues()} >= set(ORDINARY)
        d.run_round()
    exposition = generate_latest(recorder.registry).decode()
    for kind, n in (("directory", 1), ("file", 0), ("magic", 0), ("queue_type", 1)):
        assert f'tiered_store_unknown_layout{{kind="{kind}"}} {n:.1f}' in exposition, kind

    code, out = invoke(env, "dispatch", "--once", "--all", "--store", str(rmq5_store), "--cold", cold)
    assert code == 0, out
    code, rows = status_json(env, rmq5_store, cold)
    assert code == 1, rows
    queues = {(r["topic"], r["queue_id"]): r for r in rows if "kind" not in r}
    assert not any(t == "Invoice" for t, _ in queues)  # neither archived nor watched
    archived = {t for (t, _), r in queues.items() if r["archived_next_offset"]}
    assert set(ORDINARY) <= archived


def test_pristine_fixture_counts_nothing_unknown(rmq5_store: Path, tmp_path: Path) -> None:
    settings = Settings(store=rmq5_store, cold_url=f"file://{tmp_path / 'cold'}", state_dir=tmp_path / "state",
                        cluster="DevCluster", broker="broker-dev")
    recorder = PrometheusRecorder()
    with LocalStore(rmq5_store) as local:
        d = make_dispatcher(settings, local, recorder)
        assert d.layout.current().findings == ()
    exposition = generate_latest(recorder.registry).decode()
    for kind in ("directory", "file", "magic", "queue_type"):
        assert f'tiered_store_unknown_layout{{kind="{kind}"}} 0.0' in exposition, kind
