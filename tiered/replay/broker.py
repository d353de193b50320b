"""The request handlers: a read-only broker and name server over the archive.

Each handler follows the broker's processor for its code (apache/rocketmq
``PullMessageProcessor``, ``ConsumerManageProcessor``, ``ClientManageProcessor``,
``AdminBrokerProcessor``, the name server's route); where the archive
differs from a broker's store it says so. Archive reads and bucket
writes run on the executor, never on the event loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, TypeVar

from tiered.errors import BadRequestError, TieredError
from tiered.replay import protocol as p
from tiered.replay.frame import Command
from tiered.replay.locks import QueueLocks, locked_body, parse_body
from tiered.replay.metrics import ReplayMetrics
from tiered.replay.offsets import GroupOffsets, check_name
from tiered.replay.protocol import number, response, text
from tiered.replay.registry import Registry
from tiered.replay.route import RouteBroker, route_body
from tiered.replay.start import CLIENT, LATEST, TIME, Start
from tiered.replay.source import (FOUND, NO_MATCHED_LOGIC_QUEUE, NO_MESSAGE_IN_QUEUE, OFFSET_OVERFLOW_BADLY,
                                  OFFSET_OVERFLOW_ONE, OFFSET_TOO_SMALL, ArchiveSource, Pulled)

log = logging.getLogger(__name__)
T = TypeVar("T")

# DefaultMessageStore's transfer limits for messages in memory
# (maxTransferCountOnMessageInMemory, maxTransferBytesOnMessageInMemory)
MAX_PULL_COUNT = 32
MAX_PULL_BYTES = 256 * 1024
# BrokerConfig.shortPollingTimeMills: how long a broker without long polling
# holds a suspended pull that found nothing before answering
SHORT_POLLING_S = 1.0
# a suspended pull is held at most this long, whatever suspendTimeoutMillis asks
MAX_HOLD_S = 60.0
# how often held pulls are checked for their suspend timeout, by one task for
# all of them (the broker's PullRequestHoldService checks every 5 s): cheaper
# than a timer per held pull, which is most of what an idle consumer costs
HOLD_CHECK_S = 1.0


@dataclass(frozen=True, kw_only=True)
class Limits:
    max_count: int = MAX_PULL_COUNT
    max_bytes: int = MAX_PULL_BYTES
    hold_s: float = SHORT_POLLING_S
    # hold a suspended pull until its queue grows or suspendTimeoutMillis passes
    # (only worth it when the source is refreshed: replay follows the archive)
    long_polling: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class _Pull:
    """A PULL_MESSAGE request's header, read and checked."""

    group: str
    topic: str
    queue_id: int
    offset: int
    flags: int
    max_count: int
    max_bytes: int
    commit: int  # the consumer offset it commits; -1: none


class Consumers:
    """Client ids of each group, from heartbeats, forgotten when the client
    unregisters or its connection closes (ConsumerManager)."""

    def __init__(self) -> None:
        self._groups: dict[str, dict[str, int]] = {}

    def heartbeat(self, conn: int, body: bytes) -> None:
        try:
            doc = json.loads(body)
            client = str(doc["clientID"])
            groups = [str(c["groupName"]) for c in doc.get("consumerDataSet") or ()]
        except (ValueError, KeyError, TypeError) as exc:
            raise BadRequestError(f"heartbeat body: {type(exc).__name__}: {exc}") from None
        for group in groups:
            self._groups.setdefault(group, {})[client] = conn

    def unregister(self, client: str, group: str) -> None:
        self._groups.get(group, {}).pop(client, None)

    def closed(self, conn: int) -> None:
        for clients in self._groups.values():
            for client in [c for c, at in clients.items() if at == conn]:
                del clients[client]

    def ids(self, group: str) -> list[str]:
        return sorted(self._groups.get(group, {}))


