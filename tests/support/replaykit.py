"""An archive to replay, and ``tiered replay`` run as its own process.

The store is written in the broker's format (``StoreWriter``) and archived
by the real dispatcher; replay is started as the CLI command on a free port
(``--listen 127.0.0.1:0``, ``--metrics-port 0``: it prints the addresses).
"""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tiered.archive.coldtier import ColdTier
from tiered.archive.storage import ObjectStore, open_store
from tiered.dispatcher import ArchiveOptions, Dispatcher, DispatchOptions, TopicFilter
from tiered.format.codec import Host
from tiered.store.localstore import LocalStore
from tiered.store.storewriter import StoreWriter

CLUSTER = "ReplayCluster"
BROKER = "broker-x"
T0 = 1_700_000_000_000
TOPICS = {"Orders": 3, "Audit": 1}  # topic -> queues
TAGS = ("TagA", "TagB", None)
REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True, kw_only=True)
class Expected:
    """What a client must see of one archived message."""

    topic: str
    queue_id: int
    queue_offset: int
    body: bytes
    keys: str
    tags: str | None
    msg_id: str
    store_ms: int
    born_ms: int
    store_size: int


def write(root: Path, first: int, count: int, store_host: Host | None = None) -> None:
    """Messages ``first`` .. ``first + count - 1`` of every topic, round robin
    over its queues; store time ``T0 + i`` seconds (appends to a store).
    ``store_host`` is the broker address the records name (StoreWriter's
    default otherwise)."""
    hosted = {} if store_host is None else {"store_host": store_host}
    with StoreWriter(root, commitlog_file_size=1 << 20, cq_entries_per_file=1000, **hosted) as w:
        for topic, queues in TOPICS.items():
            for i in range(first, first + count):
                ts = T0 + i * 1000
                w.put(topic, i % queues, f"{topic} message {i} ".encode() * (1 + i % 7), tags=TAGS[i % 3],
                      keys=[f"{topic}-k{i}", "shared"], unique_key=f"{topic[:2].upper()}{i:030X}",
                      store_timestamp=ts, born_timestamp=ts - 7, born_host=Host(f"10.0.0.{i % 4}", 40000))


def expected(root: Path) -> dict[tuple[str, int, int], Expected]:
    """Every message of the store, by (topic, queue, offset)."""
    local = LocalStore(root)
    out = {}
    for topic, qid in local.queues():
        rng = local.queue_range(topic, qid)
        for item in local.iter_queue(topic, qid, rng.min_offset):
            r = item.record
            out[(topic, qid, item.queue_offset)] = Expected(
                topic=topic, queue_id=qid, queue_offset=item.queue_offset, body=bytes(r.body_bytes()),
                keys=" ".join(r.keys), tags=r.tags, msg_id=r.unique_key, store_ms=r.store_timestamp,
                born_ms=r.born_timestamp, store_size=r.size)
    return out


def archive(root: Path, store: ObjectStore, state_dir: Path, broker: str = BROKER, cluster: str = CLUSTER) -> None:
    """Archive everything in the store, in small segments (several per queue)."""
    cold = ColdTier(store, cluster, broker, state_dir=state_dir, writer="test")
    opts = DispatchOptions(archive=ArchiveOptions(upload_bytes=1, max_delay_ms=0, segment_bytes=4096),
                           parallelism=1, round_budget_s=float("inf"))
    d = Dispatcher(LocalStore(root), cold, options=opts, topic_filter=TopicFilter(include_system=False))
    for _ in range(50):
        result = d.run_round()
        assert result.ok, result.errors
        if result.lag_messages == 0 and result.segments == 0:
            return
    raise AssertionError("the store was not archived in 50 rounds")


class Replay:
    """``tiered replay`` in a subprocess; ``address`` is where it listens."""

    def __init__(self, cold_url: str, *args: str, env: dict[str, str] | None = None,
                 listen: str = "127.0.0.1:0") -> None:
        cmd = [sys.executable, "-m", "tiered.cli", "replay", "--cold", cold_url, "--listen", listen,
               "--metrics-port", "0", *args]
        env = {"TIERED_METRICS__HOST": "127.0.0.1", **(env or {})}
        full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=full_env,
                                     cwd=REPO)
        self.lines: list[str] = []
        found = threading.Event()

        def pump() -> None:
            assert self.proc.stderr is not None
            for line in self.proc.stderr:
                self.lines.append(line.rstrip("\n"))
                if line.startswith("tiered replay: serving on "):
                    found.set()
            found.set()

        threading.Thread(target=pump, daemon=True).start()
        if not found.wait(60) or self.proc.poll() is not None:
            self.proc.kill()
            raise AssertionError("tiered replay did not start:\n" + "\n".join(self.lines))
        self.address = next(x for x in self.lines if x.startswith("tiered replay: serving on ")).rsplit(" ", 1)[1]
        self.metrics_url = next(x for x in self.lines if x.startswith("tiered replay: metrics on ")).rsplit(" ", 1)[1]
        # "cluster/broker" -> the address that archived broker is served on
        self.brokers = {x.split(" ")[3]: x.rsplit(" ", 1)[1] for x in self.lines
                        if x.startswith("tiered replay: broker ")}
        self.host, port = self.address.rsplit(":", 1)
        self.port = int(port)

    def stop(self) -> int:
        """SIGTERM, as Kubernetes stops a pod; the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise

    def __enter__(self) -> Replay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def local_raw(root: Path, topic: str, queue_id: int) -> list[bytes]:
    """The stored bytes of every record of a queue, in offset order."""
    local = LocalStore(root)
    rng = local.queue_range(topic, queue_id)
    return [bytes(i.record.raw) for i in local.iter_queue(topic, queue_id, rng.min_offset)]


class Raw:
    """A bare remoting client: frames built with the codec under test."""

    def __init__(self, address: str) -> None:
        import socket

        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=15)
        self._opaque = 0

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read(self) -> Any:
        """The next frame (a Command), or None when the server closed the connection."""
        from tiered.replay.frame import decode

        head = self._exact(4)
        if head is None:
            return None
        body = self._exact(struct.unpack(">i", head)[0])
        return None if body is None else decode(body)

    def _exact(self, n: int) -> bytes | None:
        out = bytearray()
        while len(out) < n:
            try:
                got = self.sock.recv(n - len(out))
            except ConnectionResetError:
                return None
            if not got:
                return None
            out += got
        return bytes(out)

    def call(self, code: int, ext: dict[str, str] | None = None, body: bytes = b"", **kw: Any) -> Any:
        from tiered.replay.frame import Command, encode

        self._opaque += 1
        self.send(encode(Command(code=code, opaque=self._opaque, ext=ext or {}, body=body, **kw)))
        resp = self.read()
        assert resp is not None and resp.opaque == self._opaque and resp.is_response
        return resp

    def closed(self) -> bool:
        """True once the server has closed the connection."""
        return self._exact(1) is None

    def close(self) -> None:
        self.sock.close()


MESSAGES = 60  # per topic


def free_port() -> int:
    """A port nothing listens on now (for a store host replay then listens on)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Archived:
    root: Path
    cold_url: str
    state: Path
    messages: dict[tuple[str, int, int], Expected]


def make_archive(base: Path, store_host: Host | None = None) -> Archived:
    root, cold, state = base / "store", base / "cold", base / "state"
    write(root, 0, MESSAGES, store_host)
    archive(root, open_store(f"file://{cold}"), state)
    return Archived(root, f"file://{cold}", state, expected(root))
