"""Throughput and idle cost of ``tiered replay``.

Builds, in a temporary directory removed afterwards, a store of ``--messages``
messages of ``--body`` bytes over 16 queues (``StoreWriter``), archives it to
``file://`` with the real dispatcher, then measures:

- the library: every queue read through ``ColdReader.read`` (32 records a
  read, as a pull), in this process: the reference;
- replay to one consumer: one client process pulling every queue in turn
  (32 a pull, frames built with the codec), and to 16 consumers: 16 client
  processes, one queue each; messages/s and MB/s of record bytes, against
  the library's (goal: at least 0.5x); with replay's own CPU seconds for
  the one-consumer pass (the Python client shares the machine);
- the floor: the same client against a server that answers each pull
  with its records cut in advance and held in memory (no archive, no
  checks, no accounting), through the same codec, in its own process:
  what the client and TCP cost on this machine, so the share of the gap
  that is replay's own shows;
- idle consumers: ``--idle`` connections each holding a suspended pull at
  the end of a queue (15 s suspend timeout, sent again when answered, as a
  subscribed consumer does; the first pulls spread over one timeout, so the
  answers come at their steady rate): replay's CPU (user + system, from
  /proc) over ``--idle-seconds`` as a share of one core (goal: at most 1 %),
  and its RSS before and with them (goal: at most 100 MiB more); run
  ``--idle-runs`` times.

The client and replay share the machine, and on a busy one the figures move
with the neighbours: each of ``--passes`` rounds runs the library, one
consumer and 16 consumers in turn, and the report gives the rates of the
best pass of each, their ratio to the library's best, and the spread of each
round's own ratio. ``--write-docs`` writes the report into docs/performance.md.

    .venv/bin/python bench/replay.py [--messages 100000] [--body 1024] [--idle 1000] [--write-docs]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import multiprocessing
import os
import resource
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path

from benchdocs import add_option, recorded
from tiered.archive.coldtier import ColdTier
from tiered.archive.storage import open_store
from tiered.dispatcher import ArchiveOptions, Dispatcher, DispatchOptions, TopicFilter
from tiered.query.reader import ColdReader, QueueRef, ReadStatus
from tiered.replay.frame import RESPONSE_FLAG, Command, decode, encode, encode_head
from tiered.store.localstore import LocalStore
from tiered.store.storewriter import StoreWriter

TOPIC = "BenchTopic"
QUEUES = 16
CLUSTER, BROKER = "BenchCluster", "bench-broker"
SUSPEND_S = 15  # an idle consumer's suspend timeout (the Java push consumer's)


def build(base: Path, messages: int, body: int) -> tuple[str, dict[int, int]]:
    """The archive's URL and each queue's message count."""
    root = base / "store"
    payload = os.urandom(body)
    with StoreWriter(root, commitlog_file_size=256 << 20, cq_entries_per_file=300_000, buffer_bytes=8 << 20) as w:
        for i in range(messages):
            w.put(TOPIC, i % QUEUES, payload, tags="TagA", keys=[f"k{i}"], unique_key=f"{i:032X}",
                  store_timestamp=1_700_000_000_000 + i)
    store = open_store(f"file://{base / 'cold'}")
    cold = ColdTier(store, CLUSTER, BROKER, state_dir=base / "state", writer="bench")
    opts = DispatchOptions(archive=ArchiveOptions(upload_bytes=1, max_delay_ms=0), round_budget_s=float("inf"))
    d = Dispatcher(LocalStore(root), cold, options=opts, topic_filter=TopicFilter(include_system=False))
    while True:
        result = d.run_round()
        assert result.ok, result.errors
        if result.lag_messages == 0 and result.segments == 0:
            break
    return f"file://{base / 'cold'}", {q: (messages + QUEUES - 1 - q) // QUEUES for q in range(QUEUES)}


def library(url: str) -> tuple[int, int]:
    reader = ColdReader(open_store(url))
    count = nbytes = 0
    for q in range(QUEUES):
        ref, offset = QueueRef(CLUSTER, BROKER, TOPIC, q), 0
        while (res := reader.read(ref, offset, max_count=32)).status is ReadStatus.FOUND:
            count += len(res.records)
            nbytes += sum(len(r.raw) for r in res.records)
            offset = res.next_offset
    return count, nbytes


class Client:
    def __init__(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)))
        self.opaque = 0

    def send(self, code: int, ext: dict[str, str]) -> int:
        self.opaque += 1
        self.sock.sendall(encode(Command(code=code, opaque=self.opaque, ext=ext)))
        return self.opaque

    def read(self) -> Command:
        head = self._exact(4)
        return decode(self._exact(struct.unpack(">i", head)[0]))

    def _exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            got = self.sock.recv(n - len(buf))
            if not got:
                raise ConnectionError("closed")
            buf += got
        return bytes(buf)


def pull_ext(q: int, offset: int, suspend: bool = False) -> dict[str, str]:
    return {"consumerGroup": "bench", "topic": TOPIC, "queueId": str(q), "queueOffset": str(offset),
            "maxMsgNums": "32", "sysFlag": "2" if suspend else "0", "suspendTimeoutMillis": str(SUSPEND_S * 1000)}


def consumer(address: str, queues: list[int]) -> tuple[int, int]:
    client = Client(address)
    count = nbytes = 0
    for q in queues:
        offset = 0
        while True:
            client.send(11, pull_ext(q, offset))
            resp = client.read()
            if resp.code != 0:
                break
            nxt = int(resp.ext["nextBeginOffset"])
            count += nxt - offset
            nbytes += len(resp.body)
            offset = nxt
    return count, nbytes


class _Floor(asyncio.Protocol):
    """A connection of the floor server: frames cut, pulls answered from memory."""

    def __init__(self, queues: dict[int, tuple[bytes, list[int]]]) -> None:
        self.queues = queues
        self.buf = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while len(self.buf) >= 4 and len(self.buf) >= 4 + (n := struct.unpack_from(">i", self.buf)[0]):
            req = decode(bytes(self.buf[4:4 + n]))
            del self.buf[:4 + n]
            data, ends = self.queues[int(req.ext["queueId"])]
            offset = int(req.ext["queueOffset"])
            end = min(offset + int(req.ext["maxMsgNums"]), len(ends))
            body = memoryview(data)[ends[offset - 1] if offset else 0:ends[end - 1]] if offset < end else b""
            ext = {"nextBeginOffset": str(max(offset, end)), "minOffset": "0", "maxOffset": str(len(ends)),
                   "suggestWhichBrokerId": "0"}
            resp = Command(code=0 if body else 19, opaque=req.opaque, flag=RESPONSE_FLAG,
                           remark="FOUND" if body else "OFFSET_OVERFLOW_ONE", ext=ext, body=body)
            self.transport.write(encode_head(resp, len(body)) + body)


def floor_server(url: str, conn: Connection) -> None:
    """Serve every queue's records, read once through the library, until killed."""
    reader = ColdReader(open_store(url))
    queues = {}
    for q in range(QUEUES):
        ref, offset, raws = QueueRef(CLUSTER, BROKER, TOPIC, q), 0, []
        while (res := reader.read(ref, offset, max_count=1024)).status is ReadStatus.FOUND:
            raws += [r.raw for r in res.records]
            offset = res.next_offset
        queues[q] = (b"".join(raws), list(itertools.accumulate(map(len, raws))))

    async def serve() -> None:
        server = await asyncio.get_running_loop().create_server(lambda: _Floor(queues), "127.0.0.1", 0)
        conn.send(f"127.0.0.1:{server.sockets[0].getsockname()[1]}")
        await asyncio.Event().wait()

    asyncio.run(serve())


