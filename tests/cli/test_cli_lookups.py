"""The operator's lookups against known records: find --msg-id, cat
--since/--until/--last/--limit/--follow, ls, --topic on status/verify/clean."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from readerkit import BROKER, CLUSTER, T0, archive
from tiered.cli import app
from tiered.cli.lookup import follow
from tiered.query.reader import Archive, ColdReader
from tiered.store.storewriter import StoreWriter
from tiered.timeparse import format_time_ms

MIN = 60_000


@pytest.fixture
def run(archived, moto_endpoint: str, tmp_path: Path):
    env = {"TIERED_S3__ENDPOINT_URL": moto_endpoint, "TIERED_STATE_DIR": str(tmp_path / "cli-state"),
           "TIERED_LOG__LEVEL": "WARNING"}

    def invoke(*args: str, cold: bool = True):
        return CliRunner().invoke(app, [*args, *(("--cold", archived.url) if cold else ())], env=env)

    return invoke


def jlines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def local_record(archived, topic: str, queue: int, offset: int) -> dict:
    item = next(iter(archived.local.iter_queue(topic, queue, offset, max_count=1)))
    return item.record.to_dict()


def test_find_by_offset_msg_id(run, archived) -> None:
    want = local_record(archived, "Orders", 1, 37)
    result = run("find", "--msg-id", want["msg_id"], "--json")
    assert result.exit_code == 0, result.output
    assert jlines(result.stdout) == [want]


def test_find_by_offset_msg_id_of_the_dlq_and_first_record(run, archived) -> None:
    for topic, queue, offset in (("%DLQ%billing", 0, 39), ("Orders", 0, 0)):
        want = local_record(archived, topic, queue, offset)
        result = run("find", "--msg-id", want["msg_id"], "--json")
        assert result.exit_code == 0, result.output
        assert jlines(result.stdout) == [want]


def test_find_by_client_uniq_key(run, archived) -> None:
    result = run("find", "--msg-id", "UNIQOrders00000077", "--json")
    assert result.exit_code == 0, result.output
    (rec,) = jlines(result.stdout)
    assert (rec["topic"], rec["queue_id"], rec["queue_offset"], rec["unique_key"]) == \
        ("Orders", 1, 38, "UNIQOrders00000077")


def test_find_msg_id_not_archived_exit_1(run, archived) -> None:
    want = local_record(archived, "Orders", 1, 37)
    # the same broker, one byte further: no record starts there
    other = want["msg_id"][:-2] + format(int(want["msg_id"][-2:], 16) ^ 1, "02X")
    result = run("find", "--msg-id", other)
    assert result.exit_code == 1 and result.stdout == ""
    assert run("find", "--msg-id", "x", "--key", "y").exit_code == 2


def test_cat_since_until(run) -> None:
    # Orders: message i stored at T0 + i minutes; queue 0 holds i = 0, 2, 4...: offset o is i = 2o
    result = run("cat", "--topic", "Orders", "--queue", "0", "--since", format_time_ms(T0 + 20 * MIN),
                 "--until", str(T0 + 30 * MIN), "--json")
    assert result.exit_code == 0, result.output
    got = jlines(result.stdout)
    assert [r["queue_offset"] for r in got] == [10, 11, 12, 13, 14]
    assert [r["store_timestamp"] for r in got] == [T0 + i * MIN for i in (20, 22, 24, 26, 28)]


def test_cat_last_and_limit(run) -> None:
    result = run("cat", "--topic", "Orders", "--queue", "1", "--last", "3", "--json")
    assert result.exit_code == 0, result.output
    assert [r["queue_offset"] for r in jlines(result.stdout)] == [117, 118, 119]
    result = run("cat", "--topic", "Orders", "--queue", "1", "--offset", "5", "--limit", "2", "--json")
    assert [r["queue_offset"] for r in jlines(result.stdout)] == [5, 6]
    result = run("cat", "--topic", "Orders", "--queue", "1", "--since", str(T0 + 100 * MIN), "--limit", "2", "--json")
    assert [r["queue_offset"] for r in jlines(result.stdout)] == [50, 51]
    result = run("cat", "--topic", "Orders", "--queue", "1", "--offset", "5", "--last", "2")
    assert result.exit_code == 2 and "at most one of --offset, --since, --last" in result.stderr
    result = run("cat", "--topic", "Orders", "--queue", "1", "--since", "yesterday")
    assert result.exit_code == 2 and result.stderr.startswith("tiered: --since: not an ISO 8601 time")


def test_follow_prints_newly_archived_records(archived, tmp_path: Path) -> None:
    reader = ColdReader(archived.store, cluster=CLUSTER, broker=BROKER)
    ref = reader.queue("Orders", 0)
    assert ref is not None
    sleeps = []

    def sleep() -> None:
        sleeps.append(1)
        if len(sleeps) == 1:  # more traffic, archived while cat waits
            with StoreWriter(archived.local.root) as w:
                for i in range(240, 244):
                    w.put("Orders", i % 2, b"late-%d" % i, store_timestamp=T0 + i * MIN, unique_key=f"late{i}")
            archive(archived.local.root, archived.store, tmp_path / "state")

    got = list(follow(reader, ref, 118, sleep=sleep, stop=lambda: len(sleeps) >= 2))
    assert [(r.queue_offset, r.unique_key) for r in got] == [
        (118, "UNIQOrders00000236"), (119, "UNIQOrders00000238"), (120, "late240"), (121, "late242")]
    assert [r.body_bytes() for r in got[2:]] == [b"late-240", b"late-242"]
    assert len(sleeps) == 2


def test_follow_refuses_until(run) -> None:
    result = run("cat", "--topic", "Orders", "--queue", "0", "--follow", "--until", str(T0))
    assert result.exit_code == 2 and "--follow reads to the end" in result.stderr


def test_ls_lists_every_queue_with_ranges(run, archived) -> None:
    result = run("ls", "--json")
    assert result.exit_code == 0, result.output
    rows = jlines(result.stdout)
    a = Archive(archived.store)
    refs = a.queues()
    manifests = a.manifests(refs)
    assert [(r["topic"], r["queue_id"]) for r in rows] == [(ref.topic, ref.queue_id) for ref in refs]
    by = {(r["topic"], r["queue_id"]): r for r in rows}
    assert {k: (r["first_offset"], r["next_offset"]) for k, r in by.items()} == {
        ("Orders", 0): (0, 120), ("Orders", 1): (0, 120), ("%DLQ%billing", 0): (0, 40)}
    assert by[("Orders", 0)]["first_stored"] == format_time_ms(T0)
    assert by[("Orders", 0)]["last_stored"] == format_time_ms(T0 + 238 * MIN)
    assert by[("Orders", 1)]["first_stored"] == format_time_ms(T0 + MIN)
    for ref in refs:
        m = manifests[ref]
        row = by[(ref.topic, ref.queue_id)]
        assert row["bytes"] == sum(s.nbytes for s in m.segments) and row["segments"] == len(m.segments) > 1
        assert (row["cluster"], row["broker"]) == (CLUSTER, BROKER)
    table = run("ls", "--topic", "%DLQ%*")
    assert table.exit_code == 0
    # a table whatever the width, bytes in binary units; --wide (or -o wide) adds the first store time,
    # segments and gaps
    dlq = by[("%DLQ%billing", 0)]
    assert table.stdout.splitlines() == [
        "TOPIC         QUEUE  OFFSETS  LAST STORED                  BYTES",
        f"%DLQ%billing      0  0..40    {dlq['last_stored']}  {dlq['bytes'] / 1024:.1f} KiB"]
    for flag in (["--wide"], ["-o", "wide"]):
        wide = run("ls", "--topic", "%DLQ%*", *flag)
        assert wide.exit_code == 0 and [ln.split() for ln in wide.stdout.splitlines()] == [
            ["TOPIC", "QUEUE", "OFFSETS", "FIRST", "STORED", "LAST", "STORED", "SEGMENTS", "BYTES", "GAPS"],
            ["%DLQ%billing", "0", "0..40", dlq["first_stored"], dlq["last_stored"], str(dlq["segments"]),
             f"{dlq['bytes'] / 1024:.1f}", "KiB", "0"]]
    assert jlines(run("ls", "--topic", "%DLQ%*", "-o", "json").stdout) == [dlq]
    assert run("ls", "-o", "yaml").exit_code == 2


def test_status_topic_filter(run) -> None:
    result = run("status", "--cluster", CLUSTER, "--broker", BROKER, "--topic", "Orders", "--json")
    assert result.exit_code == 0, result.output
    assert [(r["topic"], r["queue_id"]) for r in jlines(result.stdout)] == [("Orders", 0), ("Orders", 1)]


def test_verify_topic_filter(run, archived) -> None:
    result = run("verify", "--store", str(archived.local.root), "--cluster", CLUSTER, "--broker", BROKER,
                 "--topic", "%DLQ%billing", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["queues"], report["records"], report["ok"]) == (1, 40, True)
    full = json.loads(run("verify", "--store", str(archived.local.root), "--cluster", CLUSTER, "--broker", BROKER,
                          "--json").stdout)
    assert (full["queues"], full["records"]) == (3, 280)


def test_clean_topic_filter(run, archived) -> None:
    result = run("clean", "--store", str(archived.local.root), "--cluster", CLUSTER, "--broker", BROKER,
                 "--topic", "Orders", "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    # everything is years past the default 72 h, but only Orders is looked at
    assert sorted((e["topic"], e["queue_id"]) for e in report["expired"]) == [("Orders", 0), ("Orders", 1)]
    assert report["orphan_scan"] is False
