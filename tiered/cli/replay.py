"""``tiered replay``: a read-only RocketMQ broker and name server over the archive.

Unmodified RocketMQ clients (4.x remoting protocol) point their name server
address at it and consume archived messages again, as stored. Settings come
from the same YAML and ``TIERED_*`` environment as ``serve``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any, Optional

import typer
from prometheus_client import CollectorRegistry

from tiered.cli.app import app, fail
from tiered.cli.common import BrokerOpt, ClusterOpt, ColdOpt, ConfigOpt, settings_from
from tiered.cli.wiring import archive_store, setup_logging, shown_url
from tiered.clock import SystemClock
from tiered.config import parse_duration
from tiered.errors import TieredError
from tiered.metrics import MetricsServer
from tiered.replay.aclfile import AclFile, watch
from tiered.replay.broker import Limits, ReplayBroker
from tiered.replay.lag import GroupLagCollector
from tiered.replay.metrics import ReplayMetrics
from tiered.replay.offsets import GroupOffsets
from tiered.replay.server import ReplayServer
from tiered.replay.registry import Registry, listen_ports, pick_brokers
from tiered.replay.source import ArchiveSource
from tiered.replay.start import Start, parse_start

log = logging.getLogger("tiered.replay")

# the broker persists consumer offsets every 5 s (flushConsumerOffsetInterval)
FLUSH_INTERVAL_S = 5.0
READ_THREADS = 8
# /healthz fails once the event loop has not beaten for this long
LIVENESS_S = 30.0
BEAT_S = 1.0
# open client connections beyond which a new one is closed at once (bounded memory)
MAX_CONNECTIONS = 4096


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"--listen {value}: HOST:PORT")
    if host in ("0.0.0.0", "::", "[::]", "*"):
        # the route hands this address to clients: it must be one they can reach
        raise ValueError(f"--listen {value}: an address clients reach (the route advertises it), not a wildcard")
    return host.strip("[]"), int(port)


def exposure_warning(host: str, acl: bool = False) -> str | None:
    """A warning when ``host`` is reachable from other machines and no
    ``--acl`` is given: whoever reaches it reads the whole archive."""
    if acl:
        return None
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if loopback:
        return None
    return (f"replay listens on {host}, not a loopback address, and checks no credentials (no --acl): "
            "anyone who reaches it reads every archived message of the broker")


def follow_seconds(value: str) -> float:
    """``--follow-interval``: a duration, or 0 for a fixed snapshot."""
    if value.strip() in ("0", "0s"):
        return 0.0
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise ValueError(f"--follow-interval {value}: {exc}") from None


async def _flush(offsets: GroupOffsets, executor: ThreadPoolExecutor) -> None:
    try:
        await asyncio.get_running_loop().run_in_executor(executor, offsets.flush)
    except TieredError as exc:
        log.warning("consumer offsets not written (kept for the next try): %s", exc)
    except Exception:  # a bug of ours: logged, the commits are kept and serving goes on
        log.exception("consumer offsets not written (kept for the next try)")


async def _follow(source: ArchiveSource, server: ReplayServer, executor: ThreadPoolExecutor, every_s: float) -> None:
    """Read the archive again every ``every_s`` and wake the pulls held on
    queues that grew."""
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(every_s)
        try:
            grown = await loop.run_in_executor(executor, source.refresh)
        except TieredError as exc:
            log.warning("archive not read again (serving what was read before): %s", exc)
            continue
        except Exception:  # a bug of ours: logged, and following goes on
            log.exception("archive not read again (serving what was read before)")
            continue
        if grown and server.broker is not None:
            server.broker.arrived(grown)


async def _watch_acl(acl: AclFile, executor: ThreadPoolExecutor, metrics: ReplayMetrics) -> None:
    """Read the --acl file again when it changes (off the event loop), counting each change."""
    loop = asyncio.get_running_loop()

    def off_loop(fn: Callable[[], str | None]) -> Awaitable[str | None]:
        return loop.run_in_executor(executor, fn)

    await watch(acl, off_loop, lambda outcome: metrics.acl_reloads.labels(outcome).inc())


class Liveness:
    """``/healthz``: the event loop beat within ``LIVENESS_S`` (a loop stuck
    in a handler answers nobody, whatever the metrics thread says)."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.monotonic = monotonic
        self.beat = monotonic()

    def alive(self) -> tuple[bool, str]:
        age = self.monotonic() - self.beat
        return (True, "ok") if age < LIVENESS_S else (False, f"event loop silent for {age:.0f}s")

    async def run(self) -> None:
        while True:
            self.beat = self.monotonic()
            await asyncio.sleep(BEAT_S)


