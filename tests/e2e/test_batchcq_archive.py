"""BatchCQ queues of the store RocketMQ 5.3.3 wrote, archived and read back:
``dispatch`` + ``verify`` to the queues' end, ``cat`` and ``find`` giving
one row per inner message as RocketMQ's read-back has them, and a
BatchConsumeQueue file cut mid-entry stopping that queue alone."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from typer.testing import CliRunner

from bcqkit import TOPIC, batch_lines, messages_by_queue, run, unconfirmed
from tiered.cli import app
from tiered.store.batchcq import BCQ_ENTRY_SIZE, BatchEntry

runner = CliRunner()


def test_dispatch_and_verify_to_the_end(archived: tuple[Path, str], tmp_path: Path,
                                        rmq5_expected: list[dict]) -> None:
    store, cold = archived
    code, out, err = run(tmp_path, "verify", "--store", str(store), "--cold", cold, "--topic", TOPIC)
    assert code == 0, out + err
    lines = batch_lines(rmq5_expected)
    for qid in (0, 1, 2):
        entries = [e for e in lines if e["cq_queue_id"] == qid]
        manifest = json.loads((tmp_path / "cold" / "DevCluster" / "broker-dev" / TOPIC / str(qid)
                               / "manifest.json").read_text())
        assert manifest["next_offset"] == len(entries)  # one archived record per entry
        segs = manifest["segments"]
        assert (segs[0]["msg_start"], segs[-1]["msg_end"]) == (
            0, entries[-1]["cq_offset"] + entries[-1]["cq_batch_num"])
        obj = next((tmp_path / "cold" / "DevCluster" / "broker-dev" / TOPIC / str(qid) / "segment").iterdir())
        records = obj.read_bytes()[:segs[0]["cl_end"]]
        # byte-identical: the records are the broker's bytes, laid end to end
        raw = b"".join(_commitlog(store, e["commitlog_offset"], e["cq_size"]) for e in entries)
        assert records == raw


def _commitlog(store: Path, offset: int, size: int) -> bytes:
    start = offset // 1048576 * 1048576
    with open(store / "commitlog" / f"{start:020d}", "rb") as fh:
        fh.seek(offset - start)
        return fh.read(size)


def test_cat_gives_each_message_as_rocketmq_reads_it(archived: tuple[Path, str], tmp_path: Path,
                                                    rmq5_expected: list[dict]) -> None:
    _store, cold = archived
    for qid, want in messages_by_queue(rmq5_expected).items():
        code, out, err = run(tmp_path, "cat", "--topic", TOPIC, "--queue", str(qid), "--cold", cold, "--json",
                             "--body")
        assert code == 0, err
        got = [json.loads(line) for line in out.splitlines()]
        assert [(g["queue_offset"], g["flag"], g["unique_key"], g["properties"], g["commitlog_offset"],
                 g["store_timestamp"]) for g in got] == [
            (w["queue_offset"], w["flag"], w["msg_id"], w["properties"], w["commitlog_offset"], w["store_timestamp"])
            for w in want]
        assert [g["body"].encode() if g["body_encoding"] == "utf-8" else base64.b64decode(g["body"])
                for g in got] == [base64.b64decode(w["body_b64"]) for w in want]
        assert len({g["born_host"] for g in got}) >= 1 and all(g["topic"] == TOPIC for g in got)


def test_cat_windows_count_messages(archived: tuple[Path, str], tmp_path: Path) -> None:
    _store, cold = archived

    def offsets(*args: str) -> list[int]:
        code, out, err = run(tmp_path, "cat", "--topic", TOPIC, "--queue", "0", "--cold", cold, "--json", *args)
        assert code == 0, err
        return [json.loads(line)["queue_offset"] for line in out.splitlines()]

    assert offsets("--offset", "7", "--limit", "4") == [7, 8, 9, 10]  # across two batches
    assert offsets("--last", "3") == [34, 35, 36]
    assert offsets("--offset", "36") == [36]
    assert offsets("--offset", "37") == []


def test_find_by_an_inner_key_and_by_offset_id(archived: tuple[Path, str], tmp_path: Path) -> None:
    _store, cold = archived
    code, out, err = run(tmp_path, "find", "--key", "BLK-6-2", "--cold", cold, "--json")
    assert code == 0, err
    assert [(d["queue_id"], d["queue_offset"], d["keys"]) for d in map(json.loads, out.splitlines())] == [
        (0, 11, ["BLK-6-2"])]
    # the broker's offset id names the batch record: each of its messages
    code, out, err = run(tmp_path, "find", "--msg-id", "AC14050900002A9F000000000019BDA1", "--cold", cold, "--json")
    assert code == 0, err
    assert [json.loads(line)["queue_offset"] for line in out.splitlines()] == [9, 10, 11, 12]


def test_a_file_cut_mid_entry_stops_that_queue_alone(rmq5_store: Path, tmp_path: Path) -> None:
    store, cold = unconfirmed(rmq5_store), f"file://{tmp_path}/cold"
    cut = store / "batchconsumequeue" / TOPIC / "1" / f"{0:020d}"
    with open(cut, "r+b") as fh:
        fh.truncate(5 * 46 + 23)  # inside entry 5
    code, _out, err = run(tmp_path, "dispatch", "--all", "--store", str(store), "--cold", cold, "--topic", TOPIC)
    assert f"{cut} @ 230: BatchConsumeQueue file ends inside entry 5 (253 bytes): truncated" in err
    code, out, err = run(tmp_path, "ls", "--cold", cold, "--json")
    # message offsets: queue 1 stops before entry 5, the batch at 25
    assert sorted((r["queue_id"], r["next_offset"]) for r in map(json.loads, out.splitlines())) == [
        (0, 37), (1, 25), (2, 39)]
    code, out, err = run(tmp_path, "status", "--store", str(store), "--cold", cold, "--topic", TOPIC)
    assert code == 1
    assert f"{cut} @ 230: BatchConsumeQueue file ends inside entry 5" in out + err


def test_restore_writes_the_brokers_batchconsumequeue(archived: tuple[Path, str], tmp_path: Path) -> None:
    """Restored entries equal RocketMQ's byte for byte but the CommitLog
    offset, which restore moves (every record goes to a new position) and
    which then points at the same record bytes."""
    store, cold = archived
    target = tmp_path / "restored"
    code, out, err = run(tmp_path, "restore", "--to", str(target), "--cold", cold, "--topic", TOPIC,
                         "--commitlog-file-size", "1048576", "--cq-entries", "250", "--bcq-entries", "30")
    assert code == 0, out + err
    topics = json.loads((target / "config" / "topics.json").read_text())["topicConfigTable"]
    assert topics[TOPIC]["attributes"] == {"queue.type": "BatchCQ"} and topics[TOPIC]["readQueueNums"] == 3
    for qid in (0, 1, 2):
        name = Path("batchconsumequeue") / TOPIC / str(qid) / f"{0:020d}"
        old, new = (store / name).read_bytes(), (target / name).read_bytes()
        assert len(new) == len(old) == 1380
        written = 0
        for at in range(0, len(old), BCQ_ENTRY_SIZE):
            a, b = BatchEntry.unpack(old, at), BatchEntry.unpack(new, at)
            assert b.pack()[8:] == a.pack()[8:]
            if a.written:
                written += 1
                assert _commitlog(target, b.commitlog_offset, b.size)[36:] == \
                    _commitlog(store, a.commitlog_offset, a.size)[36:]
            else:
                assert b.commitlog_offset == 0
        assert written == {0: 10, 1: 8, 2: 8}[qid]
    result = runner.invoke(app, ["inspect", "--store", str(target), "--topic", TOPIC, "--json"])
    again = [m["queue_offset"] for line in result.stdout.splitlines() for m in json.loads(line)["inner_messages"]]
    assert result.exit_code == 0 and len(again) == 111