def start_replay(url: str) -> tuple[subprocess.Popen[str], str]:
    cmd = [sys.executable, "-m", "tiered.cli", "replay", "--cold", url, "--listen", "127.0.0.1:0",
           "--metrics-port", "0"]
    env = {**os.environ, "TIERED_METRICS__HOST": "127.0.0.1", "TIERED_LOG__LEVEL": "WARNING"}
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stderr is not None
    for line in proc.stderr:
        if line.startswith("tiered replay: serving on "):
            return proc, line.split()[-1]
    raise RuntimeError("replay did not start")


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def idle(address: str, pid: int, ends: dict[int, int], n: int, seconds: float) -> dict[str, float]:
    """``n`` connections each holding a pull at a queue's end, for ``seconds``."""
    before = proc_rss_mib(pid)
    clients = [Client(address) for _ in range(n)]
    sel = selectors.DefaultSelector()
    for i, c in enumerate(clients):
        # spread over one suspend timeout, as consumers started at different times:
        # then any stretch of time sees the steady rate of answers
        c.send(11, pull_ext(i % QUEUES, ends[i % QUEUES], suspend=True))
        sel.register(c.sock, selectors.EVENT_READ, c)
        time.sleep(SUSPEND_S / n)
    cpu0, t0, answered = proc_cpu_s(pid), time.monotonic(), 0
    while (left := seconds - (time.monotonic() - t0)) > 0:
        for key, _ in sel.select(timeout=left):
            c = key.data
            c.read()
            answered += 1
            q = clients.index(c) % QUEUES
            c.send(11, pull_ext(q, ends[q], suspend=True))
    cpu = proc_cpu_s(pid) - cpu0
    with_them = proc_rss_mib(pid)
    for c in clients:
        c.sock.close()
    return {"connections": n, "seconds": seconds, "cpu_share_of_a_core": cpu / seconds,
            "answered_pulls": answered, "rss_mib_before": round(before, 1), "rss_mib_with": round(with_them, 1)}


def timed(fn) -> tuple[float, int, int]:  # noqa: ANN001
    t0 = time.perf_counter()
    count, nbytes = fn()
    return time.perf_counter() - t0, count, nbytes


