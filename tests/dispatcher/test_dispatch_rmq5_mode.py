"""The store RocketMQ 5.3.3 wrote, restarted twice in default mode: its
checkpoint's confirm offset (2860053, the start of the last record the
second run's recovery found) is stale and binds nothing, so every queue is
archived to its end; told ``broker_mode: controller``, the same store is
archived up to that offset and status, the metric and verify say it waits
for the cluster to confirm. (LMQ and BatchCQ queues: their own tests.)"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest
from typer.testing import CliRunner

import tiered.cli.archive as cli_archive
from dispatchkit import BROKER, CLUSTER, assert_exact, new_dispatcher, read_manifest
from tiered.dispatcher import TopicFilter
from tiered.metrics import PrometheusRecorder
from tiered.archive.coldtier import ColdTier
from tiered.archive.storage import FileStore
from tiered.cli import app
from tiered.clock import ManualClock
from tiered.ops.status import queue_status
from tiered.ops.verify import PendingCheck, verify
from tiered.store.localstore import LocalStore

CONFIRM = 2860053  # checkpoint byte 32 of the fixture
DATA_END = 3066411
LAST_STORED_MS = 1796170410080
NORMAL = {"Shipment": 3, "Invoice": 5, "Telemetry": 2, "AuditLog": 3, "ChatRoom": 2, "Reminder": 2,
          "%RETRY%dev-cg": 1, "%DLQ%dev-cg": 1,
          "LongTopicV2-" + "zyxwvutsrq" * 15 + "zyxwvutsr": 2}
QUEUES = [(t, q) for t, n in NORMAL.items() for q in range(n)]
ONLY_NORMAL = TopicFilter(include=tuple(NORMAL))


def confirmed_counts(expected: list[dict]) -> dict[tuple[str, int], int]:
    """Per normal queue, how many leading entries end at or before the confirm offset (RocketMQ's read-back)."""
    rows: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for e in expected:
        if e["cq_type"] == "normal" and e["cq_topic"] in NORMAL:
            rows[(e["cq_topic"], e["cq_queue_id"])].append(e)
    out = {}
    for key, entries in rows.items():
        entries.sort(key=lambda e: e["cq_offset"])
        n = 0
        while n < len(entries) and entries[n]["commitlog_offset"] + entries[n]["store_size"] <= CONFIRM:
            n += 1
        out[key] = n
    return out


def dispatch(rmq5_store: Path, tmp_path: Path, mode: str, registry_recorder: PrometheusRecorder | None = None,
             ) -> tuple[FileStore, LocalStore, ManualClock]:
    clock = ManualClock(LAST_STORED_MS + 1000)
    store = FileStore(tmp_path / "cold")
    local = LocalStore(rmq5_store, broker_mode=mode)
    d = new_dispatcher(store, local, tmp_path / "state", clock, upload_bytes=1, max_delay_ms=0,
                       topic_filter=ONLY_NORMAL, recorder=registry_recorder)
    for _ in range(4):  # the four rounds: nothing is left for a later one
        assert d.run_round().ok
    return store, local, clock


def test_default_mode_archives_every_normal_queue_to_its_end(rmq5_store, rmq5_expected, tmp_path):
    with LocalStore(rmq5_store) as local:
        assert (local.root / "checkpoint").read_bytes()[32:40] == CONFIRM.to_bytes(8, "big")
        mode = local.broker_mode()
        assert (mode.mode, mode.confirm_offset) == ("default", None)
    recorder = PrometheusRecorder()
    store, local, _clock = dispatch(rmq5_store, tmp_path, "auto", recorder)
    ends = {(e["cq_topic"], e["cq_queue_id"]): e["cq_offset"] + 1 for e in rmq5_expected if e["cq_type"] == "normal"}
    for topic, qid in QUEUES:
        assert read_manifest(store, topic, qid).next_offset == local.max_offset(topic, qid) == ends[(topic, qid)]
    # past the stale confirm offset, to the last normal record RocketMQ read back
    last_end = max(e["commitlog_offset"] + e["store_size"] for e in rmq5_expected
                   if e["cq_type"] == "normal" and e["cq_topic"] in NORMAL)
    archived_end = max(sum(local.entry_at(t, q, local.max_offset(t, q) - 1)[:2]) for t, q in QUEUES)
    assert archived_end == last_end > CONFIRM and last_end <= DATA_END
    assert_exact(store, local, QUEUES)
    assert recorder.registry.get_sample_value("tiered_broker_confirm_offset_bytes") is None


def test_controller_mode_stops_at_the_confirm_offset_and_says_so(rmq5_store, rmq5_expected, tmp_path):
    recorder = PrometheusRecorder()
    store, local, clock = dispatch(rmq5_store, tmp_path, "controller", recorder)
    counts = confirmed_counts(rmq5_expected)
    held = {k for k in QUEUES if counts[k] < local.max_offset(*k)}
    assert {("Shipment", 0), ("Invoice", 4), ("%RETRY%dev-cg", 0)} <= held and len(held) < len(QUEUES)
    for key in QUEUES:
        m = read_manifest(store, *key)
        assert m.next_offset == counts[key], key
        assert m.segments[-1].cl_end <= CONFIRM
    assert_exact(store, local, QUEUES, complete=False)
    # the metric names the offset the archive waits at
    assert recorder.registry.get_sample_value("tiered_broker_confirm_offset_bytes") == CONFIRM
    # status: a field on the held rows, no problem (waiting for replicas is no fault of the data)
    cold = ColdTier(store, CLUSTER, BROKER)
    rows = {(r.topic, r.queue_id): r for r in queue_status(cold, local, accepts=ONLY_NORMAL.accepts)}
    assert {k for k, r in rows.items() if r.waiting_confirm_offset == CONFIRM} == held
    assert all(rows[k].waiting_confirm_offset is None and rows[k].lag_messages == 0 for k in set(QUEUES) - held)
    assert not any(r.problem for r in rows.values())
    # verify: within the max delay it waits; past it, the held queues fail verify, named with the offset
    young = verify(cold, local, pending=PendingCheck(accepts=ONLY_NORMAL.accepts, max_delay_ms=60_000,
                                                     now_ms=clock.now_ms()))
    assert young.ok and young.pending == {}
    assert young.waiting_confirm == {f"{t}/{q}": CONFIRM for t, q in held}
    clock.advance(3600)
    old = verify(cold, local, pending=PendingCheck(accepts=ONLY_NORMAL.accepts, max_delay_ms=60_000,
                                                   now_ms=clock.now_ms()))
    assert not old.ok and set(old.pending) == {f"{t}/{q}" for t, q in held}
    assert "waiting for the cluster to confirm: confirmed CommitLog offset 2860053, the first record ends at " \
           "2861389" in old.pending["Shipment/0"]
    assert old.pending["Shipment/0"].startswith("78 messages from offset 833 not archived")


def cli_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"TIERED_STATE_DIR": str(tmp_path / "state"), "TIERED_CLUSTER": CLUSTER, "TIERED_BROKER": BROKER,
            "TIERED_LOG__LEVEL": "WARNING", **extra}


