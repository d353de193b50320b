"""CPU cost of `tiered produce`, this tree against an older commit, in one run.

Runs the same command line from both trees (by default 100,000 messages of
1 KiB with keys over 4 queues, into a fresh store each time) and reports the
CPU time of the command (user + system of the child process, from
``getrusage``; wall clock measures the neighbours on a shared machine):

- whole command: CPU seconds of the process, start-up included, per message;
- per message: the same less the cost of the same command with
  ``--messages 0`` (interpreter start-up, imports, argument parsing), i.e.
  what each further message costs.

Both trees run interleaved, ``--runs`` times each, best kept; the previous
store is removed before each run (outside the measurement), so both sides
write into page cache freed the same way. Every store is checked afterwards:
each queue holds its share of the messages, and the CommitLog ends where
the records do. The older commit is checked out with ``git worktree add``
into a temporary directory, removed at the end (or give ``--base DIR``).

    .venv/bin/python bench/produce.py [--messages 100000] [--runs 5] [--base-commit 14ac7f6]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from benchdocs import add_option, recorded

HERE = Path(__file__).resolve().parent.parent
TOPIC = "BenchTopic"
QUEUES = 4
GOAL = 10.0  # issue 16: `tiered produce` at least 10x faster


@dataclass(frozen=True, kw_only=True)
class Cost:
    whole_s: float  # CPU seconds of the command with the messages
    fixed_s: float  # CPU seconds of the same command with --messages 0

    def per_message_us(self, messages: int) -> float:
        return (self.whole_s - self.fixed_s) / messages * 1e6

    def whole_us(self, messages: int) -> float:
        return self.whole_s / messages * 1e6


def _command(tree: Path, args: list[str]) -> list[str]:
    # the tree's package first on sys.path: it wins over the installed (editable) one
    code = f"import sys; sys.path.insert(0, {str(tree)!r}); from tiered.cli import main; main()"
    return [sys.executable, "-c", code, *args]


def _which(tree: Path) -> str:
    out = subprocess.run(_command(tree, [])[:2] + [
        f"import sys; sys.path.insert(0, {str(tree)!r}); import tiered; print(tiered.__file__)"],
        capture_output=True, text=True, check=True)
    return out.stdout.strip()


def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(tree: Path, store: Path, messages: int, body_size: int) -> float:
    """CPU seconds of one `tiered produce` into a fresh ``store``."""
    shutil.rmtree(store, ignore_errors=True)
    args = ["produce", "--store", str(store), "--topic", TOPIC, "--queues", str(QUEUES), "--messages", str(messages),
            "--body-size", str(body_size), "--keys"]
    before = _child_cpu()
    subprocess.run(_command(tree, args), check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return _child_cpu() - before


def check_store(store: Path, messages: int, body_size: int) -> None:
    """Each queue holds its share; every record has the body size asked for."""
    from tiered.store.localstore import LocalStore

    with LocalStore(store) as local:
        total = 0
        for q in range(QUEUES):
            rng = local.queue_range(TOPIC, q)
            assert (rng.min_offset, rng.max_offset) == (0, len(range(q, messages, QUEUES))), (q, rng)
            for item in local.iter_queue(TOPIC, q, 0):
                assert item.record.body_length == body_size
                assert item.record.keys == [f"key-{item.queue_offset * QUEUES + q}"]
                total += 1
        assert total == messages, total


def measure(trees: dict[str, Path], work: Path, messages: int, body_size: int, runs: int) -> dict[str, Cost]:
    whole = {name: float("inf") for name in trees}
    fixed = {name: float("inf") for name in trees}
    for _ in range(runs):
        for name, tree in trees.items():  # interleaved: a noisy neighbour hits one run, not one side
            store = work / f"store-{name}"
            whole[name] = min(whole[name], run_once(tree, store, messages, body_size))
            check_store(store, messages, body_size)
            fixed[name] = min(fixed[name], run_once(tree, store, 0, body_size))
    shutil.rmtree(work, ignore_errors=True)
    return {name: Cost(whole_s=whole[name], fixed_s=fixed[name]) for name in trees}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--body-size", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=5, help="runs per tree, interleaved, best kept (default 5)")
    parser.add_argument("--base-commit", default="14ac7f6", help="the commit to compare with (default 14ac7f6)")
    parser.add_argument("--base", type=Path, help="a checkout of it (default: a temporary git worktree)")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()), help="where the stores go")
    add_option(parser)
    args = parser.parse_args()
    with recorded(args, "produce"):
        compare(args)


def compare(args: argparse.Namespace) -> None:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[-1]})  # children inherit: one core
    temp = Path(tempfile.mkdtemp(prefix="tiered-produce-bench-", dir=args.dir))
    base = args.base
    made = base is None
    if base is None:
        base = temp / "base"
        subprocess.run(["git", "-C", str(HERE), "worktree", "add", "--detach", "-q", str(base), args.base_commit],
                       check=True)
    try:
        trees = {args.base_commit: base, "this tree": HERE}
        for name, tree in trees.items():
            where = _which(tree)
            assert where.startswith(str(tree)), (name, where)  # the tree's own code runs, not the installed one
        print(f"tiered produce: {args.messages:,} messages of {args.body_size} B with keys over {QUEUES} queues, "
              f"best of {args.runs}, CPU time (user + system) of the command; {os.cpu_count()} cores, "
              f"pinned to one\n", flush=True)
        costs = measure(trees, temp / "work", args.messages, args.body_size, args.runs)
    finally:
        if made:
            subprocess.run(["git", "-C", str(HERE), "worktree", "remove", "--force", str(base)], check=False)
        shutil.rmtree(temp, ignore_errors=True)
    n = args.messages
    print("| tree | command CPU s | start-up CPU s (0 messages) | µs/message, whole command | µs/message, each further |")
    print("|---|---:|---:|---:|---:|")
    for name, c in costs.items():
        print(f"| {name} | {c.whole_s:.3f} | {c.fixed_s:.3f} | {c.whole_us(n):.2f} | {c.per_message_us(n):.2f} |")
    old, new = costs[args.base_commit], costs["this tree"]
    each = old.per_message_us(n) / new.per_message_us(n)
    whole = old.whole_s / new.whole_s
    print(f"\nper message: {each:.1f}x faster (goal {GOAL:.0f}x: {'met' if each >= GOAL else 'MISSED'}); "
          f"whole command, start-up included: {whole:.1f}x")


if __name__ == "__main__":
    main()
