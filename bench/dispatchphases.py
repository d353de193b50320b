"""The dispatch bench's phases: each runs in a fresh child process
(``bench/dispatch.py --phase NAME``), so its peak RSS is its own, and
prints its figures as one JSON line (``benchkit.run_phase`` reads it)."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path

from benchmem import AnonPeak, NoPeak, PssPeak, maxrss_mib
from floors import MiB

TOPIC = "BenchTopic"  # not the broker's "BenchmarkTest" system topic
CLUSTER, BROKER = "BenchCluster", "bench-broker"
WRITE_OPS = ("put", "put_if_absent", "put_if_match")


def commitlog_bytes(store: Path) -> int:
    """Bytes of records in the CommitLog: what the queues' ConsumeQueues point at."""
    from tiered.store.localstore import LocalStore

    with LocalStore(store) as local:
        return sum(local.pending(t, q, 0, max_entries=1 << 40)[1] for t, q in local.queues())


# A 5.x broker's store: records of a topic longer than 127 bytes are magic
# V2 (2-byte topic length), hosts may be IPv6, and after a restart in default
# mode the checkpoint's confirm offset is stale (the start of the last record
# recovered), which binds nothing (tiered/store/brokermode.py).
TOPIC_5X = "BenchTopic5x-" + "v2" * 60
STORE_HOST_5X = ("fd12:3456:789a::9", 10911)


def phase_generate(args: argparse.Namespace) -> dict:
    from tiered.format.codec import Host
    from tiered.store.storewriter import StoreWriter

    store = Path(args.workdir) / args.store_name
    if store.exists():
        shutil.rmtree(store)
    queues = args.queues
    body = os.urandom(1024)
    target = args.size_mb * MiB
    five = getattr(args, "flavor", "4x") == "5x"
    topic, host = (TOPIC_5X, Host(*STORE_HOST_5X)) if five else (TOPIC, Host("127.0.0.1", 10911))
    started = time.perf_counter()
    n = 0
    confirm = 0
    with StoreWriter(store, commitlog_file_size=args.commitlog_mb * MiB, buffer_bytes=8 * MiB,
                     store_host=host) as w:
        while w.position < target:
            # vary the first bytes so bodies (and CRCs) differ; no copy of the rest
            at = w.put(topic, n % queues, n.to_bytes(8, "big") + body[8:], keys=[f"k{n}"])
            if w.position < target // 2:
                confirm = at.commitlog_offset  # a restart half-way, as recoverNormally leaves it
            n += 1
        if five:
            w.write_checkpoint(confirm_offset=confirm)
    return {"messages": n, "bytes": commitlog_bytes(store), "seconds": time.perf_counter() - started}


def _dispatcher(args: argparse.Namespace, url: str, endpoint: str | None, recorder=None,  # noqa: ANN001, ANN202
                segment_bytes: int | None = None):
    from tiered.dispatcher import ArchiveOptions, Dispatcher, DispatchOptions
    from tiered.archive.coldtier import ColdTier
    from tiered.archive.lease import LeaseManager
    from tiered.store.localstore import LocalStore
    from tiered.archive.storage import S3Options, open_store

    store = open_store(url, s3=S3Options(endpoint_url=endpoint), recorder=recorder)
    # named by the URL alone, the same in every phase's process (``hash()`` of
    # a str is salted a process: each run left a new directory behind)
    state = Path(args.workdir) / "state" / hashlib.sha256(url.encode()).hexdigest()[:16]
    shutil.rmtree(state, ignore_errors=True)
    cold = ColdTier(store, CLUSTER, BROKER, state_dir=state, writer="bench")
    # the layout the configuration writes by default (dispatch.layout: 2): one object per segment
    options = DispatchOptions(archive=ArchiveOptions(upload_bytes=1, max_delay_ms=0,
                                             segment_bytes=segment_bytes or args.segment_mb * MiB,
                                             key_index=not getattr(args, "no_key_index", 0),
                                             layout=getattr(args, "layout", 2)),
                              parallelism=args.parallelism, round_budget_s=float("inf"),
                              pass_bytes=args.pass_mb * MiB if args.pass_mb else None)
    local = LocalStore(Path(args.workdir) / args.store_name)
    return Dispatcher(local, cold, lease=LeaseManager(store, f"{CLUSTER}/{BROKER}", "bench"), options=options,
                      recorder=recorder)


