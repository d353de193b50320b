"""The dispatch bench's report: every figure beside its baselines, then each
goal's ratio and verdict."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import Any

from benchkit import ratio
from dispatchphases import WRITE_OPS
from floors import MiB, mbps

Row = tuple[str, str, str]  # name, rate, note
Check = tuple[str, float, str | None, float | None]  # name, value, ">=" or "<=" (None: a reference), goal


@dataclass(frozen=True, kw_only=True)
class Figures:
    """Everything one run of the bench measured (``bench/dispatch.py``)."""

    args: argparse.Namespace
    nbytes: int  # CommitLog bytes of the main store's records
    cp: dict[str, float]  # the floors: cp, cp + sync, O_DIRECT
    fd: dict  # the file:// round over --queues queues
    fm: dict  # the file:// round over --many-queues queues, the same bytes
    fd_noix: dict  # the file:// round without the key index
    s3s: dict[str, dict[str, Any]]  # per S3 server: its round, raw puts, puts of the same objects
    idle: dict
    steady: dict
    alone: dict[str, dict]  # read+build alone, in 2 MiB and in 4 KiB pages

    @property
    def first_writes(self) -> int:
        """Every write request of the first moto round (data objects, commits,
        chunks, the catalog it creates), not the start's (lease, identity, probe)."""
        return sum(self.s3s["moto"]["sd"]["round_requests"].get(op, 0) for op in WRITE_OPS)


def report(f: Figures) -> None:
    print()
    for name, rate, note in rows(f):
        print(f"{name:26s} {rate}   {note}")
    print_requests(f)
    for name, value, op, goal in checks(f):
        if op is None or goal is None:  # a reference: no goal, so no verdict
            print(f"{name:30s} {value:8.3f}")
            continue
        ok = value >= goal if op == ">=" else value <= goal
        print(f"{name:30s} {value:8.3f}  goal {op} {goal}  {'OK' if ok else 'MISSED'}")


def dispatched(r: dict) -> str:
    return (f"{r['seconds']:.2f} s, {r['segments']} segments, CPU {r['cpu_seconds']:.2f} s, "
            f"read+build {r['pass_seconds']:.2f} s (CPU {r['pass_cpu_seconds']:.2f} s) in {r['passes']} "
            f"CommitLog passes, peak PSS {r['pss_peak_mib']:.0f} MiB (RSS {r['maxrss_mib']:.0f})")


def rows(f: Figures) -> list[Row]:
    args, cp = f.args, f.cp
    return [
        ("dispatch -> file://", f"{mbps(f.nbytes, f.fd['seconds']):8.1f} MB/s", dispatched(f.fd)),
        ("cp + sync (same bytes)", f"{cp['cp_sync_mbps']:8.1f} MB/s", f"{cp['cp_sync_s']:.2f} s"),
        ("cp (no sync; reference)", f"{cp['cp_mbps']:8.1f} MB/s", f"{cp['cp_s']:.2f} s"),
        ("O_DIRECT write+fsync (ref.)", f"{cp['direct_mbps']:8.1f} MB/s",
         f"{cp['direct_s']:.2f} s, CPU {cp['direct_cpu']:.2f} s: the same bytes in {args.segment_mb} MiB objects "
         f"written around the page cache, each fsynced, then their directory (a reference, not the goal's floor)"),
        (f"file://, {args.many_queues} queues", f"{mbps(f.fm['bytes'], f.fm['seconds']):8.1f} MB/s", dispatched(f.fm)),
        *(row for server in f.s3s for row in s3_rows(f, server)),
        *alone_rows(f),
        ("(file://, no key index)", f"{mbps(f.nbytes, f.fd_noix['seconds']):8.1f} MB/s",
         f"{f.fd_noix['seconds']:.2f} s, CPU {f.fd_noix['cpu_seconds']:.2f} s: what the key index costs"),
    ]


def s3_rates(f: Figures, server: str) -> tuple[float, float, float]:
    """MB/s of the round on ``server``, of raw puts of the same bytes, and of puts of the same objects."""
    s3 = f.s3s[server]
    return (mbps(f.nbytes, s3["sd"]["seconds"]), mbps(s3["raw"]["bytes"], s3["raw"]["seconds"]),
            mbps(f.nbytes, s3["same"]["seconds"]))


