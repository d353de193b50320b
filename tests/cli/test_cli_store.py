"""`tiered produce` then `tiered inspect --json`: exact field values, through
Typer's CliRunner and through the installed console script."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dispatchkit import produce_draws
from tiered.cli import app
from tiered.store.localstore import LocalStore

runner = CliRunner()
START = "2024-01-01T00:00:00Z"
START_MS = 1704067200000


def produce(store: Path, *args: str) -> None:
    result = runner.invoke(app, ["produce", "--store", str(store), *args])
    assert result.exit_code == 0, result.output


def inspect_json(store: Path, *args: str) -> list[dict]:
    result = runner.invoke(app, ["inspect", "--store", str(store), "--json", *args])
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


def props_len(props: dict[str, str]) -> int:
    return sum(len(k.encode()) + len(v.encode()) + 2 for k, v in props.items())


def test_produce_then_inspect_exact_fields(tmp_path: Path) -> None:
    store = tmp_path / "s"
    produce(store, "--topic", "T", "--queues", "2", "--messages", "6", "--body-size", "50", "--keys",
            "--tags", "TagA", "--start-time", START, "--interval-ms", "1000",
            "--commitlog-file-size", "4096", "--cq-entries", "4")
    records = inspect_json(store)
    msgs = produce_draws(0, 6, 50)
    # inspect walks queue 0 then queue 1, each in offset order
    order = [0, 2, 4, 1, 3, 5]
    assert [(r["queue_id"], r["queue_offset"]) for r in records] == [(i % 2, i // 2) for i in order]
    offset = 0
    sizes = {}
    for i in range(6):
        props = {"KEYS": f"key-{i}", "TAGS": "TagA", "UNIQ_KEY": msgs[i][0]}
        sizes[i] = (offset, 91 + 50 + 1 + props_len(props))
        offset += sizes[i][1]
    for r, i in zip(records, order):
        uid, body = msgs[i]
        assert r == {
            "topic": "T",
            "queue_id": i % 2,
            "queue_offset": i // 2,
            "commitlog_offset": sizes[i][0],
            "size": sizes[i][1],
            "magic_version": 1,
            "body_crc": zlib.crc32(body) & 0x7FFFFFFF,
            "sys_flag": 0,
            "flag": 0,
            "born_timestamp": START_MS + i * 1000,
            "born_host": "127.0.0.1:50000",
            "store_timestamp": START_MS + i * 1000,
            "store_host": "127.0.0.1:10911",
            "reconsume_times": 0,
            "prepared_transaction_offset": 0,
            "tags": "TagA",
            "keys": [f"key-{i}"],
            "unique_key": uid,
            "msg_id": "7F00000100002A9F" + f"{sizes[i][0]:016X}",
            "properties": {"KEYS": f"key-{i}", "TAGS": "TagA", "UNIQ_KEY": uid},
            "body_length": 50,
        }
    # the bodies on disk are the seeded ones
    with LocalStore(store) as local:
        assert [it.record.body_bytes() for it in local.iter_queue("T", 1, 0)] == [msgs[i][1] for i in (1, 3, 5)]


def test_produce_rolls_small_files(tmp_path: Path) -> None:
    store = tmp_path / "s"
    produce(store, "--topic", "T", "--queues", "1", "--messages", "30", "--body-size", "500",
            "--commitlog-file-size", "4096", "--cq-entries", "4")
    assert len(os.listdir(store / "commitlog")) >= 4
    assert len(os.listdir(store / "consumequeue" / "T" / "0")) == 8
    records = inspect_json(store)
    assert [r["queue_offset"] for r in records] == list(range(30))
    assert all(r["commitlog_offset"] % 4096 + r["size"] <= 4096 - 8 for r in records)
    # a second produce appends: offsets continue
    produce(store, "--topic", "T", "--queues", "1", "--messages", "3", "--body-size", "10", "--seed", "9")
    records = inspect_json(store, "--from", "29")
    assert [(r["queue_offset"], r["body_length"]) for r in records] == [(29, 500), (30, 10), (31, 10), (32, 10)]


def test_inspect_filters(tmp_path: Path) -> None:
    store = tmp_path / "s"
    produce(store, "--topic", "A", "--queues", "3", "--messages", "12", "--body-size", "1")
    produce(store, "--topic", "B", "--queues", "1", "--messages", "2", "--body-size", "1")
    assert {r["topic"] for r in inspect_json(store)} == {"A", "B"}
    assert len(inspect_json(store)) == 14
    assert [(r["topic"], r["queue_id"]) for r in inspect_json(store, "--topic", "B")] == [("B", 0), ("B", 0)]
    got = inspect_json(store, "--topic", "A", "--queue", "2", "--from", "1", "--limit", "2")
    assert [(r["queue_id"], r["queue_offset"]) for r in got] == [(2, 1), (2, 2)]
    assert inspect_json(store, "--topic", "A", "--limit", "0") == []


def test_produce_ipv6(tmp_path: Path) -> None:
    store = tmp_path / "s"
    produce(store, "--topic", "T6", "--queues", "1", "--messages", "2", "--body-size", "8", "--ipv6",
            "--start-time", "1700000000000", "--interval-ms", "5", "--commitlog-file-size", "65536")
    records = inspect_json(store)
    msgs = produce_draws(0, 2, 8)
    size = 91 + 24 + 8 + 2 + props_len({"UNIQ_KEY": msgs[0][0]})
    assert [(r["born_host"], r["store_host"], r["sys_flag"]) for r in records] == [("[::1]:50000", "[::1]:10911", 0x30)] * 2
    assert [r["store_timestamp"] for r in records] == [1700000000000, 1700000000005]
    assert [r["born_timestamp"] for r in records] == [1700000000000, 1700000000005]
    assert [r["size"] for r in records] == [size, size]
    assert [r["commitlog_offset"] for r in records] == [0, size]
    assert records[1]["msg_id"] == "0" * 31 + "1" + "00002A9F" + f"{size:016X}"
    assert [r["keys"] for r in records] == [[], []] and [r["tags"] for r in records] == [None, None]
    assert [r["unique_key"] for r in records] == [m[0] for m in msgs]


def test_produce_delay_level(tmp_path: Path) -> None:
    store = tmp_path / "s"
    produce(store, "--topic", "orders", "--queues", "2", "--messages", "3", "--body-size", "4", "--delay-level", "5",
            "--tags", "X", "--start-time", START, "--interval-ms", "100", "--commitlog-file-size", "65536")
    records = inspect_json(store)
    assert {r["topic"] for r in records} == {"SCHEDULE_TOPIC_XXXX"}
    assert [(r["queue_id"], r["queue_offset"]) for r in records] == [(4, 0), (4, 1), (4, 2)]
    for i, r in enumerate(records):
        assert r["properties"]["DELAY"] == "5"
        assert r["properties"]["REAL_TOPIC"] == "orders"
        assert r["properties"]["REAL_QID"] == str(i % 2)
        assert r["tags"] == "X"
        assert r["store_timestamp"] == START_MS + i * 100
    # the ConsumeQueue tags code is the delivery time: level 5 = 60 s later
    data = (store / "consumequeue" / "SCHEDULE_TOPIC_XXXX" / "4" / f"{0:020d}").read_bytes()
    assert [struct.unpack_from(">q", data, i * 20 + 12)[0] for i in range(3)] == [START_MS + i * 100 + 60_000 for i in range(3)]


def test_produce_retry_and_dlq_topics(tmp_path: Path) -> None:
    store = tmp_path / "s"
    produce(store, "--topic", "%DLQ%grp", "--queues", "1", "--messages", "1", "--body-size", "3",
            "--commitlog-file-size", "65536")
    (r,) = inspect_json(store, "--topic", "%DLQ%grp")
    assert r["topic"] == "%DLQ%grp" and r["properties"]["RECONSUME_TIME"] == "0"


def test_bad_input_exit_codes(tmp_path: Path) -> None:
    result = runner.invoke(app, ["inspect", "--store", str(tmp_path / "nothing")])
    assert result.exit_code == 2 and "not a broker store" in result.stderr
    result = runner.invoke(app, ["produce", "--store", str(tmp_path / "s"), "--topic", "T", "--start-time", "yesterday"])
    assert result.exit_code == 2
    result = runner.invoke(app, ["produce", "--store", str(tmp_path / "s"), "--topic", "T", "--delay-level", "19"])
    assert result.exit_code == 2


def test_inspect_reports_corruption_and_continues(tmp_path: Path) -> None:
    store = tmp_path / "s"
    produce(store, "--topic", "A", "--queues", "1", "--messages", "3", "--body-size", "20",
            "--commitlog-file-size", "65536")
    produce(store, "--topic", "B", "--queues", "1", "--messages", "2", "--body-size", "20")
    first = inspect_json(store, "--topic", "A")
    victim = first[1]
    path = store / "commitlog" / f"{0:020d}"
    with open(path, "r+b") as fh:
        fh.seek(victim["commitlog_offset"] + 88 + 3)  # inside the body
        byte = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([byte[0] ^ 0xFF]))
    result = runner.invoke(app, ["inspect", "--store", str(store), "--json"])
    assert result.exit_code == 1
    lines = [json.loads(x) for x in result.stdout.splitlines()]
    assert [(r["topic"], r["queue_offset"]) for r in lines] == [("A", 0), ("B", 0), ("B", 1)]
    assert "CRC" in result.stderr and str(path) in result.stderr.replace("\n", "")


def test_table_output(tmp_path: Path) -> None:
    store = tmp_path / "s"
    produce(store, "--topic", "T", "--queues", "1", "--messages", "2", "--body-size", "7", "--tags", "tg", "--keys",
            "--start-time", START, "--commitlog-file-size", "65536")
    result = runner.invoke(app, ["inspect", "--store", str(store)])
    assert result.exit_code == 0
    assert "2024-01-01T00:00:00.000Z" in result.stdout and "key-1" in result.stdout and "tg" in result.stdout


def test_console_script_end_to_end(tmp_path: Path) -> None:
    exe = Path(sys.executable).with_name("tiered")
    if not exe.exists():
        pytest.skip("console script not installed next to the interpreter")
    store = tmp_path / "s"
    subprocess.run([str(exe), "produce", "--store", str(store), "--topic", "CS", "--queues", "2", "--messages", "4",
                    "--body-size", "16", "--tags", "TagA", "--keys", "--start-time", START, "--interval-ms", "10",
                    "--commitlog-file-size", "8192", "--cq-entries", "2"], check=True, capture_output=True)
    out = subprocess.run([str(exe), "inspect", "--store", str(store), "--json", "--queue", "1"],
                         check=True, capture_output=True, text=True).stdout
    records = [json.loads(line) for line in out.splitlines()]
    msgs = produce_draws(0, 4, 16)
    assert [(r["queue_offset"], r["keys"], r["unique_key"], r["store_timestamp"]) for r in records] == [
        (0, ["key-1"], msgs[1][0], START_MS + 10), (1, ["key-3"], msgs[3][0], START_MS + 30)]
    assert [r["body_crc"] for r in records] == [zlib.crc32(msgs[i][1]) & 0x7FFFFFFF for i in (1, 3)]
    assert all(r["tags"] == "TagA" and r["magic_version"] == 1 for r in records)


def test_produce_starts_without_the_other_commands_modules(tmp_path: Path) -> None:
    # imports were most of what `tiered produce` cost: it loads its own module
    # alone, and none of the archive's, the dispatcher's or the reader's
    code = ("import sys; from tiered.cli import main\n"
            "try:\n    main()\nexcept SystemExit as exc:\n    assert not exc.code, exc.code\n"
            "heavy = ('dispatcher', 'cleaner', 'metrics', 'boto3', 'tiered.store.localstore', 'tiered.cli.archive')\n"
            "print(sorted(m for m in sys.modules if m.startswith(heavy)))\n"
            "from tiered.cli.app import app\n"
            "print(sorted(c.name or c.callback.__name__ for c in app.registered_commands))\n")
    out = subprocess.run([sys.executable, "-c", code, "produce", "--store", str(tmp_path / "s"), "--topic", "T",
                          "--messages", "3"], check=True, capture_output=True, text=True).stdout.splitlines()
    assert out == ["[]", "['inspect', 'produce']"]
    with LocalStore(tmp_path / "s") as store:
        assert sum(store.queue_range("T", q).count for q in range(4)) == 3


def test_the_app_holds_every_command_and_each_lone_command_its_module(tmp_path: Path) -> None:
    import typer.main

    import tiered.cli as cli

    names = typer.main.get_command(app).list_commands(None)
    assert {"produce", "inspect", "dispatch", "serve", "verify", "clean", "status"} <= set(names)
    for command, module in cli._ALONE.items():
        owner = next(c for c in app.registered_commands if (c.name or c.callback.__name__) == command)
        assert owner.callback.__module__ == f"tiered.cli.{module}"
    # `tiered --debug produce` is the lone command too; anything else loads them all
    assert cli._alone(["--debug", "produce", "--store", "s"]) == "store"
    assert cli._alone(["--version"]) is None and cli._alone(["inspect"]) is None and cli._alone([]) is None