def phase_dispatch(args: argparse.Namespace) -> dict:
    rec = _counting_recorder()
    d = _dispatcher(args, args.url, args.endpoint, recorder=rec)
    d.start()
    replayed = _record_passes() if getattr(args, "pass_alone", 0) else None
    before = dict(rec.ops)  # the start's requests (lease, identity, probe) are not the round's
    sampled = bool(getattr(args, "sample", 1))
    with (AnonPeak() if sampled else NoPeak()) as anon, (PssPeak() if sampled else NoPeak()) as pss:
        started = time.perf_counter()
        cpu = time.process_time()
        result = d.run_round()
        seconds = time.perf_counter() - started
        cpu = time.process_time() - cpu
    cpu -= anon.cpu_seconds + pss.cpu_seconds  # reading /proc/PID/smaps_rollup is not dispatching
    if not result.ok or result.lag_messages:
        raise SystemExit(f"dispatch round incomplete: {result}")
    passes = getattr(d.archiver, "passes", []) if replayed is None else _replay(d.local, replayed)
    return {"bytes": result.nbytes, "messages": result.messages, "segments": result.segments, "seconds": seconds,
            "cpu_seconds": cpu, "maxrss_mib": maxrss_mib(), "anon_peak_mib": anon.peak_kib / 1024, "requests": dict(rec.ops),
            "round_requests": {k: v - before.get(k, 0) for k, v in rec.ops.items() if v > before.get(k, 0)},
            "pss_peak_mib": pss.peak_kib / 1024, "pass_seconds": sum(p.seconds for p in passes),
            "pass_cpu_seconds": sum(p.cpu_seconds for p in passes), "pass_bytes": sum(p.nbytes for p in passes),
            "passes": len(passes)}


def _record_passes() -> list[list]:
    """The jobs of every CommitLog pass the round makes, as it makes them
    (``_replay`` runs them again)."""
    import tiered.dispatcher.archiver as archiver

    jobs_of: list[list] = []
    real = archiver.build_pass

    def recording(local, jobs, options):  # noqa: ANN001, ANN202
        jobs_of.append(list(jobs))
        return real(local, jobs, options)

    archiver.build_pass = recording
    return jobs_of


def _replay(local, jobs_of: list[list]) -> list:  # noqa: ANN001
    """read+build alone: the round's passes once more, the same jobs over the
    same bytes, once the round is over (nothing uploaded or committed beside
    them, no upload thread asking for the GIL), each pass's buffers given
    back to the pool as the round's uploads give them back."""
    from tiered.dispatcher.commitpass import build_pass
    from tiered.dispatcher.segment import SEGMENT_BUFFERS

    stats = []
    for jobs in jobs_of:
        passed, st = build_pass(local, jobs)
        stats.append(st)
        for _job, builder, _stop in passed.values():
            if builder.count:  # built (untimed) and its buffer given back as an upload gives it back
                cl = builder.build(0).commitlog
                SEGMENT_BUFFERS.give(cl)  # kept while the pool has room
        del passed
    return stats


def phase_raw_boto3(args: argparse.Namespace) -> dict:
    """put_object of the CommitLog records' bytes in segment-sized objects."""
    import boto3
    from concurrent.futures import ThreadPoolExecutor
    from botocore.config import Config

    client = boto3.client("s3", endpoint_url=args.endpoint, config=Config(
        retries={"total_max_attempts": 1}, max_pool_connections=max(10, args.parallelism)))
    files = sorted((Path(args.workdir) / "store" / "commitlog").iterdir())
    # objects of one size cut from the CommitLog bytes, or (--sizes) exactly
    # as many objects of the sizes the dispatcher wrote
    sizes = json.loads(Path(args.sizes).read_text()) if args.sizes else None
    total = sum(sizes) if sizes else args.bytes

    def chunks():  # noqa: ANN202
        """Objects of the wanted sizes, cut from the CommitLog files read as one stream."""
        want = iter(sizes) if sizes else (min(args.object_bytes, total - i) for i in range(0, total, args.object_bytes))
        handles = iter(files)
        fh = open(next(handles), "rb")
        try:
            for n in want:
                data = fh.read(n)
                while len(data) < n:  # the file ended: go on in the next one
                    fh.close()
                    fh = open(next(handles), "rb")
                    data += fh.read(n - len(data))
                yield data
        finally:
            fh.close()

    # as many objects in memory as the dispatcher's segments, the next read as
    # soon as any upload ends (not the oldest: no thread waits on another's)
    room = threading.Semaphore(args.parallelism)
    started = time.perf_counter()
    sent = 0
    with ThreadPoolExecutor(args.parallelism) as pool:
        futures = []
        for i, data in enumerate(chunks()):
            room.acquire()
            fut = pool.submit(client.put_object, Bucket=args.bucket, Key=f"raw/{i:08d}", Body=data)
            fut.add_done_callback(lambda _f: room.release())
            futures.append(fut)
            sent += len(data)
        for fut in futures:
            fut.result()
    seconds = time.perf_counter() - started
    return {"bytes": sent, "seconds": seconds, "maxrss_mib": maxrss_mib()}