def topic_args() -> list[str]:
    return [arg for topic in NORMAL for arg in ("--topic", topic)]


def test_cli_controller_mode_from_config_env_and_flag(rmq5_store, tmp_path, monkeypatch):
    cold = f"file://{tmp_path}/cold"
    runner = CliRunner()
    config = tmp_path / "tiered.yaml"
    config.write_text("broker_mode: controller\n")
    res = runner.invoke(app, ["dispatch", "--config", str(config), "--store", str(rmq5_store), "--cold", cold,
                              "--all", *topic_args()], env=cli_env(tmp_path))
    assert res.exit_code == 0, res.output
    assert "still pending 304" in res.output
    assert ("broker mode controller (broker_mode setting): records ending past the confirmed CommitLog offset "
            "2860053 wait for the cluster") in res.output
    res = runner.invoke(app, ["status", "--store", str(rmq5_store), "--cold", cold, *topic_args()],
                        env=cli_env(tmp_path, TIERED_BROKER_MODE="controller"))
    assert res.exit_code == 0, res.output
    assert ("broker mode controller (broker_mode setting): the cluster has confirmed CommitLog offset 2860053"
            in res.output)
    waiting = "waiting for the cluster to confirm past CommitLog offset 2860053"
    assert waiting in row_of(res.output, "Shipment", 0)
    assert waiting not in row_of(res.output, "AuditLog", 0)
    verify_args = ["verify", "--store", str(rmq5_store), "--cold", cold, "--broker-mode", "controller",
                   *topic_args()]
    monkeypatch.setattr(cli_archive, "CLOCK", ManualClock(LAST_STORED_MS + 10_000))
    res = runner.invoke(app, verify_args, env=cli_env(tmp_path))
    assert res.exit_code == 0, res.output
    assert ("not yet archived, waiting for the cluster to confirm (confirmed CommitLog offset 2860053): "
            "Shipment/0: 78 messages") in res.output
    assert "within the max delay" not in res.output
    monkeypatch.setattr(cli_archive, "CLOCK", ManualClock(LAST_STORED_MS + 120_000))
    res = runner.invoke(app, verify_args, env=cli_env(tmp_path))
    assert res.exit_code == 1, res.output
    assert "NOT ARCHIVED: Shipment/0: 78 messages from offset 833 not archived" in res.output
    assert "waiting for the cluster to confirm" in res.output and "within the max delay" not in res.output
    # the same store in its own (default) mode: archived to the end, verify passes however late
    res = runner.invoke(app, ["dispatch", "--store", str(rmq5_store), "--cold", cold, "--all", *topic_args()],
                        env=cli_env(tmp_path))
    assert res.exit_code == 0 and "nothing pending" in res.output, res.output
    res = runner.invoke(app, ["verify", "--store", str(rmq5_store), "--cold", cold, *topic_args()],
                        env=cli_env(tmp_path))
    assert res.exit_code == 0 and res.output.rstrip().endswith("OK"), res.output


