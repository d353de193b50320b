"""LMQ queues read from the store: RocketMQ's rule for an entry's record, and
``inspect`` over the 5.3.3 fixture's LMQ queues against RocketMQ's own read-back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from lmqkit import LMQ_COUNTS, invoke, lmq_lines, unconfirmed

from tiered.dispatcher.filters import TopicFilter
from tiered.errors import CorruptRecordError
from tiered.format.codec import Message, check_against_entry, decode_record, encode_record, entry_offset
from tiered.format.lmq import is_lmq, lmq_offset, lmq_problem
from tiered.store.localstore import LocalStore

RED = "%LMQ%room-red"
PROPS = {"INNER_MULTI_DISPATCH": "%LMQ%room-red,%LMQ%room-blue", "INNER_MULTI_QUEUE_OFFSET": "7,3"}


def test_lmq_offset_is_the_one_at_the_queue_s_index() -> None:
    assert lmq_offset(PROPS, RED) == 7
    assert lmq_offset(PROPS, "%LMQ%room-blue") == 3
    assert lmq_offset(PROPS, "%LMQ%room-green") is None
    # RocketMQ dispatches nothing when the two lists differ in length
    assert lmq_offset({**PROPS, "INNER_MULTI_QUEUE_OFFSET": "7"}, RED) is None
    assert lmq_offset({**PROPS, "INNER_MULTI_QUEUE_OFFSET": "x,3"}, RED) is None
    assert lmq_offset({"INNER_MULTI_DISPATCH": RED}, RED) is None
    assert is_lmq(RED) and is_lmq(RED.encode()) and not is_lmq("ChatRoom") and not is_lmq(b"%RETRY%g")


def test_lmq_problem_follows_multi_dispatch_lmq_queue() -> None:
    assert lmq_problem(PROPS, 1, topic=RED, queue_id=0, queue_offset=7) is None  # enableLmq: queue 0, any parent queue
    assert "offset 7 != 8" in (lmq_problem(PROPS, 1, topic=RED, queue_id=0, queue_offset=8) or "")
    assert "do not dispatch it" in (lmq_problem(PROPS, 1, topic="%LMQ%other", queue_id=0, queue_offset=7) or "")
    # without enableLmq the broker files it under the parent's queue id
    assert lmq_problem(PROPS, 2, topic=RED, queue_id=2, queue_offset=7) is None
    assert "queue id 1 != 2" in (lmq_problem(PROPS, 1, topic=RED, queue_id=2, queue_offset=7) or "")


def test_check_against_entry_takes_the_lmq_rule_for_lmq_queues() -> None:
    raw = encode_record(Message(topic="ChatRoom", queue_id=1, queue_offset=4, physical_offset=900, body=b"hi",
                                properties=PROPS))
    rec = decode_record(memoryview(raw), 0, "cl")
    check_against_entry(rec, topic=RED.encode(), queue_id=0, queue_offset=7, commitlog_offset=900, size=len(raw))
    assert entry_offset(rec, RED) == 7 and entry_offset(rec, "ChatRoom") == 4
    check_against_entry(rec, topic=b"ChatRoom", queue_id=1, queue_offset=4, commitlog_offset=900, size=len(raw))
    with pytest.raises(CorruptRecordError, match="offset 7 != 6"):
        check_against_entry(rec, topic=RED.encode(), queue_id=0, queue_offset=6, commitlog_offset=900, size=len(raw))
    with pytest.raises(CorruptRecordError, match="topic differs"):  # a normal queue keeps its rule
        check_against_entry(rec, topic=b"Other", queue_id=1, queue_offset=4, commitlog_offset=900, size=len(raw))
    # a record sent to the LMQ topic itself is checked as any queue's
    own = decode_record(memoryview(encode_record(Message(topic=RED, queue_id=0, queue_offset=2, body=b"x"))), 0, "cl")
    check_against_entry(own, topic=RED.encode(), queue_id=0, queue_offset=2, commitlog_offset=0, size=own.size)


def test_lmq_queues_are_not_system_topics() -> None:
    assert TopicFilter().accepts(RED)
    assert not TopicFilter(exclude=("%LMQ%*",)).accepts(RED)


def test_local_read_of_lmq_queues_is_rocketmq_s(rmq5_store: Path, rmq5_expected: list[dict]) -> None:
    store = unconfirmed(rmq5_store)
    with LocalStore(store) as local:
        assert {t for t, _ in local.queues() if is_lmq(t)} == set(LMQ_COUNTS)
        for topic, n in LMQ_COUNTS.items():
            assert local.queue_ids(topic) == [0]
            items = list(local.iter_queue(topic, 0, 0))
            want = lmq_lines(rmq5_expected, topic)
            assert len(items) == n
            for item, e in zip(items, want):
                rec = item.record
                assert (item.queue_offset, item.tags_code) == (e["cq_offset"], e["cq_tags_code"])
                assert (rec.topic, rec.queue_id, rec.queue_offset) == (e["topic"], e["queue_id"], e["queue_offset"])
                assert (rec.physical_offset, rec.size, rec.msg_id) == (e["commitlog_offset"], e["cq_size"],
                                                                      e["msg_id"])
                assert rec.properties == e["properties"]


def test_inspect_of_lmq_queues_agrees_with_rocketmq(rmq5_store: Path, rmq5_expected: list[dict]) -> None:
    store = unconfirmed(rmq5_store)
    code, _out, err = invoke({}, "inspect", "--store", str(store), "--json")
    assert code == 0, err  # once: "topic differs from its ConsumeQueue", exit 1
    for topic in LMQ_COUNTS:
        code, out, err = invoke({}, "inspect", "--store", str(store), "--topic", topic, "--json")
        assert code == 0, err
        rows = [json.loads(line) for line in out.splitlines()]
        want = lmq_lines(rmq5_expected, topic)
        assert len(rows) == len(want)
        for row, e in zip(rows, want):
            # every field both print (the ChatRoom records' hosts are IPv4: the same text in both)
            same = [k for k in row if k in e]
            assert len(same) >= 17
            assert {k: row[k] for k in same} == {k: e[k] for k in same}
            assert (row["size"], row["tags"], row["keys"]) == (e["store_size"], e.get("tags"), e.get("keys", []))
    # the table from an LMQ offset: that entry's record and the one after it
    code, out, _err = invoke({}, "inspect", "--store", str(store), "--topic", "%LMQ%room-blue", "--offset", "13")
    last = lmq_lines(rmq5_expected, "%LMQ%room-blue")[13:]
    lines = out.splitlines()
    assert code == 0 and len(lines) == 3 and lines[0].split()[:3] == ["TOPIC", "QUEUE", "OFFSET"]
    for line, e in zip(lines[1:], last):
        assert "%LMQ%room-blue" in line and str(e["cq_offset"]) in line and str(e["commitlog_offset"]) in line


def test_store_writer_multi_dispatch_read_back(store_writer) -> None:  # noqa: ANN001
    """The writer's LMQ entries as the broker writes them, with and without
    enableLmq (queue 0, or the parent's queue id), read back by the LMQ rule."""
    with store_writer("s") as w:
        for i in range(6):
            w.put_multi("Chat", i % 2, b"m%d" % i, ["%LMQ%a", "%LMQ%b"] if i % 3 == 0 else ["%LMQ%a"], tags="t")
        w.put_multi("Chat", 1, b"off", ["%LMQ%c"], enable_lmq=False)
    topics = json.loads((w.root / "config" / "topics.json").read_text())["topicConfigTable"]
    assert sorted(topics) == ["Chat"]
    with LocalStore(w.root) as local:
        assert sorted(q for q in local.queues() if is_lmq(q[0])) == [("%LMQ%a", 0), ("%LMQ%b", 0), ("%LMQ%c", 1)]
        got = [(i.queue_offset, i.record.queue_id, bytes(i.record.body)) for i in local.iter_queue("%LMQ%a", 0, 0)]
        assert got == [(i, i % 2, b"m%d" % i) for i in range(6)]
        assert [bytes(i.record.body) for i in local.iter_queue("%LMQ%b", 0, 0)] == [b"m0", b"m3"]
        assert [(i.queue_offset, bytes(i.record.body)) for i in local.iter_queue("%LMQ%c", 1, 0)] == [(0, b"off")]
