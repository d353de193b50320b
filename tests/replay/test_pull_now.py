"""Pulls answered without a task (``ReplayBroker.handle_now``): whatever it
answers is exactly what ``handle`` answers, with the commit a pull carries
made once and the request counted once; whatever needs a read of the
archive, a hold or an error answer is left to ``handle``."""

from __future__ import annotations

import asyncio
import logging
import struct
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from replaykit import BROKER, CLUSTER, Archived, local_raw
from tiered.archive.storage import open_store
from tiered.replay import protocol as p
from tiered.replay.broker import ReplayBroker
from tiered.replay.frame import ONEWAY_FLAG, Command, decode
from tiered.replay.metrics import ReplayMetrics
from tiered.replay.offsets import GroupOffsets
from tiered.replay.source import ArchiveSource

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def broker(archived: Archived, registry: CollectorRegistry) -> Iterator[ReplayBroker]:
    store = open_store(archived.cold_url)
    with ThreadPoolExecutor(2) as executor:
        yield ReplayBroker(ArchiveSource(store, CLUSTER, BROKER), GroupOffsets(store, CLUSTER, BROKER,
                                                                               now_ms=lambda: 0),
                           address="127.0.0.1:1", executor=executor, metrics=ReplayMetrics(registry))


def _pull(offset: int, *, queue: str = "0", flags: int = 0, topic: str = "Orders", **ext: str) -> Command:
    fields = {"consumerGroup": "g", "topic": topic, "queueId": queue, "queueOffset": str(offset), "maxMsgNums": "4",
              "sysFlag": str(flags), "suspendTimeoutMillis": "20", **ext}
    return Command(code=p.PULL_MESSAGE, opaque=7, ext=fields)


def _handled(broker: ReplayBroker, req: Command) -> Command:
    async def run() -> Command:
        resp = await broker.handle(req, 1)
        assert resp is not None
        return resp
    return asyncio.run(run())


def _same(a: Command, b: Command) -> bool:
    return (a.code, a.opaque, a.flag, a.remark, a.ext, bytes(a.body)) == (b.code, b.opaque, b.flag, b.remark, b.ext,
                                                                          bytes(b.body))


def _counted(registry: CollectorRegistry, outcome: str) -> float:
    return registry.get_sample_value("tiered_replay_requests_total", {"request": "pull", "outcome": outcome}) or 0.0


def test_a_pull_in_a_read_window_is_answered_now_exactly_as_handle_answers_it(
        archived: Archived, broker: ReplayBroker, registry: CollectorRegistry) -> None:
    records = local_raw(archived.root, "Orders", 0)
    assert broker.handle_now(_pull(0)) is None  # nothing read yet: it needs the archive
    first = _handled(broker, _pull(0))  # reads the window
    assert first.code == p.SUCCESS and bytes(first.body) == b"".join(records[:4])
    for offset in (0, 1, 4, len(records) - 2):
        handled = _handled(broker, _pull(offset))  # its window read (segments end somewhere in between)
        before = _counted(registry, "success")
        now = broker.handle_now(_pull(offset))
        assert now is not None and _counted(registry, "success") == before + 1
        assert _same(now, handled)
        assert bytes(now.body) == b"".join(records[offset:offset + 4])
        assert now.ext["nextBeginOffset"] == str(min(offset + 4, len(records)))


def test_pulls_the_manifests_answer_are_answered_now_and_held_ones_are_not(archived: Archived,
                                                                           broker: ReplayBroker) -> None:
    end = len(local_raw(archived.root, "Orders", 1))
    for offset, code in ((end, p.PULL_NOT_FOUND), (end + 9, p.PULL_OFFSET_MOVED), (-3, p.PULL_OFFSET_MOVED)):
        now = broker.handle_now(_pull(offset, queue="1"))
        assert now is not None and now.code == code and _same(now, _handled(broker, _pull(offset, queue="1")))
    # at the end with the suspend flag: held until records arrive, by ``handle``
    assert broker.handle_now(_pull(end, queue="1", flags=p.FLAG_SUSPEND)) is None
    assert _handled(broker, _pull(end, queue="1", flags=p.FLAG_SUSPEND)).code == p.PULL_NOT_FOUND


