"""``tiered restore``: a store the broker loads as its own, checked against the archive."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from restorekit import BROKER, CL_FILE, CLUSTER, MINUTE, T0, inspect_rows, without_positions
from tiered.cli import app
from tiered.format.codec import BLANK_MAGIC, CQ_ENTRY, CQ_ENTRY_SIZE, CQ_FILLER_SIZE, decode_record
from tiered.store.localstore import LocalStore
from tiered.query.reader import ColdReader
from tiered.ops.restore import RestoreCheckError, RestoreOptions, check, plan_restore, write_store

runner = CliRunner()
CQ_ENTRIES = 40


@pytest.fixture
def env(archived, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto_endpoint)
    return archived


def _restore(env, target: Path, *extra: str):  # noqa: ANN001, ANN202
    return runner.invoke(app, ["restore", "--cold", env.url, "--to", str(target),
                               "--commitlog-file-size", str(CL_FILE), "--cq-entries", str(CQ_ENTRIES), *extra])


def test_round_trip_every_record_kind(env, tmp_path: Path) -> None:
    target = tmp_path / "restored"
    res = _restore(env, target, "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert (out["cluster"], out["broker"]) == (CLUSTER, BROKER)
    assert out["messages"] == out["checked"] == 60 * 4 + 30
    original, restored = inspect_rows(runner, env.root), inspect_rows(runner, target)
    assert len(restored) == len(original) == 270
    assert without_positions(restored) == without_positions(original)
    kinds = {(r["topic"], r["sys_flag"] & 0xC, r["born_host"].startswith("[")) for r in restored}
    assert {("TxOrders", 0x8, False), ("TxOrders", 0xC, False), ("Orders", 0, True), ("Orders", 0, False),
            ("%RETRY%g1", 0, False), ("%DLQ%g1", 0, False)} <= kinds
    # queue offsets preserved, the late queue still starts at 73
    assert out["offsets"]["Late/0"] == [73, 103]
    with LocalStore(target) as local:
        assert local.queue_range("Late", 0).min_offset == 73
        assert local.queue_range("Late", 0).max_offset == 103
    topics = json.loads((target / "config" / "topics.json").read_text())["topicConfigTable"]
    assert sorted(topics) == ["%DLQ%g1", "%RETRY%g1", "Late", "Orders", "TxOrders"]
    assert topics["Orders"]["readQueueNums"] == topics["Orders"]["writeQueueNums"] == 3


def test_broker_load_rules(env, tmp_path: Path) -> None:
    """File names, sizes, fillers and positions as the broker's load and recovery expect them."""
    target = tmp_path / "restored"
    assert _restore(env, target).exit_code == 0
    names = sorted(os.listdir(target / "commitlog"))
    starts = [int(n) for n in names]
    assert len(names) >= 4 and all(len(n) == 20 for n in names)
    assert starts[0] > 0 and starts[0] % CL_FILE == 0
    assert starts == [starts[0] + i * CL_FILE for i in range(len(starts))]
    # the restored log starts past every original position (no offset message id reuse)
    original_end = max(int(n) for n in os.listdir(env.root / "commitlog")) + CL_FILE
    assert starts[0] >= original_end
    position = starts[0]
    for name in names:
        data = (target / "commitlog" / name).read_bytes()
        assert len(data) == CL_FILE
        pos = 0
        while pos < len(data):
            size, magic = int.from_bytes(data[pos:pos + 4], "big"), int.from_bytes(data[pos + 4:pos + 8], "big")
            if size == 0:
                assert name == names[-1] and not any(data[pos:])  # only the last file ends in zeros
                break
            if magic == BLANK_MAGIC:
                assert pos + size == CL_FILE  # the end-of-file filler covers the rest
                break
            rec = decode_record(memoryview(data), pos)
            assert rec.physical_offset == int(name) + pos == position
            position += rec.size
            pos += rec.size
        else:
            raise AssertionError("a full file must end with the filler")
        if name != names[-1]:
            position = int(name) + CL_FILE
    cq_bytes = CQ_ENTRIES * CQ_ENTRY_SIZE
    late = target / "consumequeue" / "Late" / "0"
    files = sorted(os.listdir(late))
    # offset 73 lies in the file starting at entry 40; nothing before it
    assert files[0] == f"{40 * CQ_ENTRY_SIZE:020d}"
    for f in files:
        assert int(f) % cq_bytes == 0 and (late / f).stat().st_size == cq_bytes
    first = (late / files[0]).read_bytes()
    for i in range(73 - 40):
        assert CQ_ENTRY.unpack_from(first, i * CQ_ENTRY_SIZE) == (0, CQ_FILLER_SIZE, 0)
    phys, size, _ = CQ_ENTRY.unpack_from(first, 33 * CQ_ENTRY_SIZE)
    assert phys >= starts[0] and size < CQ_FILLER_SIZE