@dataclass(frozen=True, kw_only=True)
class Archived:
    """One archived broker to serve: its archive and its groups' offsets."""

    source: ArchiveSource
    offsets: GroupOffsets


async def _start_servers(served: list[Archived], host: str, ports: list[int], executor: ThreadPoolExecutor,
                         metrics: ReplayMetrics, *, acl: AclFile | None, max_connections: int,
                         **broker_kw: Any) -> list[ReplayServer]:
    """One listener per archived broker (a pull does not name its broker);
    every one answers routes naming them all."""
    registry = Registry()
    servers: list[ReplayServer] = []
    for one, at in zip(served, ports):
        def broker_for(address: str, one: Archived = one) -> ReplayBroker:
            registry.add(one.source, address)
            return ReplayBroker(one.source, one.offsets, address=address, executor=executor, metrics=metrics,
                                registry=registry, **broker_kw)
        server = ReplayServer(broker_for, host, at, metrics=metrics, acl=acl, max_connections=max_connections)
        try:
            await server.start()
        except OSError:
            for started in servers:
                await started.close()
            raise
        servers.append(server)
    return servers


async def run(served: list[Archived], host: str, ports: list[int], *,
              starts: dict[str, Start], follow_s: float, metrics_addr: tuple[str, int], acl: AclFile | None = None,
              max_connections: int = MAX_CONNECTIONS) -> None:
    """Serve until SIGTERM or SIGINT, following the archive every ``follow_s``
    (0: never) and writing offsets every few seconds and at the end; metrics
    and probes on ``metrics_addr``."""
    executor = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="replay-read")
    registry = CollectorRegistry()
    metrics = ReplayMetrics(registry)
    registry.register(GroupLagCollector([(one.source, one.offsets) for one in served]))
    limits = Limits(long_polling=follow_s > 0)
    liveness = Liveness()
    probes = MetricsServer(registry, host=metrics_addr[0], port=metrics_addr[1], alive=liveness.alive,
                           ready=lambda: (True, "serving"))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    servers = await _start_servers(served, host, ports, executor, metrics, acl=acl, max_connections=max_connections,
                                   starts=starts, limits=limits)
    probes.start()
    tasks = [asyncio.create_task(liveness.run())]
    if follow_s > 0:
        tasks += [asyncio.create_task(_follow(one.source, server, executor, follow_s))
                  for one, server in zip(served, servers)]
    if acl is not None:
        tasks.append(asyncio.create_task(_watch_acl(acl, executor, metrics)))
    for one, server in zip(served, servers):
        assert server.broker is not None
        log.info("replay of %s/%s (%d topics) listening on %s", one.source.cluster, one.source.broker,
                 len(one.source.topics), server.broker.address)
        print(f"tiered replay: broker {one.source.cluster}/{one.source.broker} on {server.broker.address}",
              file=sys.stderr, flush=True)
    assert servers[0].broker is not None
    print(f"tiered replay: metrics on {probes.url}", file=sys.stderr, flush=True)
    print(f"tiered replay: serving on {servers[0].broker.address}", file=sys.stderr, flush=True)
    try:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), FLUSH_INTERVAL_S)
            except asyncio.TimeoutError:
                for one in served:
                    await _flush(one.offsets, executor)
    finally:
        for task in tasks:
            task.cancel()
        for server in servers:
            await server.close()
        for one in served:
            await _flush(one.offsets, executor)
        probes.stop()
        executor.shutdown(wait=True)


