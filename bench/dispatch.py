"""Dispatch throughput, memory and idle cost, with baselines measured in the same run.

    python bench/dispatch.py                 # 1 GiB of 1 KiB messages over 16 queues
    python bench/dispatch.py --size-mb 128   # a quick run

Every timed figure, ours and each baseline's alike, is the best of --repeat
runs (3); the timed runs carry no memory sampler, and the memory figures come
from one more run of each dispatch, sampled.

What it does, each measured phase in a fresh child process (so peak RSS is
that phase's own):

1. Generates a store (cached in --workdir, reused when its size matches):
   1 KiB message bodies round robin over 16 queues, broker-sized
   CommitLog files (1 GiB unless --commitlog-mb).
2. ``cp``: copies the CommitLog files (page cache warm for every phase).
3. dispatch -> file://: one full round (every queue archived to the end).
4. dispatch -> s3:// on a moto server running in its own process, and on a
   real SeaweedFS (``weed`` from the test extra; --seaweedfs 0 to skip):
   moto spends ~5 ms of CPU per request on the cores the dispatcher uses,
   SeaweedFS is a compiled server as S3-compatible stores are.
5. raw boto3 ``put_object`` of the same CommitLog bytes, cut into objects of
   the segment size, with the same parallelism (the goal's baseline); and
   of objects as many and as big as those the dispatcher wrote (data,
   ConsumeQueue, index, manifests): what the archive's protocol costs on
   moto, ~5 ms of its CPU per request. Each on a fresh moto server.
6. idle: a store of --idle-queues queues (1,000), archived once; then one more round with
   nothing new: its CPU seconds and object-store requests.
7. steady: write requests per segment once the queues exist. A store of
   --queues queues gets one record each and a first round (which creates
   each queue's head and the catalog); then records are appended to the
   same queues and further rounds archive them in small segments (16 KiB),
   48 a queue, so every queue seals manifest chunks (one each 16 segments,
   carried in segment objects): every write request of those rounds
   (file://; the count is the same on any store) over their segments.

MB/s counts CommitLog bytes (the records), the same bytes for every
baseline; the ConsumeQueue, index and manifest objects the dispatcher also
writes are overhead it carries. The floor for a durable copy is ``cp -r``
then ``sync`` of the same bytes; plain ``cp`` (never synced) is printed for
reference, and so is an O_DIRECT write + fsync of the same bytes in
segment-size objects (what a writer around the page cache can do at best on
this disk; not the goal's floor). CPU seconds and peak RSS include the segment-build worker
processes (read from /proc: they are the forkserver's children). The same
bytes are also dispatched from a store of ``--many-queues`` queues.

8. read+build alone: each store's round again, its CommitLog passes
   recorded, then run once more with the same jobs over the same bytes
   once the round is over, nothing uploaded beside them (``--pass-alone``).

Every store file is dropped from the page cache and read back before the
phases, so each run starts from the cache a broker has for a CommitLog read
from disk, whatever wrote the files. The pass maps the CommitLog, so its
cost moves with the page size the cache holds the file in: the share in
2 MiB pages is printed, and read+build alone is measured once more over the
CommitLog cached in 4 KiB pages, for reference (a copy made with ``cp -r``
is cached so; on this machine's kernel, 6.18 with ext4, a file written
through a shared mapping as the broker writes its CommitLog was 84 % in
2 MiB pages, and one read back 97 % at 1 GiB).

Goals (issue 16): file:// >= 0.5 x cp+sync on 2 cores (0.8 on 16), <= 1.5
CPU s per GB, S3 >= 0.8 x raw boto3, <= 2 write requests per segment in
steady state (the first round's figure, which includes creating the
catalog, is printed for reference), peak RSS <= 300 MiB also with 1,000
queues, idle round <= 0.5 s CPU and 0 requests (an idle round reads the
bucket identity at most once a minute, ``dispatch.identity_check``), and
read+build over 1,000 queues <= 1.25 x its cost over 16 for the same bytes:
in CPU, in the round, and in time with nothing beside it. Its time inside
the round is printed for reference: there it also waits for the GIL while
the upload threads write one object and one commit per queue, 62x the
objects at 256 MiB and 12x at 1 GiB (the whole round's ratio is printed
too, as a reference: see the README). The core count is printed first:
figures from a shared or small machine are indicative.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmem import AnonPeak, NoPeak, PssPeak, maxrss_mib  # noqa: E402
from floors import MiB, mbps, measure_cp, moto_servers, seaweed_servers  # noqa: E402
from pagecache import huge_share, reread, reread_small  # noqa: E402

QUEUES = 16
TOPIC = "BenchTopic"  # not the broker's "BenchmarkTest" system topic
CLUSTER, BROKER = "BenchCluster", "bench-broker"


# --- measuring helpers ------------------------------------------------------------


def set_aside(path: Path) -> None:
    """``path`` moved out of the way beside it, into ``aside/``, its files
    emptied but not deleted (``main`` deletes them all at the end). On ext4
    without a journal (this machine's), each file created within a minute or
    so of many deletions makes the kernel step over the recently deleted
    inodes one by one (``recently_deleted`` in ``find_inode_bit``): a
    1,000-queue round started right after the previous one's output was
    deleted took 3.6-4.2 s instead of 2.7-3.0, measuring the bench's own
    deletions rather than dispatching."""
    if not path.exists():
        return
    for root, _dirs, files in os.walk(path):
        for name in files:
            os.truncate(os.path.join(root, name), 0)  # the space back, the inode kept
    aside = path.parent / "aside"
    aside.mkdir(exist_ok=True)
    path.rename(aside / f"{path.name}-{len(os.listdir(aside))}")


def commitlog_bytes(store: Path) -> int:
    """Bytes of records in the CommitLog: what the queues' ConsumeQueues point at."""
    from tiered.store.localstore import LocalStore

    with LocalStore(store) as local:
        return sum(local.pending(t, q, 0, max_entries=1 << 40)[1] for t, q in local.queues())


# --- phases (each runs in its own process) --------------------------------------------


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


WRITE_OPS = ("put", "put_if_absent", "put_if_match")


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


def run_phase(name: str, args: argparse.Namespace, **extra: object) -> dict:
    cmd = [sys.executable, __file__, "--phase", name, "--workdir", args.workdir, "--size-mb", str(args.size_mb),
           "--parallelism", str(args.parallelism), "--segment-mb", str(args.segment_mb),
           "--commitlog-mb", str(args.commitlog_mb), "--idle-queues", str(args.idle_queues),
           "--queues", str(args.queues), "--many-queues", str(args.many_queues), "--layout", str(args.layout),
           "--repeat", str(args.repeat)]
    if args.pass_mb:
        cmd += ["--pass-mb", str(args.pass_mb)]
    for k, v in extra.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"phase {name} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


MEMORY_KEYS = ("pss_peak_mib", "anon_peak_mib", "maxrss_mib")


def best_of(runs: list[dict]) -> dict:
    """The fastest run, with the least CPU any run took (both best-of, as the
    baselines are)."""
    best = dict(min(runs, key=lambda r: r["seconds"]))
    best["cpu_seconds"] = min(r["cpu_seconds"] for r in runs)
    best["pass_seconds"] = min(r["pass_seconds"] for r in runs)
    best["pass_cpu_seconds"] = min(r["pass_cpu_seconds"] for r in runs)
    return best


def measure_dispatch(args: argparse.Namespace, cold: Path, **extra: object) -> dict:
    """``args.repeat`` timed file:// rounds into a fresh ``cold``, unsampled,
    the best counting; then one sampled round for the memory figures."""
    runs = []
    for sample in [0] * args.repeat + [1]:
        set_aside(cold)
        runs.append(run_phase("dispatch", args, url=f"file://{cold}", sample=sample, **extra))
    set_aside(cold)
    best = best_of(runs[:-1])
    best.update({k: runs[-1][k] for k in MEMORY_KEYS})
    return best


def measure_pass_alone(args: argparse.Namespace, cold: Path, **extra: object) -> dict:
    """The round's passes with nothing uploaded beside them (``phase_dispatch``,
    ``--pass-alone``), ``args.repeat`` times: the best wall and CPU."""
    runs = []
    for _ in range(args.repeat):
        set_aside(cold)
        runs.append(run_phase("dispatch", args, url=f"file://{cold}", sample=0, pass_alone=1, **extra))
    set_aside(cold)
    return best_of(runs)


def measure_s3(args: argparse.Namespace, work: Path, nbytes: int, servers: Callable) -> dict[str, Any]:
    """The dispatch round on an S3 server, raw boto3 puts of the same bytes,
    and puts of the very objects the dispatcher wrote: each into a fresh
    bucket (on moto, a fresh server), ``args.repeat`` times, the best
    counting; memory from one more sampled round."""
    with servers(work) as fresh:
        return _measure_s3(args, work, nbytes, fresh)


def _measure_s3(args: argparse.Namespace, work: Path, nbytes: int, fresh: Callable) -> dict[str, Any]:
    """Runs interleaved (dispatch, raw, same objects; again), so no side
    gets the server when it is fresher, and a last dispatch, sampled."""
    import boto3

    def dispatch(sample: int) -> tuple[dict, list[int]]:
        with fresh("bench-tiered") as (endpoint, bucket):
            run = run_phase("dispatch", args, url=f"s3://{bucket}/archive", endpoint=endpoint, sample=sample)
            assert run["bytes"] == nbytes
            listing = boto3.client("s3", endpoint_url=endpoint).get_paginator("list_objects_v2")
            return run, [o["Size"] for page in listing.paginate(Bucket=bucket) for o in page.get("Contents", [])]

    def put(**extra: object) -> dict:
        with fresh("bench-raw") as (endpoint, bucket):
            return run_phase("raw_boto3", args, endpoint=endpoint, bucket=bucket, **extra)

    runs, raws, sames = [], [], []
    sizes_file = work / "written-sizes.json"
    for _ in range(args.repeat):
        run, written = dispatch(0)
        runs.append(run)
        # the same bytes in objects of the size the dispatcher produced; and the
        # objects the dispatcher wrote, as many and as big (data, manifests,
        # chunks, catalog, lease): what the protocol costs
        object_bytes = -(-nbytes // run["segments"])
        raws.append(put(bytes=nbytes, object_bytes=object_bytes))
        sizes_file.write_text(json.dumps(written))
        sames.append(put(bytes=sum(written), object_bytes=0, sizes=sizes_file))
    sd = best_of(runs)
    sampled, _ = dispatch(1)
    sd.update({k: sampled[k] for k in MEMORY_KEYS})
    raw = min(raws, key=lambda r: r["seconds"])
    same = min(sames, key=lambda r: r["seconds"])
    return {"sd": sd, "raw": raw, "same": same, "written": written, "object_bytes": object_bytes}


def ratio(many: dict, few: dict, key: str) -> float:
    """``key`` per byte the passes read, ``many`` over ``few``."""
    if not few[key] or not few["pass_bytes"] or not many["pass_bytes"]:
        return float("nan")
    return (many[key] / many["pass_bytes"]) / (few[key] / few["pass_bytes"])


def report(args: argparse.Namespace, nbytes: int, cp: dict[str, float], fd: dict, fm: dict, fd_noix: dict,
           s3s: dict[str, dict[str, Any]], idle: dict, steady: dict, alone: dict[str, dict]) -> None:
    cp_s, cp_sync_s, cp_mbps, cp_sync_mbps = cp["cp_s"], cp["cp_sync_s"], cp["cp_mbps"], cp["cp_sync_mbps"]
    f_mbps = mbps(nbytes, fd["seconds"])
    m_mbps = mbps(fm["bytes"], fm["seconds"])
    sd = s3s["moto"]["sd"]
    gb = nbytes / 1e9
    # every write request of the first round (data objects, commits, chunks,
    # the catalog it creates), not the start's (lease, identity, probe)
    writes = sum(sd["round_requests"].get(op, 0) for op in WRITE_OPS)
    rss = max(fd["maxrss_mib"], *(s3["sd"]["maxrss_mib"] for s3 in s3s.values()))
    rss_many = max(fm["maxrss_mib"], idle["maxrss_mib"])
    pss = max(fd["pss_peak_mib"], *(s3["sd"]["pss_peak_mib"] for s3 in s3s.values()))
    pss_many = fm["pss_peak_mib"]

    def dispatched(r: dict) -> str:
        return (f"{r['seconds']:.2f} s, {r['segments']} segments, CPU {r['cpu_seconds']:.2f} s, "
                f"read+build {r['pass_seconds']:.2f} s (CPU {r['pass_cpu_seconds']:.2f} s) in {r['passes']} "
                f"CommitLog passes, peak PSS {r['pss_peak_mib']:.0f} MiB (RSS {r['maxrss_mib']:.0f})")

    rows = [
        ("dispatch -> file://", f"{f_mbps:8.1f} MB/s", dispatched(fd)),
        ("cp + sync (same bytes)", f"{cp_sync_mbps:8.1f} MB/s", f"{cp_sync_s:.2f} s"),
        ("cp (no sync; reference)", f"{cp_mbps:8.1f} MB/s", f"{cp_s:.2f} s"),
        ("O_DIRECT write+fsync (ref.)", f"{cp['direct_mbps']:8.1f} MB/s",
         f"{cp['direct_s']:.2f} s, CPU {cp['direct_cpu']:.2f} s: the same bytes in {args.segment_mb} MiB objects "
         f"written around the page cache, each fsynced, then their directory (a reference, not the goal's floor)"),
        (f"file://, {args.many_queues} queues", f"{m_mbps:8.1f} MB/s", dispatched(fm)),
    ]
    s3_checks = []
    for server, s3 in s3s.items():
        sd_, raw, same = s3["sd"], s3["raw"], s3["same"]
        s_mbps, raw_mbps, same_mbps = (mbps(nbytes, sd_["seconds"]), mbps(raw["bytes"], raw["seconds"]),
                                       mbps(nbytes, same["seconds"]))
        rows += [
            (f"dispatch -> {server} s3://", f"{s_mbps:8.1f} MB/s", dispatched(sd_)),
            (f"boto3 put_object ({server})", f"{raw_mbps:8.1f} MB/s", f"{raw['seconds']:.2f} s, same bytes, "
             f"{s3['object_bytes'] / MiB:.1f} MiB objects, {args.parallelism} threads"),
            ("  put of the same objects", f"{same_mbps:8.1f} MB/s", f"{same['seconds']:.2f} s: the "
             f"{len(s3['written'])} objects the dispatcher wrote, as big, no other work"),
        ]
        s3_checks += [(f"{server} vs raw boto3", s_mbps / raw_mbps, ">=", 0.8),
                      (f"{server} vs same objects (ref.)", s_mbps / same_mbps, None, None)]
    rows += [
        (f"read+build alone, {args.queues} q.", f"{mbps(alone['fd']['pass_bytes'], alone['fd']['pass_seconds']):8.1f} MB/s",
         f"{alone['fd']['pass_seconds']:.2f} s, CPU {alone['fd']['pass_cpu_seconds']:.2f} s in {alone['fd']['passes']} "
         f"passes: the round's passes run again once it is over, nothing beside them"),
        (f"read+build alone, {args.many_queues} q.",
         f"{mbps(alone['fm']['pass_bytes'], alone['fm']['pass_seconds']):8.1f} MB/s",
         f"{alone['fm']['pass_seconds']:.2f} s, CPU {alone['fm']['pass_cpu_seconds']:.2f} s in {alone['fm']['passes']} "
         f"passes"),
        *[(f"  in 4 KiB pages, {q} q.", f"{mbps(r['pass_bytes'], r['pass_seconds']):8.1f} MB/s",
           f"{r['pass_seconds']:.2f} s, CPU {r['pass_cpu_seconds']:.2f} s: the same passes over the CommitLog "
           f"cached in 4 KiB pages ({100 * alone['pages']['small']:.0f} % in 2 MiB pages, against "
           f"{100 * alone['pages']['read_back']:.0f} % read back)")
          for q, r in ((args.queues, alone["fd4k"]), (args.many_queues, alone["fm4k"]))],
        ("(file://, no key index)", f"{mbps(nbytes, fd_noix['seconds']):8.1f} MB/s",
         f"{fd_noix['seconds']:.2f} s, CPU {fd_noix['cpu_seconds']:.2f} s: what the key index costs"),
    ]
    print()
    for name, rate, note in rows:
        print(f"{name:26s} {rate}   {note}")
    checks = [
        ("file:// vs cp+sync", f_mbps / cp_sync_mbps, ">=", 0.5 if (os.cpu_count() or 1) <= 2 else 0.8),
        ("file:// vs cp (ref.)", f_mbps / cp_mbps, None, None),
        ("file:// vs O_DIRECT (ref.)", f_mbps / cp["direct_mbps"], None, None),
        ("CPU s per GB (file://)", fd["cpu_seconds"] / gb, "<=", 1.5),
        # the pass's own CPU (its threads'), in the round: what read+build costs
        (f"{args.many_queues} vs {args.queues} q. read+build CPU", (fm["pass_cpu_seconds"] / fm["bytes"]) / (
            fd["pass_cpu_seconds"] / nbytes) if fd["pass_cpu_seconds"] else float("nan"), "<=", 1.25),
        # its time with nothing else running; in the round its wall time also counts
        # waiting for the GIL while the upload threads write one object and one commit per queue
        (f"{args.many_queues} vs {args.queues} q. read+build alone", ratio(alone["fm"], alone["fd"], "pass_seconds"),
         "<=", 1.25),
        (f"{args.many_queues} vs {args.queues} q. same, CPU alone", ratio(alone["fm"], alone["fd"], "pass_cpu_seconds"),
         "<=", 1.25),
        (f"{args.many_queues} vs {args.queues} q. CPU alone, 4 KiB (ref.)",
         ratio(alone["fm4k"], alone["fd4k"], "pass_cpu_seconds"), None, None),
        (f"{args.many_queues} vs {args.queues} q. r+b in round (ref.)", (fm["pass_seconds"] / fm["bytes"]) / (
            fd["pass_seconds"] / nbytes) if fd["pass_seconds"] else float("nan"), None, None),
        (f"{args.many_queues} vs {args.queues} q. whole (ref.)", (fm["seconds"] / fm["bytes"]) / (
            fd["seconds"] / nbytes), None, None),
        *s3_checks,
        # the goal is the steady state's: a first round also creates each queue's head and the catalog
        ("write req./seg. first (ref.)", writes / max(1, sd["segments"]), None, None),
        ("write req./seg. steady state", steady["writes"] / max(1, steady["segments"]), "<=", 2),
        ("peak PSS MiB (all processes)", pss, "<=", 300),
        (f"peak PSS MiB, {args.many_queues} q.", pss_many, "<=", 300),
        ("peak RSS MiB (ref.)", rss, None, None),
        (f"peak RSS MiB, {args.many_queues} q. (ref.)", rss_many, None, None),
        ("idle round CPU s", idle["cpu_seconds"], "<=", 0.5),
        ("idle round requests", idle["requests"], "<=", 0),
    ]
    ops = ", ".join(f"{k} {v}" for k, v in sorted(sd["requests"].items()))
    print(f"\nrequests of the moto round: {ops} ({sd['segments']} segments; the start's included)")
    print(f"write requests per segment: first round {writes} for {sd['segments']} segments (creating each "
          f"queue's head and the catalog); steady state {steady['writes']} for {steady['segments']} segments "
          f"({', '.join(f'{k} {v}' for k, v in sorted(steady['writes_by_op'].items()))}; {steady['queues']} "
          f"queues of {steady['min_segments_per_queue']}+ segments, {steady['queues_with_chunks']} of them "
          f"with manifest chunks, {steady['carried_chunks']} chunks carried in segment objects)")
    print(f"idle round over {idle['queues']} queues: {idle['cpu_seconds']:.3f} s CPU, "
          f"{idle['seconds']:.3f} s wall, {idle['requests']} requests, peak RSS {idle['maxrss_mib']:.0f} MiB")
    print(f"peak anonymous memory (sampled, dispatcher process): "
          f"{max(fd['anon_peak_mib'], *(s3['sd']['anon_peak_mib'] for s3 in s3s.values())):.0f} MiB\n")
    for name, value, op, goal in checks:
        if op is None:  # a reference: no goal, so no verdict
            print(f"{name:30s} {value:8.3f}")
            continue
        ok = value >= goal if op == ">=" else value <= goal
        print(f"{name:30s} {value:8.3f}  goal {op} {goal}  {'OK' if ok else 'MISSED'}")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mb", type=int, default=1024, help="CommitLog bytes to generate (default 1024)")
    ap.add_argument("--workdir", default=None, help="where the store and archives go (default: a temp dir)")
    ap.add_argument("--parallelism", type=int, default=4)
    ap.add_argument("--segment-mb", type=int, default=16,
                    help="segment (object) size, MiB; memory is bounded by parallelism x this (default 16)")
    ap.add_argument("--commitlog-mb", type=int, default=1024, help="CommitLog file size, MiB")
    ap.add_argument("--idle-queues", type=int, default=1_000)
    ap.add_argument("--queues", type=int, default=QUEUES, help="queues of the main store (default 16)")
    ap.add_argument("--many-queues", type=int, default=1_000,
                    help="queues of the second store, same bytes (default 1000)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--phase", choices=sorted(PHASES), help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--endpoint", help=argparse.SUPPRESS)
    ap.add_argument("--bucket", help=argparse.SUPPRESS)
    ap.add_argument("--bytes", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--object-bytes", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--sizes", help=argparse.SUPPRESS)
    ap.add_argument("--no-key-index", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--layout", type=int, default=2, help="segment layout written (default 2, as configured)")
    ap.add_argument("--pass-mb", type=int, default=None,
                    help="dispatch.pass_bytes, MiB (default: parallelism x segment size, as configured)")
    ap.add_argument("--store-name", default="store", help=argparse.SUPPRESS)
    ap.add_argument("--repeat", type=int, default=3,
                    help="timed runs of each dispatch and each baseline, the best counting for each alike "
                         "(default 3); memory comes from one more run, sampled")
    ap.add_argument("--sample", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--pass-alone", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--flavor", choices=("4x", "5x"), default="4x", help=argparse.SUPPRESS)
    ap.add_argument("--compare-5x", action="store_true",
                    help="only compare a 5.x store with a 4.x one of the same bytes (CPU per GB, ratio)")
    ap.add_argument("--seaweedfs", type=int, default=1,
                    help="also measure on a real SeaweedFS (weed, from the test extra) beside moto (default 1)")
    return ap


def compare_5x(args: argparse.Namespace, work: Path) -> None:
    """Goal (issue 30): a 5.x store costs no more per GB to archive than a
    4.x one of the same bytes. Both stores made here, read back into the page
    cache alike, each dispatched to file:// (best of --repeat) and its round's
    passes replayed alone; the ratios are 5.x over 4.x."""
    stores = {"4x": "store-4x", "5x": "store-5x"}
    gen = {flavor: run_phase("generate", args, store_name=name, flavor=flavor) for flavor, name in stores.items()}
    for name in stores.values():
        for f in sorted((work / name / "commitlog").iterdir()):
            reread(f)
    print(f"{os.cpu_count()} cores; {args.size_mb} MiB of 1 KiB messages over {args.queues} queues; "
          f"4.x {gen['4x']['bytes'] / MiB:.0f} MiB, 5.x {gen['5x']['bytes'] / MiB:.0f} MiB of records", flush=True)
    cold = work / "cold-file"
    runs = {flavor: (measure_dispatch(args, cold, store_name=name),
                     measure_pass_alone(args, cold, store_name=name)) for flavor, name in stores.items()}
    per_gb: dict[str, tuple[float, float]] = {}
    for flavor, (round_, alone) in runs.items():
        if round_["bytes"] != gen[flavor]["bytes"]:
            raise SystemExit(f"{flavor}: archived {round_['bytes']} of {gen[flavor]['bytes']} bytes")
        gb = round_["bytes"] / 1e9
        per_gb[flavor] = (round_["cpu_seconds"] / gb, alone["pass_cpu_seconds"] / gb)
        print(f"{flavor}: round CPU {per_gb[flavor][0]:.3f} s/GB, read+build alone CPU {per_gb[flavor][1]:.3f} s/GB, "
              f"peak PSS {round_['pss_peak_mib']:.0f} MiB", flush=True)
    for i, what in enumerate(("round CPU per GB", "read+build CPU per GB alone")):
        r = per_gb["5x"][i] / per_gb["4x"][i]
        print(f"5.x vs 4.x, {what}: {r:.3f} (goal <= 1.0 within noise; {'OK' if r <= 1.1 else 'MISS'})")
    for name in stores.values():
        shutil.rmtree(work / name, ignore_errors=True)


def main() -> None:
    args = parser().parse_args()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")

    if args.phase:
        hide_modules(os.environ.get(HIDE_ENV, ""))
        print(json.dumps(PHASES[args.phase](args)))
        return

    import tempfile

    tmp = None
    if args.workdir is None:
        tmp = tempfile.mkdtemp(prefix="tiered-bench-")
        args.workdir = tmp
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    if args.compare_5x:
        try:
            compare_5x(args, work)
        finally:
            shutil.rmtree(work / "state", ignore_errors=True)
            if tmp and not args.keep:
                shutil.rmtree(tmp, ignore_errors=True)
        return
    try:
        marker = work / "store.json"
        meta = json.loads(marker.read_text()) if marker.exists() else {}
        want = {"size_mb": args.size_mb, "commitlog_mb": args.commitlog_mb, "queues": args.queues,
                "many_queues": args.many_queues}
        if any(meta.get(k) != v for k, v in want.items()):
            print(f"generating {args.size_mb} MiB of 1 KiB messages over {args.queues} and over "
                  f"{args.many_queues} queues ...", flush=True)
            gen = run_phase("generate", args)
            many = run_phase("generate", args, store_name="store-many", queues=args.many_queues)
            meta = {**want, **gen, "many_bytes": many["bytes"]}
            marker.write_text(json.dumps(meta))
        nbytes = meta["bytes"]
        print(f"{os.cpu_count()} cores; store: {meta['messages']} messages, {nbytes / MiB:.0f} MiB of records, "
              f"{args.queues} queues; parallelism {args.parallelism}, segments {args.segment_mb} MiB, "
              f"pass_bytes {f'{args.pass_mb} MiB' if args.pass_mb else 'default'}", flush=True)
        # The page cache once for everybody, as a broker's holds a CommitLog it
        # read back from disk: each file dropped from the cache, then read
        # (readahead). How the pages got there matters: the pass maps the
        # CommitLog, and a copy made with `cp -r` (4 KiB pages in the cache)
        # measured 6x the mapping cost of the same file read back.
        commitlogs = [f for name in ("store", "store-many") for f in sorted((work / name / "commitlog").iterdir())]
        for f in commitlogs:
            reread(f)
        huge = huge_share(commitlogs)
        print(f"CommitLog page cache read back: {100 * huge:.0f} % in 2 MiB pages", flush=True)

        cp = measure_cp(work, nbytes, args.repeat, args.segment_mb * MiB)
        cold = work / "cold-file"
        fd = measure_dispatch(args, cold)
        assert fd["bytes"] == nbytes, (fd["bytes"], nbytes)

        # the same bytes over many queues
        fm = measure_dispatch(args, cold, store_name="store-many", queues=args.many_queues)
        assert fm["bytes"] == meta["many_bytes"], (fm["bytes"], meta["many_bytes"])

        # read+build of both stores with no upload competing for the GIL
        alone = {"fd": measure_pass_alone(args, cold),
                 "fm": measure_pass_alone(args, cold, store_name="store-many", queues=args.many_queues)}
        # the same over a CommitLog cached in 4 KiB pages (a reference: the
        # mapping's cost moves with the cache's page size), then as before
        for f in commitlogs:
            reread_small(f)
        alone["pages"] = {"read_back": huge, "small": huge_share(commitlogs)}
        alone["fd4k"] = measure_pass_alone(args, cold)
        alone["fm4k"] = measure_pass_alone(args, cold, store_name="store-many", queues=args.many_queues)
        for f in commitlogs:
            reread(f)

        # what the per-segment key index costs (informational; the default keeps it)
        fd_noix = measure_dispatch(args, cold, no_key_index=1)

        s3s = {"moto": measure_s3(args, work, nbytes, moto_servers)}
        if args.seaweedfs:
            s3s["seaweedfs"] = measure_s3(args, work, nbytes, seaweed_servers)
        idle = run_phase("idle", args, url=f"file://{work / 'cold-idle'}", store_name="store-idle")
        shutil.rmtree(work / "cold-idle", ignore_errors=True)
        shutil.rmtree(work / "store-idle", ignore_errors=True)
        steady = run_phase("steady", args, url=f"file://{work / 'cold-steady'}", store_name="store-steady")
        shutil.rmtree(work / "cold-steady", ignore_errors=True)
        shutil.rmtree(work / "store-steady", ignore_errors=True)

        report(args, nbytes, cp, fd, fm, fd_noix, s3s, idle, steady, alone)
    finally:
        shutil.rmtree(work / "aside", ignore_errors=True)  # what set_aside kept from the runs
        shutil.rmtree(work / "state", ignore_errors=True)  # the runs' manifest caches
        if tmp and not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
