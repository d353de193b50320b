"""The real RocketMQ C++ client (PyPI ``rocketmq``) against ``tiered replay``.

A hung client must fail the test, not hang CI: the thread timeout ends the
run even when the client is stuck in C code.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from replaykit import Archived, make_archive, CLUSTER, BROKER, Raw, Replay, archive, expected, free_port, write
from tiered.archive.storage import open_store
from tiered.format.codec import Host

rocketmq = pytest.importorskip("rocketmq.client", reason="the RocketMQ C++ client wheel (x86_64 Linux)")

pytestmark = pytest.mark.timeout(120, method="thread")


def pull_all(address: str, group: str, topic: str, expression: str = "*") -> list:  # noqa: ANN401
    consumer = rocketmq.PullConsumer(group)
    consumer.offset_table = {}  # the wrapper's table is shared by every instance unless replaced
    consumer.set_namesrv_addr(address)
    consumer.start()
    try:
        return [(m.topic, m.queue_id, m.queue_offset, m.body, m.keys, m.tags, m.id, m.store_timestamp,
                 m.born_timestamp, m.store_size) for m in consumer.pull(topic, expression)]
    finally:
        consumer.shutdown()


def as_seen(e) -> tuple:  # noqa: ANN001
    """An archived message as the C++ client shows it (keys and tags as bytes)."""
    return (e.topic, e.queue_id, e.queue_offset, e.body, e.keys.encode(), (e.tags or "").encode(), e.msg_id,
            e.store_ms, e.born_ms, e.store_size)


def test_pull_consumer_reads_every_queue_from_zero_exactly(archived: Archived, replay: Replay) -> None:
    for topic in ("Orders", "Audit"):
        got = pull_all(replay.address, "pull-all", topic)
        want = [as_seen(e) for key, e in sorted(archived.messages.items()) if key[0] == topic]
        assert sorted(got, key=lambda r: (r[1], r[2])) == want


def test_a_tag_subscription_gets_only_that_tag(archived: Archived, replay: Replay) -> None:
    got = pull_all(replay.address, "pull-tag", "Orders", "TagB")
    want = [as_seen(e) for key, e in sorted(archived.messages.items()) if key[0] == "Orders" and e.tags == "TagB"]
    assert want and sorted(got, key=lambda r: (r[1], r[2])) == want


def test_a_send_is_refused_and_the_archive_unchanged(archived: Archived, replay: Replay) -> None:
    cold = Path(archived.cold_url.removeprefix("file://"))
    before = sorted((p, p.stat().st_size) for p in cold.rglob("*") if p.is_file())
    producer = rocketmq.Producer("replay-producer", timeout=3000)
    producer.set_namesrv_addr(replay.address)
    producer.start()
    try:
        msg = rocketmq.Message("Orders")
        msg.set_body("must not land")
        with pytest.raises(Exception):  # noqa: B017 - the wrapper raises its own family, by ffi status
            producer.send_sync(msg)
    finally:
        producer.shutdown()
    assert sorted((p, p.stat().st_size) for p in cold.rglob("*") if p.is_file()) == before


def consume(address: str, group: str, instance: str, count: int, *, orderly: bool = False) -> list[tuple[int, int]]:
    """(queue, offset) of the first ``count`` Orders messages a PushConsumer of
    ``group`` receives; it is shut down after them (committing its offsets)."""
    got: list[tuple[int, int]] = []
    done = threading.Event()
    lock = threading.Lock()

    def on_message(m) -> None:  # noqa: ANN001
        with lock:
            got.append((m.queue_id, m.queue_offset))
            if len(got) >= count:
                done.set()

    consumer = rocketmq.PushConsumer(group, orderly=orderly)
    consumer.set_instance_name(instance)
    consumer.set_namesrv_addr(address)
    consumer.subscribe("Orders", on_message)
    consumer.start()
    try:
        assert done.wait(60), f"received {len(got)} of {count}"
        time.sleep(0.5)  # let the consumer finish the batch it is in before the commit at shutdown
    finally:
        consumer.shutdown()
    return got


def test_a_push_consumer_commits_and_resumes_after_a_restart(tmp_path: Path) -> None:
    archived = make_archive(tmp_path)
    first = [k[1:] for k in sorted(archived.messages) if k[0] == "Orders"]
    with Replay(archived.cold_url) as replay:
        got = consume(replay.address, "resume-g", "first", len(first))
    assert sorted(got) == first  # every message once
    # SIGTERM wrote the group's offsets beside the archive: the end of every queue
    doc = json.loads((Path(archived.cold_url.removeprefix("file://")) / CLUSTER / BROKER / "_replay.offsets" /
                      "resume-g.json").read_bytes())
    ends = {(r["topic"], r["queue_id"]): r["offset"] for r in doc["offsets"]}
    assert ends == {("Orders", q): sum(1 for k in first if k[0] == q) for q in range(3)}

    write(archived.root, 60, 30)  # more messages, archived while replay is down
    archive(archived.root, open_store(archived.cold_url), archived.state)
    new = sorted(k[1:] for k in expected(archived.root) if k[0] == "Orders" and k[1:] not in set(first))
    assert len(new) == 30
    with Replay(archived.cold_url) as replay:
        again = consume(replay.address, "resume-g", "second", len(new))
    assert sorted(again) == new


def test_a_push_consumer_of_a_group_started_at_a_time(archived: Archived) -> None:
    cut = 1_700_000_000_000 + 30_500  # messages 31 and later (store time T0 + i seconds)
    want = sorted(k[1:] for k, e in archived.messages.items() if k[0] == "Orders" and e.store_ms >= cut)
    assert 0 < len(want) < sum(1 for k in archived.messages if k[0] == "Orders")
    with Replay(archived.cold_url, "--start", f"time-g={cut}") as replay:
        got = consume(replay.address, "time-g", "timed", len(want))
    assert sorted(got) == want


def test_an_orderly_push_consumer_gets_each_queue_in_order(archived: Archived, replay: Replay) -> None:
    want = [k[1:] for k in sorted(archived.messages) if k[0] == "Orders"]
    got = consume(replay.address, "orderly-g", "orderly", len(want), orderly=True)
    assert sorted(got) == want
    for q in range(3):  # the queue locks keep one consumer thread per queue: offsets come in order
        assert [o for qq, o in got if qq == q] == [o for qq, o in want if qq == q]


def _send_backs(metrics_url: str) -> float:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"{metrics_url}/metrics", timeout=10).read().decode()
    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
               if s.name == "tiered_replay_requests_total" and s.labels == {"request": "send_back",
                                                                           "outcome": "no_permission"})


def test_a_failed_message_whose_send_back_is_refused_is_lost_by_the_cpp_client(tmp_path: Path) -> None:
    """What the 2019 C++ client (1.2.x ConsumeMessageConcurrentlyService) does when its callback
    returns RECONSUME_LATER: the pull's whole batch is sent back (CONSUMER_SEND_MSG_BACK, to the
    records' store host, not to the route's broker: here the archive names replay's own address),
    a refusal is only logged, and the offset moves past the batch. The failed message and the rest
    of its batch, never shown to the callback, are not delivered again and the commit passes them."""
    from rocketmq.client import RecvMessage, _CConsumeStatus, dll, ffi_check

    port = free_port()
    archived = make_archive(tmp_path, store_host=Host("127.0.0.1", port))
    orders = {k[1:] for k in archived.messages if k[0] == "Orders"}
    ends = {q: sum(1 for qq, _ in orders if qq == q) for q in range(3)}
    seen: list[tuple[int, int]] = []
    lock = threading.Lock()

    def on_message(_consumer, msg) -> int:  # noqa: ANN001 - the wheel's raw callback: it returns the status
        m = RecvMessage(msg)
        with lock:
            seen.append((m.queue_id, m.queue_offset))
        failed = (m.queue_id, m.queue_offset) == (0, 0)
        return (_CConsumeStatus.RECONSUME_LATER if failed else _CConsumeStatus.CONSUME_SUCCESS).value

    with Replay(archived.cold_url, listen=f"127.0.0.1:{port}") as replay:
        raw = Raw(replay.address)  # the client's first pull of queue 0: offset 0, at most 32
        first = raw.call(11, {"consumerGroup": "probe", "topic": "Orders", "queueId": "0", "queueOffset": "0",
                              "maxMsgNums": "32", "sysFlag": "0"})
        raw.close()
        batch = int(first.ext["nextBeginOffset"])
        want = orders - {(0, o) for o in range(1, batch)}  # the batch's others never reach the callback
        consumer = rocketmq.PushConsumer("send-back-g")
        consumer.set_namesrv_addr(replay.address)
        ffi_check(dll.Subscribe(consumer._handle, b"Orders", b"*"))
        consumer._register_callback(on_message)
        consumer.start()
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                with lock:
                    got = set(seen)
                if got == want and _send_backs(replay.metrics_url) >= batch:
                    break
                time.sleep(0.2)
            time.sleep(0.5)  # let the consumer finish the batch it is in before the commit at shutdown
        finally:
            consumer.shutdown()
        assert set(seen) == want, sorted(want ^ set(seen))
        assert _send_backs(replay.metrics_url) == batch  # each message of the failed batch, refused once
    assert sorted(seen) == sorted(want)  # nothing delivered twice: the failed message is not re-consumed
    doc = json.loads((Path(archived.cold_url.removeprefix("file://")) / CLUSTER / BROKER / "_replay.offsets" /
                      "send-back-g.json").read_bytes())
    assert {r["queue_id"]: r["offset"] for r in doc["offsets"] if r["topic"] == "Orders"} == ends
