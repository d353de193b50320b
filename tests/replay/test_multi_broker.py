"""Several archived brokers in one replay process, each at its own address.

Two brokers archive the same topics with different messages under one
URL; the route names both, each at its own port, and the real C++ client
reads every queue of both and gets exactly each broker's records.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from replaykit import BROKER, CLUSTER, Archived, Raw, Replay, archive, expected, local_raw, make_archive, write
from tiered.archive.storage import open_store
from tiered.replay import protocol as p
from tiered.replay.registry import listen_ports

OTHER = "broker-y"
pytestmark = pytest.mark.timeout(120, method="thread")


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> tuple[Archived, Archived]:
    base = tmp_path_factory.mktemp("multi")
    first = make_archive(base)
    root = base / "store-y"
    write(root, 500, 40)  # other bodies, keys and ids than broker-x's
    archive(root, open_store(first.cold_url), base / "state-y", broker=OTHER)
    return first, Archived(root, first.cold_url, base / "state-y", expected(root))


@pytest.fixture(scope="module")
def both(two: tuple[Archived, Archived]) -> Iterator[Replay]:
    with Replay(two[0].cold_url) as r:
        yield r


def route(address: str, topic: str) -> dict:
    raw = Raw(address)
    try:
        resp = raw.call(p.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
        assert resp.code == p.SUCCESS, resp.remark
        return json.loads(resp.body)
    finally:
        raw.close()


def test_each_archived_broker_is_its_own_broker_at_its_own_address(both: Replay) -> None:
    assert set(both.brokers) == {f"{CLUSTER}/{BROKER}", f"{CLUSTER}/{OTHER}"}
    x, y = both.brokers[f"{CLUSTER}/{BROKER}"], both.brokers[f"{CLUSTER}/{OTHER}"]
    assert x == both.address and y != x
    for at in (x, y):  # every listener answers the route, naming both
        doc = route(at, "Orders")
        assert {(d["brokerName"], d["brokerAddrs"]["0"]) for d in doc["brokerDatas"]} == {(BROKER, x), (OTHER, y)}
        assert {(q["brokerName"], q["readQueueNums"], q["perm"]) for q in doc["queueDatas"]} == \
            {(BROKER, 3, p.PERM_READ), (OTHER, 3, p.PERM_READ)}


def pull_queue(address: str, topic: str, queue_id: int) -> bytes:
    """Every record of a queue, pulled from offset 0 by nextBeginOffset."""
    raw, out, offset = Raw(address), b"", 0
    try:
        while True:
            resp = raw.call(p.PULL_MESSAGE, {"consumerGroup": "multi-raw", "topic": topic, "queueId": str(queue_id),
                                             "queueOffset": str(offset), "maxMsgNums": "32", "sysFlag": "0",
                                             "commitOffset": "0", "suspendTimeoutMillis": "0",
                                             "subscription": "*", "subVersion": "0"})
            if resp.code != p.SUCCESS:
                assert resp.code == p.PULL_NOT_FOUND, resp.remark
                return out
            out += resp.body
            offset = int(resp.ext["nextBeginOffset"])
    finally:
        raw.close()


def test_a_pull_gets_the_records_of_the_broker_at_that_address(two: tuple[Archived, Archived], both: Replay) -> None:
    for one, name in ((two[0], BROKER), (two[1], OTHER)):
        assert pull_queue(both.brokers[f"{CLUSTER}/{name}"], "Audit", 0) == b"".join(local_raw(one.root, "Audit", 0))


def test_the_cpp_client_reads_every_queue_of_both_brokers_exactly(two: tuple[Archived, Archived],
                                                                  both: Replay) -> None:
    rocketmq = pytest.importorskip("rocketmq.client", reason="the RocketMQ C++ client wheel (x86_64 Linux)")

    class PullConsumer(rocketmq.PullConsumer):  # type: ignore[misc,name-defined]
        """The wheel's wrapper keys its offsets by topic and queue id only, so
        queue 0 of the second broker would start where the first one's ended."""

        def _get_mq_key(self, mq) -> str:  # noqa: ANN001
            return f"{mq.topic}@{mq.brokerName}@{mq.queueId}"

    for topic in ("Orders", "Audit"):
        consumer = PullConsumer("multi-pull")
        consumer.offset_table = {}  # the wrapper's table is shared by every instance unless replaced
        consumer.set_namesrv_addr(both.address)
        consumer.start()
        try:
            got = [(m.topic, m.queue_id, m.queue_offset, m.body, m.keys, m.tags, m.id, m.store_timestamp)
                   for m in consumer.pull(topic, "*")]
        finally:
            consumer.shutdown()
        want = [(e.topic, e.queue_id, e.queue_offset, e.body, e.keys.encode(), (e.tags or "").encode(), e.msg_id,
                 e.store_ms) for one in two for key, e in one.messages.items() if key[0] == topic]
        assert len(got) == len(want) == 100
        assert sorted(got) == sorted(want)


def test_cluster_and_broker_narrow_it_to_one(two: tuple[Archived, Archived]) -> None:
    with Replay(two[0].cold_url, "--cluster", CLUSTER, "--broker", OTHER) as r:
        assert set(r.brokers) == {f"{CLUSTER}/{OTHER}"}
        doc = route(r.address, "Audit")
        assert [d["brokerName"] for d in doc["brokerDatas"]] == [OTHER]


def test_listen_ports_are_consecutive_or_all_free() -> None:
    assert listen_ports(9876, 3) == [9876, 9877, 9878]
    assert listen_ports(0, 2) == [0, 0]
    with pytest.raises(ValueError, match="ports up to 65536"):
        listen_ports(65535, 2)