@app.command()
def replay(
    config: ConfigOpt = None, cold: ColdOpt = None, cluster: ClusterOpt = None, broker: BrokerOpt = None,
    listen: Annotated[Optional[str], typer.Option(
        "--listen", help="HOST:PORT to serve on, as name server and broker; further archived brokers on the "
                    "next ports (port 0: free ones).")] = None,
    start: Annotated[Optional[list[str]], typer.Option(
        "--start", help="GROUP=earliest|latest|client|TIME: where a group with no committed offset starts "
                        "(default earliest; client: the client's consumeFromWhere; TIME as ISO 8601 or epoch ms; "
                        "repeatable).")] = None,
    metrics_port: Annotated[Optional[int], typer.Option(
        "--metrics-port", help="HTTP port for /metrics, /healthz, /readyz (default metrics.port; 0: a free one).")] = None,
    follow_interval: Annotated[str, typer.Option(
        "--follow-interval", help="How often to read the archive again for newly archived records (one GET per "
                                  "queue); 0 serves the archive as it was at start.")] = "10s",
    acl: Annotated[Optional[Path], typer.Option(
        "--acl", envvar="TIERED_REPLAY__ACL",
        help="RocketMQ ACL 1.0 plain_acl.yml, or a directory of them merged as conf/acl is: every request must be signed by one of its accounts.")] = None,
    max_connections: Annotated[int, typer.Option(
        "--max-connections", envvar="TIERED_REPLAY__MAX_CONNECTIONS", min=0,
        help="Open client connections beyond which a new one is closed at once (0: no cap).")] = MAX_CONNECTIONS,
) -> None:
    """Serve the archive to unmodified RocketMQ clients: a read-only broker and name server.

    Point a consumer's name server address at --listen: it pulls archived
    messages as stored (ids, times, keys, tags unchanged), commits offsets
    (kept per group beside the archive), looks offsets up by time; records
    archived while it runs are served too (--follow-interval). A group
    with no committed offset starts at the earliest archived one (--start
    says otherwise). Sends are refused. Every archived broker under the URL is
    served, each on its own port (--listen's, then the next ones); --cluster
    and --broker narrow it to one."""
    settings = settings_from(config, cold_url=cold, cluster=cluster, broker=broker)
    setup_logging(settings.log.format, settings.log.level)
    try:
        host, port = parse_listen(listen or "127.0.0.1:9876")
        starts = dict(parse_start(v) for v in start or ())
        follow_s = follow_seconds(follow_interval)
    except ValueError as exc:
        fail(str(exc), 2)
    try:
        access = AclFile(acl) if acl is not None else None
    except TieredError as exc:
        fail(str(exc), 2)
    warning = exposure_warning(host, acl=access is not None)
    if warning:
        log.warning(warning)
    given = settings.model_fields_set
    try:
        store = archive_store(settings)
        pairs = pick_brokers(store, settings.cluster if "cluster" in given else None,
                             settings.broker if "broker" in given else None)
        sources = [ArchiveSource(store, c, b) for c, b in pairs]
    except TieredError as exc:
        fail(f"{shown_url(settings.cold_url)}: {exc}")
    served = [Archived(source=s, offsets=GroupOffsets(store, s.cluster, s.broker, now_ms=SystemClock().now_ms))
              for s in sources if s.topics]
    if not served:
        names = ", ".join(f"{c}/{b}" for c, b in pairs)
        fail(f"{shown_url(settings.cold_url)}: {names} has no archived queue to replay")
    try:
        ports = listen_ports(port, len(served))
    except ValueError as exc:
        fail(str(exc), 2)
    try:
        asyncio.run(run(served, host, ports, starts=starts, follow_s=follow_s,
                        metrics_addr=(settings.metrics.host,
                                      settings.metrics.port if metrics_port is None else metrics_port),
                        acl=access, max_connections=max_connections))
    except OSError as exc:
        fail(f"--listen {host}:{port}: {exc.strerror or exc}")
