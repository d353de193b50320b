"""Records archived while replay runs: held pulls are woken by them, a
subscribed consumer receives them, new topics get a route; no restart."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from replaykit import make_archive, Raw, Replay, archive, expected, local_raw, write
from tiered.archive.storage import open_store
from tiered.store.storewriter import StoreWriter

pytestmark = pytest.mark.timeout(120, method="thread")


def pull_ext(offset: int) -> dict[str, str]:
    return {"consumerGroup": "g", "topic": "Orders", "queueId": "0", "queueOffset": str(offset), "maxMsgNums": "32",
            "sysFlag": "2", "commitOffset": "0", "suspendTimeoutMillis": "60000", "subVersion": "0"}


def test_a_held_pull_is_woken_by_newly_archived_records_and_new_topics_get_a_route(tmp_path: Path) -> None:
    from tiered.replay.frame import Command, encode

    archived = make_archive(tmp_path)
    end = len(local_raw(archived.root, "Orders", 0))
    with Replay(archived.cold_url, "--follow-interval", "200ms") as replay:
        raw = Raw(replay.address)
        raw.send(encode(Command(code=11, opaque=1, ext=pull_ext(end))))  # held: nothing past the end yet
        write(archived.root, 60, 30)
        with StoreWriter(archived.root) as w:
            w.put("Fresh", 0, b"new topic", tags="TagA")
        archive(archived.root, open_store(archived.cold_url), archived.state)
        woken = raw.read()  # held up to 60 s unless the refresh wakes it
        assert woken.opaque == 1 and (woken.code, woken.remark) == (0, "FOUND")
        new = local_raw(archived.root, "Orders", 0)[end:]
        assert woken.body == b"".join(new[:int(woken.ext["nextBeginOffset"]) - end]) and woken.body
        assert end < int(woken.ext["maxOffset"]) <= end + len(new)  # woken by a refresh during the archiving, maybe
        deadline = time.monotonic() + 30
        while raw.call(105, {"topic": "Fresh"}).code != 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert raw.call(105, {"topic": "Fresh"}).code == 0
        assert raw.call(30, {"topic": "Orders", "queueId": "0"}).ext["offset"] == str(end + len(new))
        raw.close()


def test_a_subscribed_consumer_receives_what_is_archived_meanwhile(tmp_path: Path) -> None:
    rocketmq = pytest.importorskip("rocketmq.client", reason="the RocketMQ C++ client wheel (x86_64 Linux)")
    archived = make_archive(tmp_path)
    first = sorted(k[1:] for k in archived.messages if k[0] == "Orders")
    got: list[tuple[int, int]] = []
    lock = threading.Lock()
    with Replay(archived.cold_url, "--follow-interval", "200ms") as replay:
        consumer = rocketmq.PushConsumer("follow-g")
        consumer.set_instance_name("follow")
        consumer.set_namesrv_addr(replay.address)

        def on_message(m) -> None:  # noqa: ANN001
            with lock:
                got.append((m.queue_id, m.queue_offset))

        def received() -> int:
            with lock:
                return len(got)

        def wait_for(count: int) -> None:
            deadline = time.monotonic() + 60
            while received() < count and time.monotonic() < deadline:
                time.sleep(0.05)
            assert received() >= count, f"received {received()} of {count}"

        consumer.subscribe("Orders", on_message)
        consumer.start()
        try:
            wait_for(len(first))
            write(archived.root, 60, 30)
            archive(archived.root, open_store(archived.cold_url), archived.state)
            everything = sorted(k[1:] for k in expected(archived.root) if k[0] == "Orders")
            wait_for(len(everything))
        finally:
            consumer.shutdown()
    assert sorted(got) == everything
