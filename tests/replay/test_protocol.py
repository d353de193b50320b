"""``tiered replay`` answering raw remoting requests, code by code, as the
broker's processors answer them; and bad frames, which close only their
own connection."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator

import pytest

from replaykit import CLUSTER, BROKER, T0, Raw, local_raw
from tiered.replay.frame import MAX_FRAME, ROCKETMQ, Command, encode

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def raw(replay) -> Iterator[Raw]:  # noqa: ANN001
    client = Raw(replay.address)
    yield client
    client.close()


def pull_ext(topic: str = "Orders", queue: int = 0, offset: int = 0, n: int = 32, **more: str) -> dict[str, str]:
    ext = {"consumerGroup": "g", "topic": topic, "queueId": str(queue), "queueOffset": str(offset),
           "maxMsgNums": str(n), "sysFlag": "0", "commitOffset": "0", "suspendTimeoutMillis": "0", "subVersion": "0"}
    return {**ext, **more}


def test_the_route_points_at_replay_itself_read_only(replay, raw) -> None:  # noqa: ANN001
    resp = raw.call(105, {"topic": "Orders"})
    assert resp.code == 0
    assert json.loads(resp.body) == {
        "orderTopicConf": None,
        "queueDatas": [{"brokerName": BROKER, "readQueueNums": 3, "writeQueueNums": 3, "perm": 4, "topicSysFlag": 0}],
        "brokerDatas": [{"cluster": CLUSTER, "brokerName": BROKER, "brokerAddrs": {"0": replay.address},
                         "enableActingMaster": False}],
        "filterServerTable": {}}
    missing = raw.call(105, {"topic": "Nope"})
    assert (missing.code, missing.remark) == (17, "No topic route info in name server for the topic: Nope")


def test_pulls_return_the_stored_bytes_in_order(archived, raw) -> None:  # noqa: ANN001
    for topic, queues in (("Orders", 3), ("Audit", 1)):
        for q in range(queues):
            want = local_raw(archived.root, topic, q)
            got, offset = [], 0
            while True:
                resp = raw.call(11, pull_ext(topic, q, offset, n=7))
                if resp.code != 0:
                    break
                assert resp.remark == "FOUND"
                assert resp.ext["minOffset"] == "0" and resp.ext["maxOffset"] == str(len(want))
                got.append(resp.body)
                offset = int(resp.ext["nextBeginOffset"])
            assert b"".join(got) == b"".join(want)
            assert (resp.code, resp.remark, resp.ext["nextBeginOffset"]) == (19, "OFFSET_OVERFLOW_ONE", str(len(want)))


def test_pull_batch_limits_count_and_bytes(archived, raw) -> None:  # noqa: ANN001
    want = local_raw(archived.root, "Orders", 1)
    one = raw.call(11, pull_ext(queue=1, offset=2, n=1))
    assert one.body == want[2] and one.ext["nextBeginOffset"] == "3"
    capped = raw.call(11, pull_ext(queue=1, offset=2, n=3, maxMsgBytes="1"))  # at least one record
    assert capped.body == want[2] and capped.ext["nextBeginOffset"] == "3"
    many = raw.call(11, pull_ext(queue=1, offset=0, n=100000))
    n = int(many.ext["nextBeginOffset"])
    assert 1 <= n <= 32 and many.body == b"".join(want[:n])


def test_pull_offsets_out_of_range_are_moved_as_the_broker_moves_them(archived, raw) -> None:  # noqa: ANN001
    end = len(local_raw(archived.root, "Orders", 0))
    small = raw.call(11, pull_ext(offset=-4))
    assert (small.code, small.remark, small.ext["nextBeginOffset"]) == (21, "OFFSET_TOO_SMALL", "0")
    badly = raw.call(11, pull_ext(offset=end + 10))
    assert (badly.code, badly.remark, badly.ext["nextBeginOffset"]) == (21, "OFFSET_OVERFLOW_BADLY", str(end))
    assert badly.ext["maxOffset"] == str(end) and badly.body == b""
    held = raw.call(11, pull_ext(offset=end, sysFlag="2", suspendTimeoutMillis="300"))  # held 0.3 s, then answered
    assert (held.code, held.remark) == (19, "OFFSET_OVERFLOW_ONE")


def test_pull_errors(raw) -> None:  # noqa: ANN001
    assert raw.call(11, pull_ext(topic="Nope")).code == 17
    bad_queue = raw.call(11, pull_ext(queue=3))
    assert bad_queue.code == 29 and "queueId[3] is illegal" in bad_queue.remark
    no_offset = {k: v for k, v in pull_ext().items() if k != "queueOffset"}
    missing = raw.call(11, no_offset)
    assert (missing.code, missing.remark) == (1, "the custom field <queueOffset> is null")
    assert raw.call(11, pull_ext(offset="x")).code == 1
    assert raw.call(11, pull_ext(consumerGroup="../etc")).code == 29


def test_consumer_offsets_new_group_update_query_and_pull_commit(raw) -> None:  # noqa: ANN001
    q = {"consumerGroup": "offsets-g", "topic": "Orders", "queueId": "1"}
    fresh = raw.call(14, q)
    assert (fresh.code, fresh.ext["offset"]) == (0, "0")  # the earliest archived offset
    assert raw.call(14, {**q, "setZeroIfNotFound": "false"}).code == 22
    assert raw.call(15, {**q, "commitOffset": "7"}).code == 0
    assert raw.call(14, q).ext["offset"] == "7"
    raw.call(11, pull_ext(queue=1, offset=9, consumerGroup="offsets-g", sysFlag="1", commitOffset="9"))
    assert raw.call(14, q).ext["offset"] == "9"
    # one-way: no answer, but done (the query after it is answered first)
    raw.send(encode(Command(code=15, opaque=999, flag=2, ext={**q, "commitOffset": "11"})))
    assert raw.call(14, q).ext["offset"] == "11"
    assert raw.call(14, {**q, "consumerGroup": "bad/name"}).code == 29


def test_search_offset_by_time_min_max_and_earliest(archived, raw) -> None:  # noqa: ANN001
    # Orders queue 0 holds messages 0, 3, 6 ... stored at T0 + i seconds
    end = len(local_raw(archived.root, "Orders", 0))

    def search(ts: int, boundary: str | None = None) -> int:
        ext = {"topic": "Orders", "queueId": "0", "timestamp": str(ts)}
        resp = raw.call(29, ext if boundary is None else {**ext, "boundaryType": boundary})
        assert resp.code == 0
        return int(resp.ext["offset"])

    assert search(T0 + 3000) == 1 and search(T0 + 3000, "UPPER") == 1
    assert search(T0 + 3500) == 2 and search(T0 + 3500, "lower") == 2 and search(T0 + 3500, "upper") == 1
    assert search(T0 - 1) == 0 and search(T0 - 1, "upper") == 0
    assert search(T0 + 10**9) == end and search(T0 + 10**9, "upper") == end - 1
    assert raw.call(29, {"topic": "Orders", "queueId": "0", "timestamp": "1", "boundaryType": "middle"}).code == 29
    assert raw.call(30, {"topic": "Orders", "queueId": "0"}).ext["offset"] == str(end)
    assert raw.call(31, {"topic": "Orders", "queueId": "0"}).ext["offset"] == "0"
    assert raw.call(32, {"topic": "Orders", "queueId": "1"}).ext["timestamp"] == str(T0 + 1000)
    # as a broker answers for a queue it has no data for
    assert raw.call(30, {"topic": "Nope", "queueId": "0"}).ext["offset"] == "0"
    assert raw.call(32, {"topic": "Nope", "queueId": "0"}).ext["timestamp"] == "-1"


def test_heartbeats_make_the_consumer_list_until_unregistered_or_gone(replay, raw) -> None:  # noqa: ANN001
    beat = {"clientID": "10.0.0.1@1", "producerDataSet": [], "consumerDataSet": [
        {"groupName": "list-g", "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
         "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "subscriptionDataSet": [], "unitMode": False}]}
    assert raw.call(34, body=json.dumps(beat).encode()).code == 0
    other = Raw(replay.address)
    assert other.call(34, body=json.dumps({**beat, "clientID": "10.0.0.2@2"}).encode()).code == 0
    listed = raw.call(38, {"consumerGroup": "list-g"})
    assert json.loads(listed.body) == {"consumerIdList": ["10.0.0.1@1", "10.0.0.2@2"]}
    other.close()
    assert raw.call(30, {"topic": "Orders", "queueId": "0"}).code == 0  # the close is seen by now
    assert json.loads(raw.call(38, {"consumerGroup": "list-g"}).body) == {"consumerIdList": ["10.0.0.1@1"]}
    assert raw.call(35, {"clientID": "10.0.0.1@1", "consumerGroup": "list-g"}).code == 0
    gone = raw.call(38, {"consumerGroup": "list-g"})
    assert (gone.code, gone.remark) == (1, "no consumer for this group, list-g")
    assert raw.call(34, body=b"{not json").code == 1


def test_sends_are_refused_and_other_codes_not_supported(raw) -> None:  # noqa: ANN001
    for code in (10, 310, 320):
        resp = raw.call(code, {"producerGroup": "p", "topic": "Orders", "queueId": "0"}, body=b"hello")
        assert resp.code == 16 and "sending message is forbidden" in resp.remark
    # CONSUMER_SEND_MSG_BACK: refused as a broker without write permission refuses it,
    # once its header decodes (a missing @CFNotNull field is SYSTEM_ERROR, as on the broker)
    back = raw.call(36, {"group": "g", "offset": "1234", "delayLevel": "0", "originMsgId": "X"})
    assert (back.code, back.remark, back.body) == (
        16, f"the broker[{BROKER}] sending message is forbidden: it replays an archive", b"")
    assert raw.call(36, {"group": "g", "offset": "1234", "delayLevel": "0"}, serialize=ROCKETMQ).code == 16
    for missing in ("offset", "group", "delayLevel"):
        ext = {k: v for k, v in {"group": "g", "offset": "1", "delayLevel": "0"}.items() if k != missing}
        bad = raw.call(36, ext)
        assert (bad.code, bad.remark) == (1, f"the custom field <{missing}> is null")
    assert raw.call(36, {"group": "g", "offset": "x", "delayLevel": "0"}).code == 1
    other = raw.call(37, {"group": "g"})  # no handler: the broker's "not supported"
    assert (other.code, other.remark) == (3, " request type 37 not supported")
    # QUERY_ASSIGNMENT: 5.x Java clients fall back to rebalancing themselves
    assert raw.call(400, {"topic": "Orders", "consumerGroup": "g"}).code == 3


def test_a_binary_request_is_answered_in_binary(raw) -> None:  # noqa: ANN001
    resp = raw.call(30, {"topic": "Orders", "queueId": "2"}, serialize=ROCKETMQ)
    assert resp.serialize == ROCKETMQ and resp.code == 0 and int(resp.ext["offset"]) > 0


def _junk_frames() -> list[bytes]:
    return [
        b"GET / HTTP/1.1\r\nHost: replay\r\n\r\n",  # an HTTP client: "GET " reads as a 1.2 GB length
        struct.pack(">i", -1),
        struct.pack(">i", 2**31 - 1),  # a 2 GiB frame
        struct.pack(">i", MAX_FRAME),  # one byte past the cap
        struct.pack(">ii", 8, 1000) + b"{}{}",  # header length past the frame
        struct.pack(">ii", 9, 5) + b"{code",  # broken JSON
    ]


@pytest.mark.parametrize("junk", _junk_frames(), ids=["http", "negative", "2GiB", "over-cap", "header-past",
                                                      "broken-json"])
def test_a_bad_frame_closes_its_connection_and_nothing_else(replay, raw, junk: bytes) -> None:  # noqa: ANN001
    bad = Raw(replay.address)
    bad.send(junk)
    assert bad.closed()
    bad.close()
    assert raw.call(30, {"topic": "Orders", "queueId": "0"}).code == 0


def test_half_a_frame_then_a_closed_socket(replay, raw) -> None:  # noqa: ANN001
    half = Raw(replay.address)
    frame = encode(Command(code=30, opaque=1, ext={"topic": "Orders", "queueId": "0"}))
    half.send(frame[:len(frame) // 2])
    half.close()
    assert raw.call(30, {"topic": "Orders", "queueId": "0"}).code == 0


def test_a_lone_surrogate_in_a_field_is_answered(raw) -> None:  # noqa: ANN001
    from tiered.replay.frame import JSON

    header = b'{"code":11,"opaque":5,"flag":0,"extFields":{"topic":"\\ud800","consumerGroup":"g","queueId":"0",' \
             b'"queueOffset":"0","maxMsgNums":"1","sysFlag":"0"}}'
    raw.send(struct.pack(">ii", 4 + len(header), (JSON << 24) | len(header)) + header)
    resp = raw.read()
    assert resp.opaque == 5 and resp.code == 17 and resp.remark.startswith("topic[\ud800] not exist")
    binary = raw.call(105, {"topic": "\ud800"}, serialize=ROCKETMQ)
    assert binary.code == 17 and binary.remark == "No topic route info in name server for the topic: ?"


def test_lock_and_unlock_batches(raw) -> None:  # noqa: ANN001
    from replaykit import BROKER

    def body(client: str) -> bytes:
        return json.dumps({"consumerGroup": "lock-g", "clientId": client, "onlyThisBroker": False,
                           "mqSet": [{"topic": "Orders", "brokerName": BROKER, "queueId": q} for q in (0, 1)]}).encode()

    first = raw.call(41, body=body("c1"))
    assert first.code == 0
    assert sorted(q["queueId"] for q in json.loads(first.body)["lockOKMQSet"]) == [0, 1]
    assert json.loads(raw.call(41, body=body("c2")).body) == {"lockOKMQSet": []}
    assert raw.call(42, body=body("c1")).code == 0
    assert len(json.loads(raw.call(41, body=body("c2")).body)["lockOKMQSet"]) == 2
    assert raw.call(41, body=b"{").code == 1


def test_hundreds_of_idle_or_half_sent_connections_do_not_stop_the_others(replay, raw) -> None:  # noqa: ANN001
    frame = encode(Command(code=30, opaque=1, ext={"topic": "Orders", "queueId": "0"}))
    idle = [Raw(replay.address) for _ in range(300)]
    for i, conn in enumerate(idle):
        if i % 2:
            conn.send(frame[:len(frame) - 3])  # a frame that never completes
    try:
        assert raw.call(30, {"topic": "Orders", "queueId": "0"}).code == 0
        idle[1].send(frame[len(frame) - 3:])  # completed late: answered
        assert idle[1].read().code == 0
    finally:
        for conn in idle:
            conn.close()
    assert raw.call(31, {"topic": "Orders", "queueId": "0"}).code == 0
