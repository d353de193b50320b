"""Cleaner throughput and request economy over a cold tier of many small segments.

    python bench/clean.py                          # 100,000 segments, file:// and moto
    python bench/clean.py --segments 20000 --backend file

For each backend (file:// in a temporary directory, and S3 served by an
in-process moto server on 127.0.0.1, reached through the real boto3/s3fs
clients), builds a cold tier of ``--segments`` small segments spread over
``--queues`` queues (commitlog, consumequeue and index objects, and a
manifest per queue; all but each queue's newest segment past retention).
The objects are written straight to the backing store (files, or moto's
backend) so building stays quick; the cleaner sees an ordinary cold tier.

Then, with a ``CollectorRegistry``-free counting recorder on the store:

1. baseline: the same number of keys deleted with ``ObjectStore.delete_many``
   alone (no planning, no manifest) on a twin set of objects;
2. a cold start (manifests loaded from the bucket, not counted as cleaning);
3. one clean pass: segments deleted per second, object-store requests per
   deleted segment (all, and delete requests alone), and the ratio of its
   keys/s to the baseline's;
4. a second pass with nothing expired: its request count (goal: 0).

Goals printed with the results: <= 0.01 delete requests per deleted segment,
0 requests for a pass with nothing expired once manifests are cached.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time
import zlib
from collections import Counter
from pathlib import Path

from benchdocs import add_option, recorded
from tiered.cleaner import CleanOptions, Cleaner
from tiered.clock import ManualClock
from tiered.archive.coldtier import ColdTier
from tiered.config import RetentionSettings
from tiered.archive.manifest import CATALOG, MANIFEST, Catalog, CatalogEntry, Manifest, Segment, queue_prefix, segment_keys
from tiered.recorder import NullRecorder
from tiered.archive.storage import ObjectStore, RetryPolicy, S3Options, open_store

CLUSTER, BROKER = "BenchCluster", "bench-broker"
NOW_MS = 1_750_000_000_000
HOUR_MS = 3_600_000
CL_BYTES = 200
GOAL_DELETE_REQUESTS_PER_SEGMENT = 0.01


class Counting(NullRecorder):
    def __init__(self) -> None:
        self.requests: Counter[str] = Counter()

    def store_request(self, op: str, outcome: str, seconds: float) -> None:
        self.requests[op] += 1


def build_manifests(segments: int, queues: int) -> dict[tuple[str, int], Manifest]:
    per = segments // queues
    out = {}
    for q in range(queues):
        topic, qid = f"Topic{q % 10}", q // 10
        prefix = queue_prefix(CLUSTER, BROKER, topic, qid)
        segs = []
        for i in range(per):
            cl, cq, ix = segment_keys(prefix, i * CL_BYTES, (i + 1) * CL_BYTES, i, i + 1)
            # all but the newest segment are past the 1 h retention
            t = NOW_MS - (2 * HOUR_MS if i < per - 1 else 60_000) + i
            segs.append(Segment(q_start=i, q_end=i + 1, cl_start=i * CL_BYTES, cl_end=(i + 1) * CL_BYTES, min_store_ms=t, max_store_ms=t, min_born_ms=t, max_born_ms=t, commitlog_key=cl, consumequeue_key=cq, index_key=ix, commitlog_crc=zlib.crc32(b"c" * CL_BYTES), consumequeue_crc=zlib.crc32(b"q" * 20), created_ms=t))
        out[(topic, qid)] = Manifest(topic=topic, queue_id=qid, next_offset=per, cl_next=per * CL_BYTES, generation=1,
                                     segments=tuple(segs))
    return out


def objects_of(manifests: dict[tuple[str, int], Manifest]):  # noqa: ANN201 - an iterator of (key, bytes)
    # the catalog, as the dispatcher leaves it: a cold start is one GET plus one per manifest; the
    # broker's retention (1 h) recorded in it, which a cleaner without the broker's store goes by
    entries = tuple(sorted((CatalogEntry.of(m) for m in manifests.values()), key=lambda e: (e.topic, e.queue_id)))
    retention = {topic: (1.0, "reserve.time") for topic, _q in manifests}
    yield f"{CLUSTER}/{BROKER}/{CATALOG}", Catalog(CLUSTER, BROKER, entries, NOW_MS, retention=retention).to_bytes()
    for m in manifests.values():
        yield f"{queue_prefix(CLUSTER, BROKER, m.topic, m.queue_id)}/{MANIFEST}", m.to_bytes()
        for s in m.segments:
            yield s.commitlog_key, b"c" * CL_BYTES
            yield s.consumequeue_key, b"q" * 20
            yield s.index_key, b"i" * 32


def run(store: ObjectStore, put_raw, segments: int, queues: int, state: Path) -> dict[str, float]:  # noqa: ANN001
    manifests = build_manifests(segments, queues)
    started = time.perf_counter()
    n_objects = 0
    for key, data in objects_of(manifests):
        put_raw(key, data)
        n_objects += 1
    baseline_keys = [f"baseline/{i:08d}" for i in range(min(segments * 3, 60_000))]
    for key in baseline_keys:
        put_raw(key, b"b" * 20)
    print(f"  built {n_objects:,} objects (+{len(baseline_keys):,} baseline) in {time.perf_counter() - started:.1f} s",
          flush=True)

    counting = Counting()
    store.recorder = counting
    t = time.perf_counter()
    store.delete_many(baseline_keys)
    base_s = time.perf_counter() - t
    base_rate = len(baseline_keys) / base_s

    clock = ManualClock(NOW_MS)
    cold = ColdTier(store, CLUSTER, BROKER, state_dir=state, writer="bench", clock=clock)
    t = time.perf_counter()
    cold.load()
    load_s = time.perf_counter() - t
    cleaner = Cleaner(cold, retention=RetentionSettings(default_hours=1), options=CleanOptions(merge=False),
                      clock=clock, recorder=None)

    counting.requests.clear()
    t = time.perf_counter()
    report = cleaner.run_pass(orphans=False)
    clean_s = time.perf_counter() - t
    if not report.ok:
        raise SystemExit(f"clean pass failed: {report.errors}")
    first = Counter(counting.requests)
    deleted = report.expired_segments

    counting.requests.clear()
    clock.advance(60)
    idle = cleaner.run_pass(orphans=False)
    idle_requests = sum(counting.requests.values())
    assert idle.ok and idle.expired_segments == 0

    total = sum(first.values())
    return {
        "deleted": deleted, "seconds": clean_s, "rate": deleted / clean_s, "keys_rate": 3 * deleted / clean_s,
        "requests": total, "per_segment": total / deleted, "delete_requests": first["delete"],
        "delete_per_segment": first["delete"] / deleted, "commits": first["put_if_match"],
        "base_rate": base_rate, "load_s": load_s, "idle_requests": idle_requests,
        "breakdown": dict(first),
    }


def report(name: str, r: dict) -> bool:  # noqa: ANN001
    ok_batch = r["delete_per_segment"] <= GOAL_DELETE_REQUESTS_PER_SEGMENT
    ok_idle = r["idle_requests"] == 0
    print(f"  cold start (load manifests from the bucket): {r['load_s']:.2f} s")
    print(f"  deleted {r['deleted']:,} segments in {r['seconds']:.2f} s: {r['rate']:,.0f} segments/s "
          f"({r['keys_rate']:,.0f} keys/s)")
    print(f"  baseline delete_many alone: {r['base_rate']:,.0f} keys/s; cleaner/baseline = "
          f"{r['keys_rate'] / r['base_rate']:.2f}")
    print(f"  requests: {r['requests']} ({r['breakdown']}) = {r['per_segment']:.4f} per deleted segment")
    print(f"  delete requests per deleted segment: {r['delete_per_segment']:.4f} "
          f"(goal <= {GOAL_DELETE_REQUESTS_PER_SEGMENT}) {'OK' if ok_batch else 'MISSED'}")
    print(f"  pass with nothing expired: {r['idle_requests']} requests (goal 0) {'OK' if ok_idle else 'MISSED'}")
    return ok_batch and ok_idle


def bench_file(segments: int, queues: int, workdir: Path) -> bool:
    root = workdir / "cold"

    def put_raw(key: str, data: bytes) -> None:
        path = root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    store = open_store(f"file://{root}", retry=RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.1))
    print(f"file:// ({root})", flush=True)
    return report("file", run(store, put_raw, segments, queues, workdir / "state-file"))


def bench_s3(segments: int, queues: int, workdir: Path) -> bool:
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench-key-id")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench-secret")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    import boto3
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        bucket = "tiered-bench"
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
        backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]

        def put_raw(key: str, data: bytes) -> None:  # straight into moto's backend: building is not measured
            backend.put_object(bucket, f"archive/{key}", data)

        store = open_store(f"s3://{bucket}/archive", s3=S3Options(endpoint_url=endpoint),
                           retry=RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.1))
        print(f"s3:// (moto on {endpoint})", flush=True)
        return report("s3", run(store, put_raw, segments, queues, workdir / "state-s3"))
    finally:
        server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--segments", type=int, default=100_000)
    ap.add_argument("--queues", type=int, default=100)
    ap.add_argument("--backend", choices=["file", "s3", "both"], default="both")
    ap.add_argument("--dir", type=Path, default=None, help="where to build the file:// tier (default: a temp dir)")
    add_option(ap)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    workdir = Path(tempfile.mkdtemp(prefix="tiered-bench-clean-", dir=args.dir))
    ok = True
    try:
        with recorded(args, "clean"):
            print(f"cold tier of {args.segments:,} segments over {args.queues} queues")
            if args.backend in ("file", "both"):
                ok &= bench_file(args.segments, args.queues, workdir)
            if args.backend in ("s3", "both"):
                ok &= bench_s3(args.segments, args.queues, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
