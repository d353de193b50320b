"""BatchCQ queues of the store RocketMQ 5.3.3 wrote, read as RocketMQ reads
them: every ``batchconsumequeue/`` entry and every inner message equal to
RocketMQ's own read-back (``expected.jsonl``)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from typer.testing import CliRunner

from bcqkit import TOPIC, batch_lines, unconfirmed
from tiered.cli import app
from tiered.format.innerbatch import unwrap
from tiered.store.batchcq import BCQ_ENTRY_SIZE, BatchEntry
from tiered.store.localstore import LocalStore

runner = CliRunner()


def test_entries_read_exactly(rmq5_store: Path, rmq5_expected: list[dict]) -> None:
    lines = batch_lines(rmq5_expected)
    with LocalStore(unconfirmed(rmq5_store)) as local:
        assert local.is_batch(TOPIC) and not local.is_batch("Shipment")
        assert TOPIC in local.topics() and local.queue_ids(TOPIC) == [0, 1, 2]
        got = []
        for qid in (0, 1, 2):
            rng = local.queue_range(TOPIC, qid)
            assert rng.min_offset == 0
            for item in local.iter_queue(TOPIC, qid, rng.min_offset):
                entry = local.batch_entry(TOPIC, qid, item.queue_offset)
                got.append((qid, entry, item.record))
            last = got[-1][1]
            assert local.batch_offset_range(TOPIC, qid).max_offset == last.base_offset + last.batch_size
        assert len(got) == len(lines)
        for (qid, entry, rec), e in zip(got, lines, strict=True):
            assert (qid, entry.base_offset, entry.commitlog_offset, entry.size, entry.tags_code, entry.batch_size) == (
                e["cq_queue_id"], e["cq_offset"], e["commitlog_offset"], e["cq_size"], e["cq_tags_code"],
                e["cq_batch_num"])
            assert (entry.store_timestamp, entry.compacted_offset, entry.reserved) == (e["store_timestamp"], -1, 0)
            assert (rec.queue_offset, rec.size, rec.sys_flag, rec.properties) == (
                e["queue_offset"], e["store_size"], e["sys_flag"], e["properties"])
            assert bytes(rec.body) == base64.b64decode(e["body_b64"])
            inner = unwrap(rec)
            want = e.get("inner_messages") or [{"queue_offset": e["queue_offset"], "flag": e["flag"],
                                                "msg_id": e["unique_key"], "properties": e["properties"],
                                                "body_b64": e["body_b64"]}]
            assert [(m.queue_offset, m.flag, m.msg_id, m.properties, base64.b64encode(m.body).decode())
                    for m in inner] == [(w["queue_offset"], w["flag"], w["msg_id"], w["properties"], w["body_b64"])
                                        for w in want]


def test_entry_layout_is_rocketmqs(rmq5_store: Path) -> None:
    """The 46-byte entry as BatchConsumeQueue.putBatchMessagePositionInfo
    writes it: packing what was read gives the file's bytes back."""
    raw = (rmq5_store / "batchconsumequeue" / TOPIC / "0" / f"{0:020d}").read_bytes()
    assert len(raw) == 30 * BCQ_ENTRY_SIZE
    first = BatchEntry.unpack(raw, 0)
    assert first.pack() == raw[:BCQ_ENTRY_SIZE]
    assert (first.commitlog_offset, first.size, first.base_offset, first.batch_size) == (1679035, 987, 0, 3)
    assert raw[10 * BCQ_ENTRY_SIZE:] == bytes(20 * BCQ_ENTRY_SIZE)  # 10 entries written, zeros after


def test_inspect_agrees_with_rocketmq(rmq5_store: Path, rmq5_expected: list[dict]) -> None:
    lines = batch_lines(rmq5_expected)
    result = runner.invoke(app, ["inspect", "--store", str(unconfirmed(rmq5_store)), "--topic", TOPIC, "--json"])
    assert result.exit_code == 0, result.output
    got = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    assert [(d["queue_id"], d["cq_offset"], d["cq_batch_num"], d["cq_tags_code"], d["commitlog_offset"], d["size"])
            for d in got] == [(e["cq_queue_id"], e["cq_offset"], e["cq_batch_num"], e["cq_tags_code"],
                               e["commitlog_offset"], e["cq_size"]) for e in lines]
    for d, e in zip(got, lines, strict=True):
        assert d["cq_type"] == "batch" and d["queue_offset"] == e["queue_offset"]
        want = e.get("inner_messages")
        if want is None:
            assert [(m["queue_offset"], m["properties"]) for m in d["inner_messages"]] == [
                (e["queue_offset"], e["properties"])]
            continue
        assert [(m["queue_offset"], m["flag"], m["msg_id"], m["properties"], m["body_length"])
                for m in d["inner_messages"]] == [
            (w["queue_offset"], w["flag"], w["msg_id"], w["properties"], len(base64.b64decode(w["body_b64"])))
            for w in want]


def test_inspect_table_offset_is_a_message_offset(rmq5_store: Path) -> None:
    """``--offset 31`` of queue 0 starts at the record holding message 31
    (base 30, two messages); the table has one row per message."""
    result = runner.invoke(app, ["inspect", "--store", str(unconfirmed(rmq5_store)), "--topic", TOPIC,
                                 "--queue", "0", "--offset", "31"])
    assert result.exit_code == 0, result.output
    header, *lines = result.stdout.splitlines()
    at = header.split().index("OFFSET")
    offsets = [int(line.split()[at]) for line in lines]
    assert offsets == [30, 31, 32, 33, 34, 35, 36]