def s3_rows(f: Figures, server: str) -> list[Row]:
    s3 = f.s3s[server]
    raw, same = s3["raw"], s3["same"]
    s_mbps, raw_mbps, same_mbps = s3_rates(f, server)
    return [
        (f"dispatch -> {server} s3://", f"{s_mbps:8.1f} MB/s", dispatched(s3["sd"])),
        (f"boto3 put_object ({server})", f"{raw_mbps:8.1f} MB/s", f"{raw['seconds']:.2f} s, same bytes, "
         f"{s3['object_bytes'] / MiB:.1f} MiB objects, {f.args.parallelism} threads"),
        ("  put of the same objects", f"{same_mbps:8.1f} MB/s", f"{same['seconds']:.2f} s: the "
         f"{len(s3['written'])} objects the dispatcher wrote, as big, no other work"),
    ]


def alone_rows(f: Figures) -> list[Row]:
    args, alone = f.args, f.alone
    fd, fm = alone["fd"], alone["fm"]
    return [
        (f"read+build alone, {args.queues} q.", f"{mbps(fd['pass_bytes'], fd['pass_seconds']):8.1f} MB/s",
         f"{fd['pass_seconds']:.2f} s, CPU {fd['pass_cpu_seconds']:.2f} s in {fd['passes']} "
         f"passes: the round's passes run again once it is over, nothing beside them"),
        (f"read+build alone, {args.many_queues} q.", f"{mbps(fm['pass_bytes'], fm['pass_seconds']):8.1f} MB/s",
         f"{fm['pass_seconds']:.2f} s, CPU {fm['pass_cpu_seconds']:.2f} s in {fm['passes']} passes"),
        *[(f"  in 4 KiB pages, {q} q.", f"{mbps(r['pass_bytes'], r['pass_seconds']):8.1f} MB/s",
           f"{r['pass_seconds']:.2f} s, CPU {r['pass_cpu_seconds']:.2f} s: the same passes over the CommitLog "
           f"cached in 4 KiB pages ({100 * alone['pages']['small']:.0f} % in 2 MiB pages, against "
           f"{100 * alone['pages']['read_back']:.0f} % read back)")
          for q, r in ((args.queues, alone["fd4k"]), (args.many_queues, alone["fm4k"]))],
        ("file://, in 4 KiB pages", f"{mbps(f.nbytes, alone['round4k']['seconds']):8.1f} MB/s",
         f"{alone['round4k']['seconds']:.2f} s, CPU {alone['round4k']['cpu_seconds']:.2f} s: the round of the first "
         f"row over the CommitLog cached in 4 KiB pages, as kernels without large folios cache it"),
    ]


def print_requests(f: Figures) -> None:
    """The request counts behind the write-request goal, the idle round and the sampled memory."""
    sd, steady, idle = f.s3s["moto"]["sd"], f.steady, f.idle
    ops = ", ".join(f"{k} {v}" for k, v in sorted(sd["requests"].items()))
    print(f"\nrequests of the moto round: {ops} ({sd['segments']} segments; the start's included)")
    print(f"write requests per segment: first round {f.first_writes} for {sd['segments']} segments (creating each "
          f"queue's head and the catalog); steady state {steady['writes']} for {steady['segments']} segments "
          f"({', '.join(f'{k} {v}' for k, v in sorted(steady['writes_by_op'].items()))}; {steady['queues']} "
          f"queues of {steady['min_segments_per_queue']}+ segments, {steady['queues_with_chunks']} of them "
          f"with manifest chunks, {steady['carried_chunks']} chunks carried in segment objects)")
    print(f"idle round over {idle['queues']} queues: {idle['cpu_seconds']:.3f} s CPU, "
          f"{idle['seconds']:.3f} s wall, {idle['requests']} requests, peak RSS {idle['maxrss_mib']:.0f} MiB")
    print(f"peak anonymous memory (sampled, dispatcher process): "
          f"{max(f.fd['anon_peak_mib'], *(s3['sd']['anon_peak_mib'] for s3 in f.s3s.values())):.0f} MiB\n")