def test_filtered_subset(env, tmp_path: Path) -> None:
    target = tmp_path / "subset"
    since, until = T0 + 20 * MINUTE, T0 + 39 * MINUTE + 2
    res = _restore(env, target, "--topic", "Orders", "--topic", "%DLQ%g1", "--since", str(since), "--until",
                   str(until), "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    rows = inspect_rows(runner, target)
    # messages i = 20..39 of each topic (the DLQ stores 2 ms later: its i = 39 is just inside), no i = 40
    assert out["messages"] == out["checked"] == len(rows) == 40
    assert {r["topic"] for r in rows} == {"Orders", "%DLQ%g1"}
    assert all(since <= r["store_timestamp"] <= until for r in rows)
    original = [r for r in inspect_rows(runner, env.root)
                if r["topic"] in ("Orders", "%DLQ%g1") and since <= r["store_timestamp"] <= until]
    assert without_positions(rows) == without_positions(original)
    assert out["offsets"]["Orders/2"] == [6, 13] and out["offsets"]["%DLQ%g1/0"] == [20, 40]
    topics = json.loads((target / "config" / "topics.json").read_text())["topicConfigTable"]
    assert sorted(topics) == ["%DLQ%g1", "Orders"]


def test_refuses_non_empty_target(env, tmp_path: Path) -> None:
    target = tmp_path / "busy"
    target.mkdir()
    (target / "commitlog").mkdir()
    (target / "keep.txt").write_bytes(b"operator's file")
    before = sorted((p.relative_to(target), p.stat().st_mtime_ns) for p in target.rglob("*"))
    res = _restore(env, target)
    assert res.exit_code == 1
    assert "not empty" in res.stderr and str(target) in res.stderr
    assert sorted((p.relative_to(target), p.stat().st_mtime_ns) for p in target.rglob("*")) == before
    assert (target / "keep.txt").read_bytes() == b"operator's file"


def test_check_detects_a_changed_record(env, tmp_path: Path) -> None:
    reader = ColdReader(env.store)
    options = RestoreOptions(commitlog_file_size=CL_FILE, cq_entries_per_file=CQ_ENTRIES)
    plan = plan_restore(reader, options)
    target = tmp_path / "restored"
    calls: list[tuple[int, int]] = []
    result = write_store(reader, plan, target, options, progress=lambda n, b: calls.append((n, b)))
    assert plan.messages == result.messages == 270
    assert calls[-1] == (270, result.nbytes) and [n for n, _ in calls] == sorted(n for n, _ in calls)
    assert result.nbytes == sum(r["size"] for r in inspect_rows(runner, env.root))
    assert check(reader, result, target) == 270
    # flip one body byte and fix its CRC so only the comparison can tell
    first = sorted(os.listdir(target / "commitlog"))[0]
    path = target / "commitlog" / first
    data = bytearray(path.read_bytes())
    rec = decode_record(memoryview(bytes(data)), 0)
    body_at = len(rec.raw) - len(bytes(rec.properties_raw)) - 2 - len(bytes(rec.topic_raw)) - 1 - rec.body_length
    data[body_at] ^= 0xFF
    import zlib
    new_crc = zlib.crc32(bytes(data[body_at:body_at + rec.body_length])) & 0x7FFFFFFF
    data[8:12] = new_crc.to_bytes(4, "big")
    path.write_bytes(bytes(data))
    with pytest.raises(RestoreCheckError, match=rf"{rec.topic}/{rec.queue_id}: offset {rec.queue_offset}"):
        check(reader, result, target)


def test_recorded_gap_inside_the_range_becomes_fillers(tmp_path: Path, open_cold, store_writer) -> None:  # noqa: ANN001
    """The broker deleted data before it was archived: the archive records a gap,
    the restore keeps the offsets after it in place with filler entries."""
    from readerkit import archive

    store = open_cold(f"file://{tmp_path / 'cold'}")
    with store_writer(commitlog_file_size=8192, cq_entries_per_file=CQ_ENTRIES) as w:
        root = w.root
        for i in range(10):
            w.put("G", 0, b"x" * 500, store_timestamp=T0 + i, born_timestamp=T0 + i)
    archive(root, store, tmp_path / "state", segment_bytes=4096)
    with store_writer(commitlog_file_size=8192, cq_entries_per_file=CQ_ENTRIES) as w:  # reopened: appends
        for i in range(10, 60):
            w.put("G", 0, b"y" * 500, store_timestamp=T0 + i, born_timestamp=T0 + i)
    for name in sorted(os.listdir(root / "commitlog"))[:3]:  # the broker's retention, before archival
        os.remove(root / "commitlog" / name)
    with LocalStore(root) as local:
        lmin = local.queue_range("G", 0).min_offset
    assert 10 < lmin < 60
    archive(root, store, tmp_path / "state", segment_bytes=4096)
    kept = inspect_rows(runner, root)
    target = tmp_path / "restored"
    res = runner.invoke(app, ["restore", "--cold", f"file://{tmp_path / 'cold'}", "--to", str(target),
                              "--commitlog-file-size", "8192", "--cq-entries", str(CQ_ENTRIES), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["gaps_as_fillers"] == [{"topic": "G", "queue": 0, "from": 10, "to": lmin}]
    assert out["messages"] == out["checked"] == 10 + 60 - lmin
    cq = b"".join((target / "consumequeue" / "G" / "0" / n).read_bytes()
                  for n in sorted(os.listdir(target / "consumequeue" / "G" / "0")))
    entries = [CQ_ENTRY.unpack_from(cq, i * CQ_ENTRY_SIZE) for i in range(60)]
    assert all(e == (0, CQ_FILLER_SIZE, 0) for e in entries[10:lmin])
    assert all(e[1] == kept[0]["size"] and e[0] >= out["commitlog_start"] for e in entries[:10] + entries[lmin:])
    with LocalStore(target) as local:
        after = [it.record.to_dict() for it in local.iter_queue("G", 0, lmin)]
        before = [it.record.to_dict() for it in local.iter_queue("G", 0, 0, max_count=10)]
    assert [r["queue_offset"] for r in before] == list(range(10))
    assert without_positions(after) == without_positions(kept)


@pytest.mark.skipif(__import__("shutil").which("script") is None, reason="util-linux script not installed")
def test_progress_on_a_terminal(env, tmp_path: Path) -> None:
    """On a tty (util-linux ``script`` gives the command one) the bar counts messages to the total."""
    import shlex
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "tiered.cli", "restore", "--cold", env.url, "--to", str(tmp_path / "t"),
           "--commitlog-file-size", str(CL_FILE), "--cq-entries", str(CQ_ENTRIES)]
    out = subprocess.run(["script", "-qec", shlex.join(cmd), "/dev/null"], capture_output=True, text=True,
                         check=False, env={**os.environ, "COLUMNS": "120"})
    assert out.returncode == 0, out.stdout
    assert "270/270" in out.stdout and "restoring" in out.stdout
    plain = _restore(env, tmp_path / "t2")  # not a tty: no bar
    assert plain.exit_code == 0 and "restoring" not in plain.stderr and "270/270" not in plain.output
