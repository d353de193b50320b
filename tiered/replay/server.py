"""The asyncio TCP server: frames in, handler answers out.

Requests on one connection are served concurrently (clients pipeline them,
matched by opaque), at most ``MAX_INFLIGHT`` at a time per connection, so a
held pull never delays another queue's pull. A frame that cannot be decoded
closes its connection, as Netty's decoder does on the broker; nothing a
client sends stops the server or another connection.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable

from tiered.errors import BadFrameError, BadRequestError
from tiered.replay.acl import Acl
from tiered.replay.broker import ReplayBroker
from tiered.replay.frame import Command, decode, encode_head, frame_length
from tiered.replay.metrics import ReplayMetrics
from tiered.replay.protocol import response

log = logging.getLogger(__name__)

MAX_INFLIGHT = 64


class ReplayServer:
    def __init__(self, broker_for: Callable[[str], ReplayBroker], host: str, port: int,
                 metrics: ReplayMetrics | None = None, acl: Acl | None = None, max_connections: int = 0) -> None:
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
        self._conns: set[asyncio.Task[None]] = set()
        self.metrics = metrics
        self.acl = acl
        self.max_connections = max_connections

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._connection, self.host, self.port)
        port = self._server.sockets[0].getsockname()[1]
        address = f"{self.host}:{port}"
        self.broker = self._broker_for(address)
        return address

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._conns):
            task.cancel()
        await asyncio.gather(*self._conns, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None and self.broker is not None
        peer = writer.get_extra_info("peername")
        if self.max_connections and len(self._conns) >= self.max_connections:
            log.info("refusing the connection from %s: %d connections open", peer, len(self._conns))
            if self.metrics is not None:
                self.metrics.refused.inc()
            writer.close()
            return
        self._conns.add(task)
        conn = next(self._ids)
        host = str(peer[0]) if isinstance(peer, tuple) else ""
        inflight = asyncio.Semaphore(MAX_INFLIGHT)
        requests: set[asyncio.Task[None]] = set()
        if self.metrics is not None:
            self.metrics.connections.inc()
        try:
            while True:
                length = frame_length(await reader.readexactly(4))
                cmd = decode(await reader.readexactly(length))
                if cmd.is_response:
                    continue  # replay sends no requests: a stray response is dropped
                await inflight.acquire()
                req = asyncio.create_task(self._serve(cmd, conn, host, writer, inflight))
                requests.add(req)
                req.add_done_callback(requests.discard)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client went away, maybe mid-frame
        except BadFrameError as exc:
            log.info("closing the connection from %s: %s", peer, exc)
            if self.metrics is not None:
                self.metrics.bad_frames.inc()
        finally:
            if self.metrics is not None:
                self.metrics.connections.dec()
            self._conns.discard(task)
            for req in list(requests):
                req.cancel()
            self.broker.closed(conn)
            writer.close()

    async def _serve(self, cmd: Command, conn: int, host: str, writer: asyncio.StreamWriter,
                     inflight: asyncio.Semaphore) -> None:
        try:
            assert self.broker is not None
            resp = self._denied(cmd, host)
            if resp is None:
                resp = await self.broker.handle(cmd, conn)
            elif cmd.is_oneway:
                return
            if resp is None or writer.is_closing():
                return
            # head and body written with no await between: frames never interleave
            writer.write(encode_head(resp, len(resp.body)))
            if resp.body:
                writer.write(resp.body)
            await writer.drain()
        except ConnectionError:
            pass
        except Exception:  # a bug of ours: this connection ends, the server goes on
            log.exception("answering request %d failed: closing the connection", cmd.code)
            writer.close()
        finally:
            inflight.release()

    def _denied(self, cmd: Command, host: str) -> Command | None:
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