@pytest.mark.parametrize(("req", "code"), [
    (_pull(0, topic="Nope"), p.TOPIC_NOT_EXIST),
    (_pull(0, queue="99"), p.INVALID_PARAMETER),
    (_pull(0, queueOffset="x"), p.SYSTEM_ERROR),
    (_pull(0, consumerGroup="bad group!"), p.INVALID_PARAMETER),
    (_pull(0, flags=p.FLAG_COMMIT_OFFSET, commitOffset="nine"), p.SYSTEM_ERROR),
], ids=["unknown-topic", "unknown-queue", "bad-offset", "bad-group", "bad-commit"])
def test_requests_answered_with_an_error_are_left_to_handle(broker: ReplayBroker, req: Command, code: int) -> None:
    _handled(broker, _pull(0))  # the window is there: only the header decides
    assert broker.handle_now(req) is None
    assert _handled(broker, req).code == code


def test_a_commit_carried_by_a_pull_answered_now_is_made_once(archived: Archived, broker: ReplayBroker) -> None:
    _handled(broker, _pull(0))
    commits: list[tuple[str, str, int, int]] = []
    real = broker.offsets.commit
    broker.offsets.commit = lambda *a: (commits.append(a), real(*a))[1]  # type: ignore[method-assign]
    now = broker.handle_now(_pull(2, flags=p.FLAG_COMMIT_OFFSET, commitOffset="2"))
    assert now is not None and now.code == p.SUCCESS
    assert commits == [("g", "Orders", 0, 2)] and broker.offsets.get("g", "Orders", 0) == 2
    # a held pull leaves its commit to ``handle``: none made by the try
    end = len(local_raw(archived.root, "Orders", 0))
    assert broker.handle_now(_pull(end, flags=p.FLAG_COMMIT_OFFSET | p.FLAG_SUSPEND, commitOffset="3")) is None
    assert commits == [("g", "Orders", 0, 2)]


def test_one_way_pulls_and_other_codes_are_left_to_handle(broker: ReplayBroker) -> None:
    _handled(broker, _pull(0))
    oneway = Command(code=p.PULL_MESSAGE, opaque=1, flag=ONEWAY_FLAG, ext=_pull(0).ext)
    assert broker.handle_now(oneway) is None
    assert broker.handle_now(Command(code=p.GET_MAX_OFFSET, ext={"topic": "Orders", "queueId": "0"})) is None


def test_a_bug_answering_now_closes_that_connection_and_the_server_goes_on(broker: ReplayBroker, caplog) -> None:  # noqa: ANN001
    """A handler raising is a bug of ours: the connection it came on is
    closed (logged), every other connection is still answered."""
    from tiered.replay.frame import encode
    from tiered.replay.server import ReplayServer

    _handled(broker, _pull(0))
    real = broker.handle_now

    def handle_now(req: Command) -> Command | None:
        if req.opaque == 66:
            raise RuntimeError("a bug")
        return real(req)

    broker.handle_now = handle_now  # type: ignore[method-assign]

    async def run() -> tuple[bytes, int]:
        server = ReplayServer(lambda address: broker, "127.0.0.1", 0)
        host, port = (await server.start()).rsplit(":", 1)
        try:
            bad_r, bad_w = await asyncio.open_connection(host, int(port))
            good_r, good_w = await asyncio.open_connection(host, int(port))
            bad_w.write(encode(Command(code=p.PULL_MESSAGE, opaque=66, ext=_pull(0).ext)))
            closed = await asyncio.wait_for(bad_r.read(), 30)  # EOF: nothing answered, the connection closed
            good_w.write(encode(Command(code=p.PULL_MESSAGE, opaque=67, ext=_pull(0).ext)))
            (length,) = struct.unpack(">i", await asyncio.wait_for(good_r.readexactly(4), 30))
            answer = decode(await good_r.readexactly(length))
            for w in (bad_w, good_w):
                w.close()
            return closed, answer.code
        finally:
            await server.close()

    with caplog.at_level(logging.ERROR, logger="tiered.replay.server"):
        closed, code = asyncio.run(run())
    assert closed == b"" and code == p.SUCCESS
    assert [r.getMessage() for r in caplog.records] == ["answering request 11 failed: closing the connection"]
