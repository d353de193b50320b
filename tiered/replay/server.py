"""The asyncio TCP server: frames in, handler answers out.

Requests on one connection are served concurrently (clients pipeline them,
matched by opaque), at most ``MAX_INFLIGHT`` at a time per connection, so a
held pull never delays another queue's pull. A frame that cannot be decoded
closes its connection, as Netty's decoder does on the broker; nothing a
client sends stops the server or another connection.

Each connection is an ``asyncio.Protocol`` cutting frames out of the bytes
it receives: with streams, every request paid for a reader task's wake-up
and two ``readexactly`` futures, a large share of a cached pull's cost and
most of an idle held pull's. A request that needs no wait (most pulls: their
records are in a window) is answered as its frame is cut; the others get a
task each.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable

from tiered.errors import BadFrameError, BadRequestError
from tiered.replay.acl import AccessCheck
from tiered.replay.broker import ReplayBroker
from tiered.replay.frame import Command, decode, encode_head, frame_length
from tiered.replay.metrics import ReplayMetrics
from tiered.replay.protocol import response

log = logging.getLogger(__name__)

MAX_INFLIGHT = 64


class ReplayServer:
    def __init__(self, broker_for: Callable[[str], ReplayBroker], host: str, port: int,
                 metrics: ReplayMetrics | None = None, acl: AccessCheck | None = None, max_connections: int = 0) -> None:
        """``broker_for(address)`` builds the broker once the bound address
        (the one the route advertises) is known: port 0 picks a free one.
        With ``acl`` every request is checked before it runs; beyond
        ``max_connections`` open connections (0: no cap) a new one is closed."""
        self._broker_for = broker_for
        self.host = host
        self.port = port
        self.broker: ReplayBroker | None = None
        self._server: asyncio.Server | None = None
        self._ids = itertools.count(1)
        self._conns: set[_Connection] = set()
        self.metrics = metrics
        self.acl = acl
        self.max_connections = max_connections

    async def start(self) -> str:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Connection(self, next(self._ids)), self.host, self.port)
        port = self._server.sockets[0].getsockname()[1]
        address = f"{self.host}:{port}"
        self.broker = self._broker_for(address)
        return address

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        conns = list(self._conns)
        for conn in conns:
            conn.abort()
        await asyncio.gather(*(c.finished for c in conns), return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    def denied(self, cmd: Command, host: str) -> Command | None:
        """The NO_PERMISSION answer when the ACL refuses ``cmd`` (None when it
        may run): the request reaches no handler."""
        if self.acl is None:
            return None
        try:
            self.acl.check(cmd, host)
            return None
        except BadRequestError as exc:
            log.debug("request %d from %s refused: %s", cmd.code, host, exc)
            if self.metrics is not None:
                self.metrics.request(cmd.code, exc.code)
            return response(cmd, exc.code, remark=str(exc))


class _Connection(asyncio.Protocol):
    """One client connection: frames cut from the received bytes, each
    request answered at once or by its own task."""

    def __init__(self, server: ReplayServer, conn: int) -> None:
        self.server = server
        self.conn = conn
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.requests: set[asyncio.Task[None]] = set()
        self.reading = True  # False while reading is paused (too many requests in flight, or writes backed up)
        self.writes_paused = False
        self.refused = False  # closed at once: over the server's connection cap
        self.loop = asyncio.get_running_loop()
        self.finished: asyncio.Future[None] = self.loop.create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport) and self.server.broker is not None
        self.transport = transport
        self.peer = transport.get_extra_info("peername")
        self.host = str(self.peer[0]) if isinstance(self.peer, tuple) else ""
        server = self.server
        if server.max_connections and len(server._conns) >= server.max_connections:
            log.info("refusing the connection from %s: %d connections open", self.peer, len(server._conns))
            if server.metrics is not None:
                server.metrics.refused.inc()
            self.refused = True
            transport.abort()
            return
        server._conns.add(self)
        if server.metrics is not None:
            server.metrics.connections.inc()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.finished.done():
            self.finished.set_result(None)
        if self.refused:
            return
        if self.server.metrics is not None:
            self.server.metrics.connections.dec()
        self.server._conns.discard(self)
        for req in list(self.requests):
            req.cancel()
        assert self.server.broker is not None
        self.server.broker.closed(self.conn)
        self.buf = bytearray()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self._cut()

    def _cut(self) -> None:
        """Start a task for every whole frame buffered, until MAX_INFLIGHT
        are in flight (the rest waits in the buffer, and reading pauses so
        the client's own sends back up instead of this buffer growing)."""
        buf = self.buf
        try:
            while len(buf) >= 4 and len(self.requests) < MAX_INFLIGHT and not self.writes_paused:
                length = frame_length(bytes(buf[:4]))
                if len(buf) < 4 + length:
                    break
                cmd = decode(bytes(buf[4:4 + length]))
                del buf[:4 + length]
                if cmd.is_response:
                    continue  # replay sends no requests: a stray response is dropped
                if not self._answer_now(cmd):
                    req = self.loop.create_task(self._serve(cmd))
                    self.requests.add(req)
                    req.add_done_callback(self._done)
        except BadFrameError as exc:
            log.info("closing the connection from %s: %s", self.peer, exc)
            if self.server.metrics is not None:
                self.server.metrics.bad_frames.inc()
            assert self.transport is not None
            self.transport.close()  # what was answered before the bad frame is still sent
            return
        self._flow()

    def _flow(self) -> None:
        """Read while fewer than MAX_INFLIGHT requests are in flight and the
        client takes its answers."""
        assert self.transport is not None
        want = len(self.requests) < MAX_INFLIGHT and not self.writes_paused
        if want != self.reading and not self.transport.is_closing():
            self.reading = want
            if want:
                self.transport.resume_reading()
            else:
                self.transport.pause_reading()

    def _done(self, req: asyncio.Task[None]) -> None:
        self.requests.discard(req)
        if self.transport is not None and not self.transport.is_closing():
            self._cut()

    def pause_writing(self) -> None:
        self.writes_paused = True
        self._flow()

    def resume_writing(self) -> None:
        self.writes_paused = False
        self._cut()

    def _answer_now(self, cmd: Command) -> bool:
        """Answer ``cmd`` here when that needs no wait (refused by the ACL, or
        ``ReplayBroker.handle_now`` answers it); False: it needs a task."""
        assert self.server.broker is not None
        try:
            resp = self.server.denied(cmd, self.host)
            if resp is None:
                resp = self.server.broker.handle_now(cmd)
                if resp is None:
                    return False
            elif cmd.is_oneway:
                return True
            self._send(resp)
        except Exception:  # a bug of ours: this connection ends, the server goes on
            log.exception("answering request %d failed: closing the connection", cmd.code)
            assert self.transport is not None
            self.transport.close()
        return True

    async def _serve(self, cmd: Command) -> None:
        assert self.transport is not None and self.server.broker is not None
        try:
            resp = await self.server.broker.handle(cmd, self.conn)
            if resp is not None:
                self._send(resp)
        except Exception:  # a bug of ours: this connection ends, the server goes on
            log.exception("answering request %d failed: closing the connection", cmd.code)
            self.transport.close()

    def _send(self, resp: Command) -> None:
        assert self.transport is not None
        if not self.transport.is_closing():
            # one write of head and body: frames never interleave, and it is one
            # send, where the body's copy costs less than a second system call
            self.transport.write(encode_head(resp, len(resp.body)) + resp.body)