def _counting_recorder():  # noqa: ANN202
    from collections import Counter

    from tiered.recorder import NullRecorder

    class Counting(NullRecorder):
        def __init__(self) -> None:
            self.ops: Counter[str] = Counter()

        @property
        def requests(self) -> int:
            return sum(self.ops.values())

        def store_request(self, op: str, outcome: str, seconds: float) -> None:
            self.ops[op] += 1

    return Counting()


def phase_idle(args: argparse.Namespace) -> dict:
    from tiered.store.storewriter import StoreWriter

    store = Path(args.workdir) / args.store_name
    shutil.rmtree(store, ignore_errors=True)
    per_topic = 1000  # 10 topics x 1000 queues: the broker's topics.json stays small
    started = time.perf_counter()
    with StoreWriter(store, commitlog_file_size=64 * MiB, cq_entries_per_file=1000) as w:
        for i in range(args.idle_queues):
            w.put(f"Idle{i // per_topic:03d}", i % per_topic, b"x" * 100)
    generated = time.perf_counter() - started
    rec = _counting_recorder()
    d = _dispatcher(args, args.url, None, recorder=rec)
    started = time.perf_counter()
    first = d.run_round()  # archives one message per queue
    assert first.ok and first.messages == args.idle_queues, first
    archived = time.perf_counter() - started
    before = rec.requests
    cpu = time.process_time()
    started = time.perf_counter()
    result = d.run_round()
    cpu = time.process_time() - cpu
    seconds = time.perf_counter() - started
    return {"queues": result.queues, "cpu_seconds": cpu, "seconds": seconds, "maxrss_mib": maxrss_mib(),
            "requests": rec.requests - before, "generate_seconds": generated, "first_round_seconds": archived}



def phase_steady(args: argparse.Namespace) -> dict:
    """Write requests per segment after the first round (see the module docstring, 7)."""
    from tiered.store.storewriter import StoreWriter

    store = Path(args.workdir) / args.store_name
    shutil.rmtree(store, ignore_errors=True)
    segment_bytes, per_queue, rounds = 16 * 1024, 48, 4
    body = os.urandom(1024)
    rec = _counting_recorder()
    with StoreWriter(store, commitlog_file_size=64 * MiB) as w:
        for q in range(args.queues):
            w.put(TOPIC, q, body, keys=[f"first-{q}"])
        d = _dispatcher(args, args.url, None, recorder=rec, segment_bytes=segment_bytes)
        first = d.run_round()
        assert first.ok and first.segments == args.queues, first
        first_writes = sum(rec.ops[op] for op in WRITE_OPS)
        before = dict(rec.ops)
        segments, n = 0, 0
        # about 15 records of ~1.1 KiB a segment: per_queue / rounds segments a queue each round
        for _ in range(rounds):
            for q in range(args.queues):
                for _ in range(per_queue // rounds * (segment_bytes // 1100)):
                    w.put(TOPIC, q, n.to_bytes(8, "big") + body[8:], keys=[f"k{n}"])
                    n += 1
            w.flush()
            d.local.refresh()
            result = d.run_round()
            assert result.ok and not result.lag_messages, result
            segments += result.segments
    heads = [d.cold.cached(TOPIC, q) for q in range(args.queues)]
    writes = {op: rec.ops[op] - before.get(op, 0) for op in WRITE_OPS}
    return {"queues": args.queues, "first_segments": first.segments, "first_writes": first_writes,
            "segments": segments, "writes": sum(writes.values()), "writes_by_op": writes,
            "min_segments_per_queue": min(len(m.segments) for m in heads if m is not None),
            "queues_with_chunks": sum(1 for m in heads if m is not None and m.chunks),
            "carried_chunks": sum(1 for m in heads if m is not None for k in m.chunk_keys if "/segment/" in k)}


# bench/native.py: modules (comma-separated) a phase's process must not
# import, as on an install that did not build them
HIDE_ENV = "TIERED_BENCH_HIDE"


class _Hidden:
    """A meta path finder refusing ``names``: their importers take the path
    they take without a C compiler."""

    def __init__(self, names: set[str]) -> None:
        self.names = names

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name in self.names:
            raise ImportError(f"{name} hidden by {HIDE_ENV}", name=name)


def hide_modules(spec: str) -> None:
    names = {n for n in spec.split(",") if n}
    if not names:
        return
    if loaded := names & set(sys.modules):
        raise SystemExit(f"{sorted(loaded)} imported before {HIDE_ENV} could hide them")
    sys.meta_path.insert(0, _Hidden(names))


PHASES = {"generate": phase_generate, "dispatch": phase_dispatch, "raw_boto3": phase_raw_boto3, "idle": phase_idle,
          "steady": phase_steady}