def spread(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}" if len(values) > 1 else f"{values[0]:.2f}"


def report(*, count: int, mb: float, lib: list[float], one: list[float], many: list[float], floor: list[float],
           one_cpu: list[float], idles: list[dict[str, float]]) -> None:
    """The figures as text: rates from the best pass of each, ratios against
    the library's best, and each round's ratio (library and replay passes
    alternate, so a round's ratio saw the same neighbours)."""
    nproc = len(os.sched_getaffinity(0))
    print(f"replay bench: {count:,} messages, {mb:.1f} MB of records, {QUEUES} queues, nproc {nproc}, "
          f"{len(lib)} rounds")
    print(f"{'':28} {'messages/s':>10} {'MB/s':>7} {'vs library':>10} {'each round':>11}")
    best_lib = min(lib)
    for name, runs in (("library (ColdReader.read)", lib), ("replay, 1 pull consumer", one),
                       ("replay, 16 pull consumers", many), ("floor, 1 pull consumer", floor)):
        ratios = [a / b for a, b in zip(lib, runs)]
        print(f"{name:28} {count / min(runs):>10,.0f} {mb / min(runs):>7.1f} {best_lib / min(runs):>10.2f} "
              f"{spread(ratios):>11}")
    print("goal: replay >= 0.5x the library, with 1 and with 16 consumers")
    print(f"floor: the same client against pulls answered from memory; replay, 1 consumer, at "
          f"{min(floor) / min(one):.2f} of its rate (each round {spread([f / o for f, o in zip(floor, one)])})")
    print(f"replay CPU per pass, 1 consumer: {spread(one_cpu)} s (the client shares the machine)")
    for i, f in enumerate(idles, 1):
        print(f"idle run {i}: {f['connections']:.0f} held pulls for {f['seconds']:.0f} s, {f['answered_pulls']:.0f} "
              f"answered: replay CPU {100 * f['cpu_share_of_a_core']:.2f} % of a core (goal <= 1 %); RSS "
              f"{f['rss_mib_before']:.1f} -> {f['rss_mib_with']:.1f} MiB, "
              f"+{f['rss_mib_with'] - f['rss_mib_before']:.1f} (goal <= +100)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--body", type=int, default=1024)
    ap.add_argument("--idle", type=int, default=1000)
    ap.add_argument("--idle-seconds", type=float, default=30.0)
    ap.add_argument("--idle-runs", type=int, default=2)
    ap.add_argument("--passes", type=int, default=3, help="rounds of library, 1-consumer and 16-consumer passes")
    ap.add_argument("--dir", default=None)
    add_option(ap)
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 4 * args.idle + 256)), hard))
    base = Path(tempfile.mkdtemp(prefix="bench-replay-", dir=args.dir))
    lib: list[float] = []
    one: list[float] = []
    many: list[float] = []
    floor: list[float] = []
    one_cpu: list[float] = []
    ctx = multiprocessing.get_context("spawn")
    try:
        url, ends = build(base, args.messages, args.body)
        proc, address = start_replay(url)
        mine, theirs = ctx.Pipe()
        floor_proc = ctx.Process(target=floor_server, args=(url, theirs), daemon=True)
        floor_proc.start()
        floor_address = mine.recv()
        try:
            with ctx.Pool(QUEUES) as pool:
                pool.map(abs, range(QUEUES))  # the workers have started (and imported) before the clock runs

                def sixteen() -> tuple[int, int]:
                    parts = pool.starmap(consumer, [(address, [q]) for q in range(QUEUES)])
                    return sum(p[0] for p in parts), sum(p[1] for p in parts)

                for _ in range(args.passes):
                    seconds, count, nbytes = timed(lambda: library(url))
                    assert count == args.messages
                    lib.append(seconds)
                    cpu0 = proc_cpu_s(proc.pid)
                    seconds, *got = timed(lambda: consumer(address, list(range(QUEUES))))
                    one_cpu.append(proc_cpu_s(proc.pid) - cpu0)
                    assert tuple(got) == (count, nbytes)
                    one.append(seconds)
                    seconds, *got = timed(sixteen)
                    assert tuple(got) == (count, nbytes)
                    many.append(seconds)
                    seconds, *got = timed(lambda: consumer(floor_address, list(range(QUEUES))))
                    assert tuple(got) == (count, nbytes)
                    floor.append(seconds)
            idles = [idle(address, proc.pid, ends, args.idle, args.idle_seconds) for _ in range(args.idle_runs)]
        finally:
            floor_proc.kill()
            proc.send_signal(signal.SIGINT)
            proc.wait(30)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    with recorded(args, "replay"):
        report(count=count, mb=nbytes / 1e6, lib=lib, one=one, many=many, floor=floor, one_cpu=one_cpu,
               idles=idles)


if __name__ == "__main__":
    main()
