"""``tiered restore`` of LMQ queues (the RocketMQ 5.3.3 fixture): their
ConsumeQueues point at the restored CommitLog, where each multi-dispatched
record is written once, as the broker wrote it."""

from __future__ import annotations

import json
import os
from pathlib import Path

from lmqkit import LMQ_COUNTS, cli_env, invoke, lmq_lines, unconfirmed

from tiered.format.codec import CQ_ENTRY, CQ_ENTRY_SIZE
from tiered.store.localstore import LocalStore

CL_FILE = 1 << 20  # the fixture's CommitLog and ConsumeQueue file sizes
CQ_ENTRIES = 250
_PHYS_AT = 28  # a record's own physical offset field


def _masked(raw: memoryview | bytes) -> bytes:
    data = bytearray(raw)
    data[_PHYS_AT:_PHYS_AT + 8] = bytes(8)
    return bytes(data)


def _restore(env: dict[str, str], cold: str, target: Path, *extra: str) -> dict:
    code, out, err = invoke(env, "restore", "--cold", cold, "--to", str(target), "--commitlog-file-size",
                            str(CL_FILE), "--cq-entries", str(CQ_ENTRIES), "--json", *extra)
    assert code == 0, err
    return json.loads(out)


def test_restore_writes_lmq_queues_pointing_at_the_parents_records(rmq5_store: Path, rmq5_expected: list[dict],
                                                                   tmp_path: Path) -> None:
    store = unconfirmed(rmq5_store)
    cold = f"file://{tmp_path / 'cold'}"
    env = cli_env(tmp_path)
    code, _out, err = invoke(env, "dispatch", "--all", "--store", str(store), "--cold", cold, "--topic", "ChatRoom",
                             "--topic", "%LMQ%*")
    assert code == 0, err
    target = tmp_path / "restored"
    out = _restore(env, cold, target)
    assert out["messages"] == out["checked"] == 35 + sum(LMQ_COUNTS.values())
    with LocalStore(target) as local, LocalStore(store) as original:
        parents = {}  # restored physical offset of each ChatRoom record, by its original one
        for qid in (0, 1):
            for new, old in zip(local.iter_queue("ChatRoom", qid, 0), original.iter_queue("ChatRoom", qid, 0)):
                parents[old.record.physical_offset] = new.record.physical_offset
        # each record once in the CommitLog: it ends right after the 35 ChatRoom records
        ends = [new + original.read_at(old).size for old, new in parents.items()]
        first = min(int(n) for n in os.listdir(target / "commitlog"))
        assert sorted(parents.values())[0] == first and max(ends) == first + sum(
            original.read_at(old).size for old in parents)
        for topic, n in LMQ_COUNTS.items():
            cq = target / "consumequeue" / topic / "0" / f"{0:020d}"
            assert cq.stat().st_size == CQ_ENTRIES * CQ_ENTRY_SIZE  # the broker's file size
            items = list(local.iter_queue(topic, 0, 0))
            want = lmq_lines(rmq5_expected, topic)
            assert len(items) == n
            for i, (item, e) in enumerate(zip(items, want)):
                phys, size, tags = CQ_ENTRY.unpack_from(cq.read_bytes(), i * CQ_ENTRY_SIZE)
                assert (phys, size, tags) == (parents[e["commitlog_offset"]], e["cq_size"], e["cq_tags_code"])
                assert item.queue_offset == e["cq_offset"]
                assert _masked(item.record.raw) == _masked(original.read_at(e["commitlog_offset"]).raw)
            assert CQ_ENTRY.unpack_from(cq.read_bytes(), n * CQ_ENTRY_SIZE) == (0, 0, 0)  # where recovery stops
    topics = json.loads((target / "config" / "topics.json").read_text())["topicConfigTable"]
    assert sorted(topics) == ["ChatRoom"]  # the broker never lists LMQ queues there

    # an LMQ queue restored alone still gets its records, once each
    alone = tmp_path / "alone"
    out = _restore(env, cold, alone, "--topic", "%LMQ%room-red")
    assert out["messages"] == out["checked"] == LMQ_COUNTS["%LMQ%room-red"]
    with LocalStore(alone) as local:
        phys = [item.record.physical_offset for item in local.iter_queue("%LMQ%room-red", 0, 0)]
    assert len(set(phys)) == len(phys) == LMQ_COUNTS["%LMQ%room-red"]