class ReplayBroker:
    def __init__(self, source: ArchiveSource, offsets: GroupOffsets, *, address: str, executor: Executor,
                 limits: Limits | None = None, starts: Mapping[str, Start] | None = None,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 now_ms: Callable[[], int] | None = None, metrics: ReplayMetrics | None = None,
                 registry: Registry | None = None) -> None:
        self.source = source
        # the other archived brokers this process serves, for the route (None: this one only)
        self.registry = registry
        self.offsets = offsets
        self.address = address
        self.executor = executor
        self.limits = limits or Limits()
        self.starts = dict(starts or {})
        self.sleep = sleep
        self.consumers = Consumers()
        self.locks = QueueLocks(now_ms or offsets.now_ms)
        self._arrivals: dict[tuple[str, int], asyncio.Future[None]] = {}
        # held pulls by queue: each one's waiter and its deadline (loop time)
        self._held: dict[tuple[str, int], dict[asyncio.Future[None], float]] = {}
        self._expiry: asyncio.Task[None] | None = None
        self.metrics = metrics
        self._handlers: dict[int, Callable[[Command, int], Awaitable[Command]]] = {
            p.GET_ROUTEINFO_BY_TOPIC: self.route,
            p.HEART_BEAT: self.heartbeat,
            p.UNREGISTER_CLIENT: self.unregister,
            p.GET_CONSUMER_LIST_BY_GROUP: self.consumer_list,
            p.LOCK_BATCH_MQ: self.lock,
            p.UNLOCK_BATCH_MQ: self.unlock,
            p.PULL_MESSAGE: self.pull,
            p.QUERY_CONSUMER_OFFSET: self.query_offset,
            p.UPDATE_CONSUMER_OFFSET: self.update_offset,
            p.SEARCH_OFFSET_BY_TIMESTAMP: self.search_offset,
            p.GET_MAX_OFFSET: self.max_offset,
            p.GET_MIN_OFFSET: self.min_offset,
            p.GET_EARLIEST_MSG_STORETIME: self.earliest_time,
            p.CONSUMER_SEND_MSG_BACK: self.send_back,
        }

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    async def handle(self, req: Command, conn: int) -> Command | None:
        """The response to ``req`` (None for a one-way request): never raises
        for anything a client sends."""
        try:
            handler = self._handlers.get(req.code)
            if handler is not None:
                resp = await handler(req, conn)
            elif req.code in p.SENDS:
                resp = self._forbidden(req)
            else:
                resp = response(req, p.REQUEST_CODE_NOT_SUPPORTED, remark=f" request type {req.code} not supported")
        except BadRequestError as exc:
            resp = response(req, exc.code, remark=str(exc))
        except TieredError as exc:
            log.warning("request %d failed: %s", req.code, exc)
            resp = response(req, p.SYSTEM_ERROR, remark=str(exc))
        except Exception:
            log.exception("request %d failed", req.code)
            resp = response(req, p.SYSTEM_ERROR, remark="internal error (logged by replay)")
        if self.metrics is not None:
            self.metrics.request(req.code, resp.code)
        return None if req.is_oneway else resp

    def closed(self, conn: int) -> None:
        self.consumers.closed(conn)

    def _forbidden(self, req: Command) -> Command:
        """What a broker without write permission answers a send or a
        send-back (SendMessageProcessor: PermName.isWriteable fails)."""
        return response(req, p.NO_PERMISSION,
                        remark=f"the broker[{self.source.broker}] sending message is forbidden: it replays an archive")

    async def send_back(self, req: Command, conn: int) -> Command:
        """CONSUMER_SEND_MSG_BACK: a consumer hands back a message it failed,
        for the broker to store in the group's %RETRY% topic. The header is
        decoded first (its @CFNotNull fields), then refused as a broker without
        write permission refuses it: the client re-consumes the message
        itself, or does not (docs/replay.md, "A failed message")."""
        number(req, "offset")
        text(req, "group")
        number(req, "delayLevel")
        return self._forbidden(req)

    def arrived(self, queues: set[tuple[str, int]]) -> None:
        """Wake the pulls held on ``queues``: their archive grew."""
        for queue in queues:
            arrival = self._arrivals.pop(queue, None)
            if arrival is not None and not arrival.done():
                arrival.set_result(None)
            for waiter in self._held.get(queue, {}):
                if not waiter.done():
                    waiter.set_result(None)

    # --- name server and client management ---------------------------------------

    async def route(self, req: Command, conn: int) -> Command:
        topic = text(req, "topic")
        if self.registry is not None:
            brokers = self.registry.route(topic)
        else:
            queues = self.source.topics.get(topic)
            brokers = [] if queues is None else [RouteBroker(cluster=self.source.cluster, broker=self.source.broker,
                                                             address=self.address, queues=queues)]
        if not brokers:
            return response(req, p.TOPIC_NOT_EXIST, remark=f"No topic route info in name server for the topic: {topic}")
        return response(req, p.SUCCESS, body=route_body(brokers))

    async def heartbeat(self, req: Command, conn: int) -> Command:
        self.consumers.heartbeat(conn, req.body)
        return response(req, p.SUCCESS)

    async def unregister(self, req: Command, conn: int) -> Command:
        client = text(req, "clientID")
        group = req.ext.get("consumerGroup")
        if group:
            self.consumers.unregister(client, group)
        return response(req, p.SUCCESS)

    async def consumer_list(self, req: Command, conn: int) -> Command:
        group = text(req, "consumerGroup")
        ids = self.consumers.ids(group)
        if not ids:
            return response(req, p.SYSTEM_ERROR, remark=f"no consumer for this group, {group}")
        return response(req, p.SUCCESS, body=json.dumps({"consumerIdList": ids}).encode())

    async def lock(self, req: Command, conn: int) -> Command:
        return response(req, p.SUCCESS, body=locked_body(self.locks.lock(parse_body(req.body))))

    async def unlock(self, req: Command, conn: int) -> Command:
        self.locks.unlock(parse_body(req.body))
        return response(req, p.SUCCESS)

    # --- pulls ------------------------------------------------------------------------

    def _queue(self, req: Command) -> tuple[str, int]:
        return text(req, "topic"), number(req, "queueId")

    def _check_queue(self, topic: str, queue_id: int) -> None:
        queues = self.source.topics.get(topic)
        if queues is None:
            raise BadRequestError(f"topic[{topic}] not exist, apply first please!", code=p.TOPIC_NOT_EXIST)
        if not 0 <= queue_id < queues:
            raise BadRequestError(f"queueId[{queue_id}] is illegal, topic:[{topic}] topicConfig.readQueueNums:"
                                  f"[{queues}]", code=p.INVALID_PARAMETER)

    def handle_now(self, req: Command) -> Command | None:
        """``handle``'s response when it needs no wait, else None (then run
        ``handle``): a pull whose records a window holds, or that the
        manifests answer. Most pulls are, and a task each cost them a fifth
        of their time."""
        if req.code != p.PULL_MESSAGE or req.is_oneway:
            return None
        try:
            pull = self._pull_request(req)
        except BadRequestError:
            return None  # ``handle`` answers it
        got = self.source.pull_cached(pull.topic, pull.queue_id, pull.offset, pull.max_count, pull.max_bytes)
        if got is None or (_pull_code(got, pull.offset) == p.PULL_NOT_FOUND and pull.flags & p.FLAG_SUSPEND):
            return None
        self._commit(pull)
        resp = self._pulled(req, got, pull.offset)
        if self.metrics is not None:
            self.metrics.request(req.code, resp.code)
        return resp

    def _pull_request(self, req: Command) -> _Pull:
        group = check_name("group", text(req, "consumerGroup"))
        topic, queue_id = self._queue(req)
        max_count = min(max(number(req, "maxMsgNums"), 1), self.limits.max_count)
        max_bytes = min(max(number(req, "maxMsgBytes", default=self.limits.max_bytes), 1), self.limits.max_bytes)
        offset, flags = number(req, "queueOffset"), number(req, "sysFlag")
        self._check_queue(topic, queue_id)
        commit = number(req, "commitOffset", default=-1) if flags & p.FLAG_COMMIT_OFFSET else -1
        return _Pull(group=group, topic=topic, queue_id=queue_id, offset=offset, flags=flags, max_count=max_count,
                     max_bytes=max_bytes, commit=commit)

    def _commit(self, pull: _Pull) -> None:
        """The consumer offset a pull carries (PullSysFlag commit offset)."""
        if pull.commit >= 0:
            self.offsets.commit(pull.group, pull.topic, pull.queue_id, pull.commit)

    async def pull(self, req: Command, conn: int) -> Command:
        pull = self._pull_request(req)
        self._commit(pull)
        topic, queue_id, offset = pull.topic, pull.queue_id, pull.offset
        # taken before the read: records arriving during it wake this pull
        arrival = self._arrival((topic, queue_id))
        got = await self._read(topic, queue_id, offset, pull.max_count, pull.max_bytes)
        if _pull_code(got, offset) == p.PULL_NOT_FOUND and pull.flags & p.FLAG_SUSPEND:
            await self._hold(req, (topic, queue_id), arrival)
            # then the pull runs again, as the broker runs it, without suspending
            got = await self._read(topic, queue_id, offset, pull.max_count, pull.max_bytes)
        return self._pulled(req, got, offset)

    def _pulled(self, req: Command, got: Pulled, offset: int) -> Command:
        if self.metrics is not None and got.count:
            self.metrics.messages.inc(got.count)
            self.metrics.bytes.inc(len(got.body))
        ext = {"nextBeginOffset": str(got.next_offset), "minOffset": str(got.min_offset),
               "maxOffset": str(got.max_offset), "suggestWhichBrokerId": "0"}
        return response(req, _pull_code(got, offset), remark=got.status, ext=ext, body=got.body)

    async def _read(self, topic: str, queue_id: int, offset: int, max_count: int, max_bytes: int) -> Pulled:
        """A pull's records: on the event loop when nothing needs reading
        (most pulls: the records are in a window already), else on a read
        thread, as handing a pull to a thread costs more than cutting it."""
        got = self.source.pull_cached(topic, queue_id, offset, max_count, max_bytes)
        if got is None:
            got = await self._run(self.source.pull, topic, queue_id, offset, max_count, max_bytes)
        return got

    def _arrival(self, queue: tuple[str, int]) -> asyncio.Future[None]:
        """The future the queue's next growth completes: a pull takes it
        before it reads, so records arriving during a read wake it too."""
        arrival = self._arrivals.get(queue)
        if arrival is None:
            arrival = self._arrivals[queue] = asyncio.get_running_loop().create_future()
        return arrival

    async def _hold(self, req: Command, queue: tuple[str, int], arrival: asyncio.Future[None]) -> None:
        """Hold a suspended pull that found nothing: until its queue grows or
        suspendTimeoutMillis passes (PullRequestHoldService, checked every
        HOLD_CHECK_S), or for the short polling time when nothing can arrive
        (longPollingEnable=false)."""
        if self.metrics is not None:
            self.metrics.held.inc()
        try:
            if not self.limits.long_polling:
                await self.sleep(self.limits.hold_s)
                return
            timeout = min(max(number(req, "suspendTimeoutMillis", default=0), 0) / 1000, MAX_HOLD_S)
            if timeout <= 0 or arrival.done():
                return
            loop = asyncio.get_running_loop()
            waiter = loop.create_future()
            held = self._held.setdefault(queue, {})
            held[waiter] = loop.time() + timeout
            if self._expiry is None:
                self._expiry = loop.create_task(self._expire())
            try:
                await waiter
            finally:
                del held[waiter]
                if not held and self._held.get(queue) is held:
                    del self._held[queue]
        finally:
            if self.metrics is not None:
                self.metrics.held.dec()

    async def _expire(self) -> None:
        """Answer the held pulls whose suspend timeout has passed; runs while
        any pull is held, so an idle server with none does no periodic work."""
        loop = asyncio.get_running_loop()
        try:
            while self._held:
                await asyncio.sleep(HOLD_CHECK_S)
                now = loop.time()
                for held in list(self._held.values()):
                    for waiter, deadline in held.items():
                        if deadline <= now and not waiter.done():
                            waiter.set_result(None)
        finally:
            self._expiry = None

    # --- consumer offsets -----------------------------------------------------------------

    async def query_offset(self, req: Command, conn: int) -> Command:
        group = text(req, "consumerGroup")
        topic, queue_id = self._queue(req)
        if not self.offsets.fresh(group):  # other replicas' commits, as flushed
            await self._run(self.offsets.refresh, group)
        stored = self.offsets.get(group, topic, queue_id)
        client_decides = self.starts.get(group, Start()).where == CLIENT
        if stored is None and (client_decides or req.ext.get("setZeroIfNotFound", "").lower() == "false"):
            return response(req, p.QUERY_NOT_FOUND, remark="Not found, do not set to zero, maybe this group boot first")
        offset = stored if stored is not None else await self._start(group, topic, queue_id)
        return response(req, p.SUCCESS, ext={"offset": str(offset)})

    async def _start(self, group: str, topic: str, queue_id: int) -> int:
        """Where a group without a committed offset starts (tiered/replay/start.py)."""
        start = self.starts.get(group, Start())
        if start.where == LATEST:
            return self.source.max_offset(topic, queue_id)
        if start.where == TIME and start.time_ms is not None:
            return await self._run(self.source.offset_for_time, topic, queue_id, start.time_ms)
        return self.source.min_offset(topic, queue_id)

    async def update_offset(self, req: Command, conn: int) -> Command:
        group = text(req, "consumerGroup")
        topic, queue_id = self._queue(req)
        self.offsets.commit(group, topic, queue_id, number(req, "commitOffset"))
        return response(req, p.SUCCESS)

    # --- admin reads ----------------------------------------------------------------------

    async def search_offset(self, req: Command, conn: int) -> Command:
        topic, queue_id = self._queue(req)
        timestamp = number(req, "timestamp")
        boundary = req.ext.get("boundaryType", "lower").lower()
        if boundary not in ("lower", "upper"):
            raise BadRequestError(f"boundaryType {boundary[:20]!r}: lower or upper", code=p.INVALID_PARAMETER)
        offset = await self._run(self.source.offset_for_time, topic, queue_id, timestamp, boundary == "upper")
        return response(req, p.SUCCESS, ext={"offset": str(offset)})

    async def max_offset(self, req: Command, conn: int) -> Command:
        topic, queue_id = self._queue(req)
        return response(req, p.SUCCESS, ext={"offset": str(self.source.max_offset(topic, queue_id))})

    async def min_offset(self, req: Command, conn: int) -> Command:
        topic, queue_id = self._queue(req)
        return response(req, p.SUCCESS, ext={"offset": str(self.source.min_offset(topic, queue_id))})

    async def earliest_time(self, req: Command, conn: int) -> Command:
        topic, queue_id = self._queue(req)
        timestamp = await self._run(self.source.earliest_store_ms, topic, queue_id)
        return response(req, p.SUCCESS, ext={"timestamp": str(timestamp)})


def _pull_code(got: Pulled, requested: int) -> int:
    """PullMessageProcessor's response code for a store status."""
    if got.status == FOUND:
        return p.SUCCESS
    if got.status in (NO_MATCHED_LOGIC_QUEUE, NO_MESSAGE_IN_QUEUE):
        return p.PULL_OFFSET_MOVED if requested != 0 else p.PULL_NOT_FOUND
    if got.status in (OFFSET_TOO_SMALL, OFFSET_OVERFLOW_BADLY):
        return p.PULL_OFFSET_MOVED
    assert got.status == OFFSET_OVERFLOW_ONE, got.status
    return p.PULL_NOT_FOUND