def checks(f: Figures) -> list[Check]:
    cp, fd = f.cp, f.fd
    f_mbps = mbps(f.nbytes, fd["seconds"])
    return [
        ("file:// vs cp+sync", f_mbps / cp["cp_sync_mbps"], ">=", 0.5 if (os.cpu_count() or 1) <= 2 else 0.8),
        ("file:// vs cp (ref.)", f_mbps / cp["cp_mbps"], None, None),
        ("file:// vs O_DIRECT (ref.)", f_mbps / cp["direct_mbps"], None, None),
        ("CPU s per GB (file://)", fd["cpu_seconds"] / (f.nbytes / 1e9), "<=", 1.5),
        ("CPU s per GB, 4 KiB pages", f.alone["round4k"]["cpu_seconds"] / (f.nbytes / 1e9), "<=", 1.5),
        *queue_checks(f),
        *(check for server in f.s3s for check in s3_checks(f, server)),
        # the goal is the steady state's: a first round also creates each queue's head and the catalog
        ("write req./seg. first (ref.)", f.first_writes / max(1, f.s3s["moto"]["sd"]["segments"]), None, None),
        ("write req./seg. steady state", f.steady["writes"] / max(1, f.steady["segments"]), "<=", 2),
        *memory_checks(f),
        ("idle round CPU s", f.idle["cpu_seconds"], "<=", 0.5),
        ("idle round requests", f.idle["requests"], "<=", 0),
    ]


def queue_checks(f: Figures) -> list[Check]:
    """Many queues against few, for the same bytes."""
    args, fd, fm, alone, nbytes = f.args, f.fd, f.fm, f.alone, f.nbytes
    vs = f"{args.many_queues} vs {args.queues} q."
    return [
        # the pass's own CPU (its threads'), in the round: what read+build costs
        (f"{vs} read+build CPU", (fm["pass_cpu_seconds"] / fm["bytes"]) / (
            fd["pass_cpu_seconds"] / nbytes) if fd["pass_cpu_seconds"] else float("nan"), "<=", 1.25),
        # its time with nothing else running; in the round its wall time also counts
        # waiting for the GIL while the upload threads write one object and one commit per queue
        (f"{vs} read+build alone", ratio(alone["fm"], alone["fd"], "pass_seconds"), "<=", 1.25),
        (f"{vs} same, CPU alone", ratio(alone["fm"], alone["fd"], "pass_cpu_seconds"), "<=", 1.25),
        (f"{vs} CPU alone, 4 KiB (ref.)", ratio(alone["fm4k"], alone["fd4k"], "pass_cpu_seconds"), None, None),
        (f"{vs} r+b in round (ref.)", (fm["pass_seconds"] / fm["bytes"]) / (
            fd["pass_seconds"] / nbytes) if fd["pass_seconds"] else float("nan"), None, None),
        (f"{vs} whole (ref.)", (fm["seconds"] / fm["bytes"]) / (fd["seconds"] / nbytes), None, None),
    ]


def s3_checks(f: Figures, server: str) -> list[Check]:
    s_mbps, raw_mbps, same_mbps = s3_rates(f, server)
    return [(f"{server} vs raw boto3", s_mbps / raw_mbps, ">=", 0.8),
            (f"{server} vs same objects (ref.)", s_mbps / same_mbps, None, None)]


def memory_checks(f: Figures) -> list[Check]:
    """Peak memory as the kernel counts it (issue 32): ``ru_maxrss``, the
    high-water mark of the dispatch process's resident set, mapped CommitLog
    pages included; the sampled PSS, which can miss a peak, for reference."""
    s3_rounds = [s3["sd"] for s3 in f.s3s.values()]
    many = f.args.many_queues
    return [
        ("peak RSS MiB (ru_maxrss)", max(f.fd["maxrss_mib"], *(r["maxrss_mib"] for r in s3_rounds)), "<=", 300),
        (f"peak RSS MiB, {many} q.", f.fm["maxrss_mib"], "<=", 300),
        ("peak PSS MiB, sampled (ref.)", max(f.fd["pss_peak_mib"], *(r["pss_peak_mib"] for r in s3_rounds)),
         None, None),
        (f"peak PSS MiB, {many} q. (ref.)", f.fm["pss_peak_mib"], None, None),
        ("idle round peak RSS MiB (ref.)", f.idle["maxrss_mib"], None, None),
    ]
