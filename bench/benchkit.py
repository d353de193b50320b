"""What the dispatch bench (and bench/native.py) runs in the parent: each
phase of ``bench/dispatch.py`` in a child process, repeated, the best run
kept, and the work directory kept from measuring the bench's own deletions."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

DISPATCH = Path(__file__).resolve().with_name("dispatch.py")  # the script whose --phase runs a phase
MEMORY_KEYS = ("pss_peak_mib", "anon_peak_mib", "maxrss_mib")


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


def run_phase(name: str, args: argparse.Namespace, **extra: object) -> dict:
    cmd = [sys.executable, str(DISPATCH), "--phase", name, "--workdir", args.workdir, "--size-mb", str(args.size_mb),
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
