"""Bytes written per commit as a queue's history grows, layout v1 against v2.

    python bench/commit_growth.py                 # 300 segments per layout, file://
    python bench/commit_growth.py --segments 1000

Archives ``--segments`` one-message segments of one queue with the real
dispatcher into a temporary file:// cold tier and records the bytes of every
commit: the manifest head plus the manifest chunks written with it
(tiered/archive/chunks.py; one commit in 16 seals a chunk: an object of its
own in layout v1, a section of the segment object in v2). Prints the
commit size at segments 10, 100 and 300 (and the last), the mean and the
largest over the last 100 commits, and the data bytes per segment, per
layout. A commit that does not grow with history prints flat figures.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchdocs import add_option, recorded  # noqa: E402
from tiered.dispatcher import ArchiveOptions, Dispatcher, DispatchOptions, TopicFilter  # noqa: E402
from tiered.clock import ManualClock  # noqa: E402
from tiered.archive.coldtier import ColdTier  # noqa: E402
from tiered.store.localstore import LocalStore  # noqa: E402
from tiered.archive import segmeta  # noqa: E402
from tiered.archive.chunks import CHUNK_DIR  # noqa: E402
from tiered.archive.manifest import MANIFEST  # noqa: E402
from tiered.archive.storage import FileStore  # noqa: E402
from tiered.store.storewriter import StoreWriter  # noqa: E402


def run(root: Path, segments: int, layout: int) -> tuple[list[int], int]:
    clock = ManualClock()
    with StoreWriter(root / "store") as w:
        for i in range(segments):
            w.put("Orders", 0, os.urandom(200), keys=[f"order-{i}"], unique_key=f"U{i:031d}",
                  store_timestamp=clock.now_ms(), born_timestamp=clock.now_ms())
    store = FileStore(str(root / "cold"))
    commits: list[int] = []
    data = [0]
    chunk_bytes = [0]  # written since the last head: part of the next commit

    def wrap(raw: Callable) -> Callable:  # noqa: ANN202
        def call(key, body, *args):  # noqa: ANN001, ANN202
            if key.endswith("/" + MANIFEST):
                commits.append(len(body) + chunk_bytes[0])
                chunk_bytes[0] = 0
            elif f"/{CHUNK_DIR}/" in key:
                chunk_bytes[0] += len(body)
            elif "/_" not in key:
                desc = segmeta.parse(body, key) if "/segment/" in key else None
                carried = desc.chunks[1] if desc is not None and desc.chunks else 0
                chunk_bytes[0] += carried  # the chunks the segment object carries belong to its commit
                data[0] += len(body) - carried
            return raw(key, body, *args)
        return call

    store._raw_put = wrap(store._raw_put)  # type: ignore[method-assign]
    store._raw_put_if = wrap(store._raw_put_if)  # type: ignore[method-assign]
    cold = ColdTier(store, "C", "b", state_dir=root / "state", writer="bench", clock=clock)
    options = DispatchOptions(archive=ArchiveOptions(upload_bytes=1, max_delay_ms=0, segment_bytes=1, layout=layout),
                              parallelism=1, round_budget_s=float("inf"))
    d = Dispatcher(LocalStore(root / "store"), cold, options=options, topic_filter=TopicFilter(), clock=clock)
    while len(commits) < segments:
        result = d.run_round()
        if not result.ok or result.segments == 0:
            raise SystemExit(f"dispatch stopped after {len(commits)} commits: {result.errors}")
    return commits, data[0] // segments


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--segments", type=int, default=300)
    add_option(ap)
    args = ap.parse_args()
    with recorded(args, "commit_growth"):
        report(args)


def report(args: argparse.Namespace) -> None:
    print(f"cores: {os.cpu_count()}; {args.segments} one-message segments of one queue, file://")
    for layout in (1, 2):
        with tempfile.TemporaryDirectory() as tmp:
            commits, per_segment = run(Path(tmp), args.segments, layout)
        at = ", ".join(f"{n}: {commits[n - 1]}" for n in sorted({10, 100, 300, len(commits)}) if n <= len(commits))
        recent = commits[-100:]
        print(f"layout v{layout}: commit bytes at segment {at}; last {len(recent)} commits mean "
              f"{sum(recent) / len(recent):.0f}, max {max(recent)}; data objects {per_segment} bytes per segment")


if __name__ == "__main__":
    main()
