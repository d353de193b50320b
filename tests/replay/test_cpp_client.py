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

from replaykit import Archived, make_archive, CLUSTER, BROKER, Replay, archive, expected, write
from tiered.archive.storage import open_store

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
