"""Consumer positions: config/consumerOffset.json as the broker writes it,
`tiered status` per group and queue, `tiered cat --group` across the
local/archive boundary, the archive-only metric and its alert."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from typer.testing import CliRunner

from restorekit import BROKER, CLUSTER, inspect_rows
from tiered.cli import app
from tiered.store.consumeroffsets import (
    GroupOffset,
    PositionState,
    classify,
    parse_offset_table,
    read_consumer_offsets,
)
from tiered.errors import CorruptRecordError
from tiered.store.localstore import LocalStore

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]

# What the broker's fastjson writer produces: integer map keys unquoted.
BROKER_FORM = b"""{
\t"offsetTable":{
\t\t"Orders@g1":{0:3,1:2,2:20
\t\t},
\t\t"%RETRY%g1@g1":{0:60},
\t\t"Orders@caughtup":{0:20,1:20,2:20}
\t}
}"""
QUOTED_FORM = b'{"offsetTable": {"Orders@g1": {"0": 3, "1": 2, "2": 20}, "%RETRY%g1@g1": {"0": 60}, ' \
              b'"Orders@caughtup": {"0": 20, "1": 20, "2": 20}}}'
EXPECTED = (
    GroupOffset(group="caughtup", topic="Orders", queue_id=0, offset=20),
    GroupOffset(group="caughtup", topic="Orders", queue_id=1, offset=20),
    GroupOffset(group="caughtup", topic="Orders", queue_id=2, offset=20),
    GroupOffset(group="g1", topic="%RETRY%g1", queue_id=0, offset=60),
    GroupOffset(group="g1", topic="Orders", queue_id=0, offset=3),
    GroupOffset(group="g1", topic="Orders", queue_id=1, offset=2),
    GroupOffset(group="g1", topic="Orders", queue_id=2, offset=20),
)


# -- the file -------------------------------------------------------------------


@pytest.mark.parametrize("data", [BROKER_FORM, QUOTED_FORM], ids=["unquoted", "quoted"])
def test_both_key_forms(data: bytes) -> None:
    assert parse_offset_table(data, "consumerOffset.json") == EXPECTED


def test_unquoted_digits_inside_strings_stay_as_they_are() -> None:
    data = b'{"offsetTable":{"T1@g-{1:2}":{0:5}},"note":"a,{7:8}"}'
    assert parse_offset_table(data, "x") == (GroupOffset(group="g-{1:2}", topic="T1", queue_id=0, offset=5),)


@pytest.mark.parametrize("main", [None, b"", b"  \n", b'{"offsetTable":{"Orders@g1":{0:3,'],
                         ids=["missing", "empty", "blank", "corrupt"])
def test_bak_fallback_with_a_warning_naming_both_files(tmp_path: Path, main: bytes | None,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    config = tmp_path / "config"
    config.mkdir()
    if main is not None:
        (config / "consumerOffset.json").write_bytes(main)
    (config / "consumerOffset.json.bak").write_bytes(BROKER_FORM)
    with caplog.at_level(logging.WARNING, logger="tiered.store.consumeroffsets"):
        got = read_consumer_offsets(config)
    assert got.offsets == EXPECTED and got.from_backup and got.source == config / "consumerOffset.json.bak"
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert str(config / "consumerOffset.json") in warning.getMessage()
    assert str(config / "consumerOffset.json.bak") in warning.getMessage()


def test_main_file_preferred_and_silent(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = tmp_path / "config"
    config.mkdir()
    (config / "consumerOffset.json").write_bytes(BROKER_FORM)
    (config / "consumerOffset.json.bak").write_bytes(b'{"offsetTable":{"Orders@g1":{0:1}}}')
    with caplog.at_level(logging.WARNING):
        got = read_consumer_offsets(config)
    assert got.offsets == EXPECTED and not got.from_backup and not caplog.records


def test_neither_file_usable_is_an_error_naming_them(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.mkdir()
    assert read_consumer_offsets(config).offsets == ()  # none at all: no committed offsets yet
    (config / "consumerOffset.json").write_bytes(b"{garbage")
    with pytest.raises(CorruptRecordError, match="no consumerOffset.json.bak to fall back on") as exc:
        read_consumer_offsets(config)
    assert exc.value.source == str(config / "consumerOffset.json")
    (config / "consumerOffset.json.bak").write_bytes(b'{"offsetTable": 5}')
    with pytest.raises(CorruptRecordError, match=r"the backup .*consumerOffset.json.bak too"):
        read_consumer_offsets(config)


def test_classify() -> None:
    assert classify(10, (10, 20), (0, 20)) is PositionState.LOCAL
    assert classify(25, (10, 20), (0, 20)) is PositionState.LOCAL  # ahead: the broker corrects it down
    assert classify(9, (10, 20), (0, 20)) is PositionState.ARCHIVE_ONLY
    assert classify(0, (10, 20), (0, 20)) is PositionState.ARCHIVE_ONLY
    assert classify(3, (10, 20), (5, 20)) is PositionState.LOST
    assert classify(8, (10, 20), (0, 6)) is PositionState.LOST
    assert classify(3, (10, 20), None) is PositionState.LOST
    assert classify(3, None, (0, 20)) is PositionState.ARCHIVE_ONLY
    assert classify(20, None, (0, 20)) is PositionState.UNKNOWN
    assert classify(3, None, None) is PositionState.UNKNOWN


# -- against a store whose broker deleted its oldest CommitLog file -----------------------


@pytest.fixture
def aged(archived, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """The archived every-kind store after the broker's retention removed its
    first CommitLog file, with g1 committed below the new local minimum."""
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto_endpoint)
    archived.original = inspect_rows(runner, archived.root)
    os.remove(archived.root / "commitlog" / f"{0:020d}")
    (archived.root / "config" / "consumerOffset.json").write_bytes(BROKER_FORM)
    return archived


def test_status_per_group_and_queue(aged) -> None:
    with LocalStore(aged.root) as local:
        mins = {q: local.queue_range("Orders", q).min_offset for q in range(3)}
    assert mins == {0: 7, 1: 7, 2: 6}  # the deleted file held the first 6-7 of each queue
    res = runner.invoke(app, ["status", "--store", str(aged.root), "--cold", aged.url, "--cluster", CLUSTER,
                              "--broker", BROKER, "--json"])
    rows = [json.loads(line) for line in res.stdout.splitlines()]
    consumers = {(r["group"], r["topic"], r["queue_id"]): r for r in rows if r.get("kind") == "consumer"}
    assert len(consumers) == 7
    g1 = consumers[("g1", "Orders", 0)]
    assert (g1["committed_offset"], g1["local_min_offset"], g1["local_max_offset"], g1["archived_first_offset"],
            g1["archived_next_offset"], g1["state"]) == (3, mins[0], 20, 0, 20, "archive_only")
    assert consumers[("g1", "Orders", 1)]["state"] == "archive_only"
    assert consumers[("g1", "Orders", 2)]["state"] == "local"
    assert consumers[("caughtup", "Orders", 1)]["state"] == "local"
    assert consumers[("g1", "%RETRY%g1", 0)]["state"] == "local"
    table = runner.invoke(app, ["status", "--store", str(aged.root), "--cold", aged.url, "--cluster", CLUSTER,
                                "--broker", BROKER])
    assert "consumer positions" in table.stdout and f"archive_only ({mins[0] - 3} behind local)" in table.stdout


def test_cat_group_reads_archive_then_local(aged) -> None:
    res = runner.invoke(app, ["cat", "--group", "g1", "--topic", "Orders", "--store", str(aged.root),
                              "--cold", aged.url, "--json"])
    assert res.exit_code == 0, res.output
    got = [json.loads(line) for line in res.stdout.splitlines()]
    committed = {0: 3, 1: 2, 2: 20}
    want = [r for q in range(3) for r in aged.original
            if r["topic"] == "Orders" and r["queue_id"] == q and r["queue_offset"] >= committed[q]]
    assert [(r["queue_id"], r["queue_offset"]) for r in got] == [(r["queue_id"], r["queue_offset"]) for r in want]
    assert [(r["unique_key"], r["body_crc"], r["store_timestamp"]) for r in got] == \
        [(r["unique_key"], r["body_crc"], r["store_timestamp"]) for r in want]
    # queue 0 crossed the boundary: some records came from the archive, the rest from local disk
    with LocalStore(aged.root) as local:
        lmin = local.queue_range("Orders", 0).min_offset
    q0 = [r["queue_offset"] for r in got if r["queue_id"] == 0]
    assert q0[0] == 3 < lmin <= q0[-1] == 19 and q0 == list(range(3, 20))
    limited = runner.invoke(app, ["cat", "--group", "g1", "--topic", "Orders", "--queue", "1", "--count", "2",
                                  "--store", str(aged.root), "--cold", aged.url, "--json"])
    assert [json.loads(line)["queue_offset"] for line in limited.stdout.splitlines()] == [2, 3]
    unknown = runner.invoke(app, ["cat", "--group", "nobody", "--topic", "Orders", "--store", str(aged.root),
                                  "--cold", aged.url])
    assert unknown.exit_code == 1 and "group 'nobody' has no committed offset for Orders" in unknown.stderr
    no_store = runner.invoke(app, ["cat", "--group", "g1", "--topic", "Orders", "--cold", aged.url])
    assert no_store.exit_code == 2 and "give --store" in no_store.stderr


def test_metric_from_the_sidecar(aged, tmp_path: Path) -> None:
    from tiered.cli.serve import Sidecar
    from tiered.config import load_settings

    settings = load_settings(None, store=aged.root, cold_url=aged.url, cluster=CLUSTER, broker=BROKER,
                             state_dir=tmp_path / "sidecar-state")
    registry = CollectorRegistry()
    sidecar = Sidecar(settings, registry=registry)
    sidecar.dispatch_round()  # loads the manifests as serve does
    text = generate_latest(registry).decode()
    samples = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("tiered_consumer_offset_in_archive_only{")}
    assert samples == {
        'tiered_consumer_offset_in_archive_only{group="g1",queue="0",topic="Orders"}': 1.0,
        'tiered_consumer_offset_in_archive_only{group="g1",queue="1",topic="Orders"}': 1.0,
        'tiered_consumer_offset_in_archive_only{group="g1",queue="2",topic="Orders"}': 0.0,
        'tiered_consumer_offset_in_archive_only{group="g1",queue="0",topic="%RETRY%g1"}': 0.0,
        'tiered_consumer_offset_in_archive_only{group="caughtup",queue="0",topic="Orders"}': 0.0,
        'tiered_consumer_offset_in_archive_only{group="caughtup",queue="1",topic="Orders"}': 0.0,
        'tiered_consumer_offset_in_archive_only{group="caughtup",queue="2",topic="Orders"}': 0.0,
    }
    # a corrupt file and no backup: the samples are absent and the error is counted
    (aged.root / "config" / "consumerOffset.json").write_bytes(b"{torn")
    text = generate_latest(registry).decode()
    assert "tiered_consumer_offset_in_archive_only{" not in text
    assert "tiered_consumer_offset_read_errors_total 1.0" in text


def test_alert_rule_names_the_metric() -> None:
    doc = yaml.safe_load((ROOT / "metrics" / "alerts.yaml").read_text())
    group = doc["groups"][-1]
    assert group["name"] == "tiered-consumers"
    [rule] = group["rules"]
    assert rule["alert"] == "TieredConsumerArchiveOnly"
    assert "tiered_consumer_offset_in_archive_only" in rule["expr"]
