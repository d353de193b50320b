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

from tiered.errors import BadFrameError
from tiered.replay.broker import ReplayBroker
from tiered.replay.frame import Command, decode, encode_head, frame_length
from tiered.replay.metrics import ReplayMetrics

log = logging.getLogger(__name__)

MAX_INFLIGHT = 64


class ReplayServer:
    def __init__(self, broker_for: Callable[[str], ReplayBroker], host: str, port: int,
                 metrics: ReplayMetrics | None = None) -> None:
        """``broker_for(address)`` builds the broker once the bound address
        (the one the route advertises) is known: port 0 picks a free one."""
        self._broker_for = broker_for
        self.host = host
        self.port = port
        self.broker: ReplayBroker | None = None
        self._server: asyncio.Server | None = None
        self._ids = itertools.count(1)
        self._conns: set[asyncio.Task[None]] = set()
        self.metrics = metrics

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
        self._conns.add(task)
        conn = next(self._ids)
        peer = writer.get_extra_info("peername")
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
                req = asyncio.create_task(self._serve(cmd, conn, writer, inflight))
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

    async def _serve(self, cmd: Command, conn: int, writer: asyncio.StreamWriter,
                     inflight: asyncio.Semaphore) -> None:
        try:
            assert self.broker is not None
            resp = await self.broker.handle(cmd, conn)
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
