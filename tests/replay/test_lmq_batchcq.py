"""LMQ and BatchCQ queues of the store RocketMQ 5.3.3 wrote, served by
``tiered replay`` as a 5.x broker serves them.

An LMQ queue (``%LMQ%name``, queue 0) answers with its parents' records as
stored (their own topic, queue id and queue offset), offset by offset of
the LMQ queue. A BatchCQ queue counts offsets in messages: a pull returns
whole stored records (an inner batch in full), counts each by its batch
size, and moves ``nextBeginOffset`` by it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from bcqkit import TOPIC as BULK, batch_lines
from lmqkit import LMQ_COUNTS, lmq_lines, unconfirmed
from replaykit import Raw, Replay
from tiered.cli import app
from tiered.replay import protocol as p

RED = "%LMQ%room-red"
pytestmark = pytest.mark.timeout(120, method="thread")


@pytest.fixture(scope="module")
def store(rmq5_unpacked: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    import rmq5

    return unconfirmed(rmq5.copy_store(rmq5_unpacked, tmp_path_factory.mktemp("rmq5-replay")))


@pytest.fixture(scope="module")
def served(store: Path) -> Iterator[Replay]:
    from typer.testing import CliRunner

    cold = f"file://{store.parent / 'cold'}"
    env = {"TIERED_STATE_DIR": str(store.parent / "state"), "TIERED_CLUSTER": "DevCluster",
           "TIERED_BROKER": "broker-dev", "TIERED_LOG__LEVEL": "WARNING"}
    result = CliRunner().invoke(app, ["dispatch", "--all", "--store", str(store), "--cold", cold, "--topic", BULK,
                                      "--topic", "%LMQ%*"], env=env)
    assert result.exit_code == 0, result.output
    with Replay(cold) as r:
        yield r


def commitlog(store: Path, offset: int, size: int) -> bytes:
    start = offset // 1048576 * 1048576
    with open(store / "commitlog" / f"{start:020d}", "rb") as fh:
        fh.seek(offset - start)
        return fh.read(size)


def call(address: str, code: int, **ext: object) -> object:
    raw = Raw(address)
    try:
        return raw.call(code, {k: str(v) for k, v in ext.items()})
    finally:
        raw.close()


def pull(address: str, topic: str, queue_id: int, offset: int, max_nums: int = 32) -> object:
    return call(address, p.PULL_MESSAGE, consumerGroup="lmq-bcq", topic=topic, queueId=queue_id, queueOffset=offset,
                maxMsgNums=max_nums, sysFlag=0, commitOffset=0, suspendTimeoutMillis=0, subscription="*",
                subVersion=0)


# --- LMQ ---------------------------------------------------------------------------------


def test_an_lmq_queue_is_routed_as_one_readable_queue(served: Replay) -> None:
    resp = call(served.address, p.GET_ROUTEINFO_BY_TOPIC, topic=RED)
    assert resp.code == p.SUCCESS
    doc = json.loads(resp.body)
    assert [(q["readQueueNums"], q["perm"]) for q in doc["queueDatas"]] == [(1, p.PERM_READ)]
    assert call(served.address, p.GET_MAX_OFFSET, topic=RED, queueId=0).ext["offset"] == str(LMQ_COUNTS[RED])


def test_an_lmq_pull_gets_the_parents_records_as_stored(served: Replay, store: Path,
                                                        rmq5_expected: list[dict]) -> None:
    lines = lmq_lines(rmq5_expected, RED)
    body, offset, nexts = b"", 0, []
    while True:
        resp = pull(served.address, RED, 0, offset, max_nums=5)
        if resp.code == p.PULL_NOT_FOUND:
            break
        assert resp.code == p.SUCCESS and resp.ext["maxOffset"] == str(len(lines))
        body += resp.body
        offset = int(resp.ext["nextBeginOffset"])
        nexts.append(offset)
    assert nexts == [5, 10, 15, 17]  # LMQ offsets, whatever the parents' offsets are
    assert body == b"".join(commitlog(store, e["commitlog_offset"], e["store_size"]) for e in lines)


def test_the_cpp_client_reads_an_lmq_queue(served: Replay, rmq5_expected: list[dict]) -> None:
    rocketmq = pytest.importorskip("rocketmq.client", reason="the RocketMQ C++ client wheel (x86_64 Linux)")
    consumer = rocketmq.PullConsumer("lmq-cpp")
    consumer.offset_table = {}
    consumer.set_namesrv_addr(served.address)
    consumer.start()
    try:
        got = [(m.topic, m.queue_id, m.queue_offset, m.id, m.store_timestamp) for m in consumer.pull(RED)]
    finally:
        consumer.shutdown()
    # each message as stored: the parent's topic and queue offset (a 5.x broker serves the same bytes)
    want = [(e["topic"].encode() if isinstance(got[0][0], bytes) else e["topic"], 0, e["queue_offset"],
             e["unique_key"], e["store_timestamp"]) for e in lmq_lines(rmq5_expected, RED)]
    assert [g[0] for g in got] == [w[0] for w in want]
    assert [(g[2], g[3], g[4]) for g in got] == [(w[2], w[3], w[4]) for w in want]


# --- BatchCQ -----------------------------------------------------------------------------


def entries(expected: list[dict], qid: int) -> list[dict]:
    return sorted((e for e in batch_lines(expected) if e["cq_queue_id"] == qid), key=lambda e: e["cq_offset"])


def test_batchcq_offsets_count_messages(served: Replay, rmq5_expected: list[dict]) -> None:
    for qid in (0, 1, 2):
        es = entries(rmq5_expected, qid)
        end = es[-1]["cq_offset"] + es[-1]["cq_batch_num"]
        assert call(served.address, p.GET_MIN_OFFSET, topic=BULK, queueId=qid).ext["offset"] == "0"
        assert call(served.address, p.GET_MAX_OFFSET, topic=BULK, queueId=qid).ext["offset"] == str(end)
        first = es[0]["store_timestamp"]
        assert call(served.address, p.GET_EARLIEST_MSG_STORETIME, topic=BULK, queueId=qid).ext["timestamp"] == \
            str(first)


def test_a_batchcq_pull_returns_whole_records_counted_by_batch_size(served: Replay, store: Path,
                                                                   rmq5_expected: list[dict]) -> None:
    es = entries(rmq5_expected, 0)
    batches = [e for e in es if e["cq_batch_num"] > 1]
    inside = batches[1]  # start in the middle of a batch: the whole record comes
    at = inside["cq_offset"] + 1
    resp = pull(served.address, BULK, 0, at, max_nums=1)
    assert resp.code == p.SUCCESS
    assert resp.body == commitlog(store, inside["commitlog_offset"], inside["cq_size"])
    assert resp.ext["nextBeginOffset"] == str(inside["cq_offset"] + inside["cq_batch_num"])
    # from 0, all of queue 0 in pulls of at most 8 messages (a later record only while within 8)
    body, offset, nexts = b"", 0, []
    end = es[-1]["cq_offset"] + es[-1]["cq_batch_num"]
    while offset < end:
        resp = pull(served.address, BULK, 0, offset, max_nums=8)
        assert resp.code == p.SUCCESS
        body += resp.body
        offset = int(resp.ext["nextBeginOffset"])
        nexts.append(offset)
    assert body == b"".join(commitlog(store, e["commitlog_offset"], e["cq_size"]) for e in es)
    want, count, first = [], 0, True
    for e in es:
        if not first and count + e["cq_batch_num"] > 8:
            want.append(e["cq_offset"])
            count, first = 0, True
        count += e["cq_batch_num"]
        first = False
    assert nexts == want + [end]
    assert pull(served.address, BULK, 0, end).code == p.PULL_NOT_FOUND


def test_a_batchcq_time_search_gives_a_message_offset(served: Replay, rmq5_expected: list[dict]) -> None:
    es = entries(rmq5_expected, 0)
    later = next(e for e in es if e["store_timestamp"] > es[0]["store_timestamp"] and e["cq_offset"] > 0)
    resp = call(served.address, p.SEARCH_OFFSET_BY_TIMESTAMP, topic=BULK, queueId=0,
                timestamp=later["store_timestamp"])
    assert resp.ext["offset"] == str(min(e["cq_offset"] for e in es if e["store_timestamp"] >= later["store_timestamp"]))