@pytest.mark.parametrize("mode", ["controller"])
def test_cli_status_names_a_zeroed_confirm_offset_as_a_problem(rmq5_store, tmp_path, mode):
    (rmq5_store / "checkpoint").write_bytes((rmq5_store / "checkpoint").read_bytes()[:32] + b"\0" * 8)
    cold = f"file://{tmp_path}/cold"
    args = ["--store", str(rmq5_store), "--cold", cold, "--broker-mode", mode, "--topic", "Shipment"]
    res = CliRunner().invoke(app, ["dispatch", *args, "--all"], env=cli_env(tmp_path))  # archives nothing
    res = CliRunner().invoke(app, ["status", *args], env=cli_env(tmp_path))
    assert res.exit_code == 1, res.output
    row = row_of(res.output, "Shipment", 0)
    assert (f"waits for the cluster to confirm: {rmq5_store / 'checkpoint'} @ 32: the confirm "
            f"offset is 0: the cluster has confirmed nothing, the archive waits") in row
    assert "waiting for the cluster to confirm past CommitLog offset 0" in row


def test_controller_mode_with_a_zeroed_confirm_offset_archives_nothing_and_says_so_once(rmq5_store, tmp_path,
                                                                                       caplog):
    (rmq5_store / "checkpoint").write_bytes((rmq5_store / "checkpoint").read_bytes()[:32] + b"\0" * 8)
    recorder = PrometheusRecorder()
    with caplog.at_level("INFO", logger="tiered.dispatcher.round"):
        store, _local, _clock = dispatch(rmq5_store, tmp_path, "controller", recorder)
    assert all(read_manifest(store, t, q) is None for t, q in QUEUES)
    assert recorder.registry.get_sample_value("tiered_broker_confirm_offset_bytes") == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [f"the archive waits for the cluster to confirm: {rmq5_store / 'checkpoint'} @ 32: the "
                        f"confirm offset is 0: the cluster has confirmed nothing, the archive waits"]
    assert "broker mode controller (broker_mode setting)" in [r.getMessage() for r in caplog.records]


def row_of(output: str, topic: str, queue: int) -> str:
    """The status table's line of one queue (off a terminal a row is one line)."""
    found = [ln for ln in output.splitlines() if ln.split()[:2] == [topic, str(queue)]]
    assert len(found) == 1, output
    return found[0]
