"""Each compiled extension against its Python twin, at the shipped defaults, in one run.

    python bench/native.py --size-mb 256 --commitlog-mb 64 --repeat 3

For every extension the install built, the bench/dispatch.py phases run with
it and with it hidden (``TIERED_BENCH_HIDE``: the phase's process cannot
import it, as on an install without a C compiler), the runs interleaved so a
shared machine's load falls on both alike, each figure the best of --repeat:

- a file:// dispatch round of the 16-queue and of the --many-queues store:
  CPU seconds per GB (goal <= 1.5) and the round's seconds;
- read+build alone over each store (the round's CommitLog passes again with
  nothing uploaded beside them): CPU seconds per GB and seconds.

An extension stays where it moves one of these by at least 20 % (without /
with >= 1.2). The core count is printed first: figures from a shared or small
machine are indicative.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import dispatch as bench  # noqa: E402
from benchdocs import recorded  # noqa: E402
from benchkit import run_phase, set_aside  # noqa: E402
from dispatchphases import HIDE_ENV  # noqa: E402
from floors import MiB  # noqa: E402
from pagecache import huge_share, reread  # noqa: E402

# every compiled module an install may hold (setup.py); those not built are skipped
EXTENSIONS = ("tiered._native",)
KEEP_RATIO = 1.2  # the bar: a stated goal moved by at least 20 %

# (label, store name or None for the main store, read+build alone)
MEASURES = (("round 16 queues", None, False), ("round many queues", "store-many", False),
            ("read+build 16 queues", None, True), ("read+build many queues", "store-many", True))


def built(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:
        return False


def prepare(args: argparse.Namespace, work: Path) -> dict:
    """The two stores (reused when their sizes match), read back into the page cache."""
    marker = work / "store.json"
    meta = json.loads(marker.read_text()) if marker.exists() else {}
    want = {"size_mb": args.size_mb, "commitlog_mb": args.commitlog_mb, "queues": args.queues,
            "many_queues": args.many_queues}
    if any(meta.get(k) != v for k, v in want.items()):
        print(f"generating {args.size_mb} MiB over {args.queues} and {args.many_queues} queues ...", flush=True)
        gen = run_phase("generate", args)
        many = run_phase("generate", args, store_name="store-many", queues=args.many_queues)
        meta = {**want, **gen, "many_bytes": many["bytes"]}
        marker.write_text(json.dumps(meta))
    logs = [f for name in ("store", "store-many") for f in sorted((work / name / "commitlog").iterdir())]
    for f in logs:
        reread(f)
    meta["huge_share"] = huge_share(logs)
    return meta


def run_once(args: argparse.Namespace, cold: Path, hide: str, store: str | None, alone: bool) -> dict:
    os.environ[HIDE_ENV] = hide
    extra: dict[str, object] = {"url": f"file://{cold}", "sample": 0, "pass_alone": int(alone)}
    if store:
        extra.update(store_name=store, queues=args.many_queues)
    set_aside(cold)
    try:
        return run_phase("dispatch", args, **extra)
    finally:
        os.environ.pop(HIDE_ENV, None)


def figures(run: dict, alone: bool) -> tuple[float, float]:
    """(CPU seconds per GB, seconds) of a round, or of its passes alone."""
    if alone:
        return run["pass_cpu_seconds"] / (run["pass_bytes"] / 1e9), run["pass_seconds"]
    return run["cpu_seconds"] / (run["bytes"] / 1e9), run["seconds"]


def measure(args: argparse.Namespace, work: Path, configs: list[str]) -> dict[str, dict[str, list[float]]]:
    """Best-of-``repeat`` (CPU s/GB, s) per config and measure; every repeat
    runs each config once, in turn."""
    cold = work / "cold-file"
    best: dict[str, dict[str, list[float]]] = {c: {} for c in configs}
    for i in range(args.repeat):
        for label, store, alone in MEASURES:
            for hide in configs if i % 2 == 0 else reversed(configs):
                cpu, secs = figures(run_once(args, cold, hide, store, alone), alone)
                old = best[hide].get(label, [float("inf"), float("inf")])
                best[hide][label] = [min(old[0], cpu), min(old[1], secs)]
        print(f"repeat {i + 1}/{args.repeat} done", flush=True)
    set_aside(cold)
    return best


def report(best: dict[str, dict[str, list[float]]], names: list[str]) -> dict[str, dict]:
    verdicts = {}
    with_all = best[""]
    for name in names:
        without = best[name]
        print(f"\n{name}: with / without (ratio without/with)")
        top = 0.0
        for label, _store, _alone in MEASURES:
            (wc, ws), (nc, ns) = with_all[label], without[label]
            rc, rs = nc / wc, ns / ws
            top = max(top, rc, rs)
            print(f"  {label:<24} CPU s/GB {wc:6.2f} / {nc:6.2f} ({rc:4.2f})   seconds {ws:6.2f} / {ns:6.2f} ({rs:4.2f})")
        verdict = "keep" if top >= KEEP_RATIO else "remove"
        print(f"  largest ratio {top:.2f}: {verdict} (bar {KEEP_RATIO})")
        verdicts[name] = {"largest_ratio": top, "verdict": verdict}
    return verdicts


def markdown(best: dict[str, dict[str, list[float]]], names: list[str]) -> str:
    """The ratios as the table docs/development.md ("Native code") shows."""
    rows = ["| without / with (CPU, time) | " + " | ".join(label for label, _s, _a in MEASURES) + " |",
            "|---|" + "---|" * len(MEASURES)]
    for name in names:
        cells = [f"{best[name][label][0] / best[''][label][0]:.2f}x, {best[name][label][1] / best[''][label][1]:.2f}x"
                 for label, _s, _a in MEASURES]
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def parser() -> argparse.ArgumentParser:
    ap = bench.parser()
    ap.description = __doc__.split("\n\n")[0]
    ap.set_defaults(size_mb=256, commitlog_mb=64)
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument("--markdown", action="store_true", help="also print the ratios as a Markdown table")
    ap.add_argument("--only", action="append", default=[], help="measure only this module (repeatable)")
    return ap


def main() -> None:
    args = parser().parse_args()
    with recorded(args, "native") as rec:
        measure_all(args, rec.tables)


def measure_all(args: argparse.Namespace, tables: list[str]) -> None:
    names = [n for n in args.only or EXTENSIONS if built(n)]
    print(f"{os.cpu_count()} cores; extensions built: {', '.join(names) or 'none'}", flush=True)
    if not names:
        raise SystemExit("no compiled extension to compare: build them (setup.py build_ext --inplace)")
    tmp = None
    if args.workdir is None:
        args.workdir = tmp = tempfile.mkdtemp(prefix="tiered-native-")
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(work / "aside", ignore_errors=True)  # a run stopped half-way left its own
    try:
        meta = prepare(args, work)
        print(f"store: {meta['bytes'] / MiB:.0f} MiB of records, {args.queues} and {args.many_queues} queues; "
              f"CommitLog cache {100 * meta['huge_share']:.0f} % in 2 MiB pages; best of {args.repeat}", flush=True)
        best = measure(args, work, ["", *names])
        verdicts = report(best, names)
        if args.markdown:
            print("\n" + markdown(best, names))
        tables.append(markdown(best, names))
        if args.json:
            Path(args.json).write_text(json.dumps({"cores": os.cpu_count(), "best": best, "verdicts": verdicts},
                                                  indent=1))
    finally:
        shutil.rmtree(work / "aside", ignore_errors=True)
        shutil.rmtree(work / "state", ignore_errors=True)
        if tmp and not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
