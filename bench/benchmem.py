"""Memory and CPU figures of a benchmark process and its build workers,
sampled while a phase runs (bench/dispatch.py)."""

from __future__ import annotations

import os
import resource
import threading
import time


class _Peak:
    """Samples a memory figure (KiB) on a thread while a phase runs and keeps
    its peak; ``cpu_seconds`` is the sampler's own CPU, not the phase's."""

    def __init__(self, every: float = 0.02) -> None:
        self.every = every
        self.peak_kib = 0
        self.cpu_seconds = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _read_kib(self) -> int:
        raise NotImplementedError

    def _sample(self) -> None:
        self.peak_kib = max(self.peak_kib, self._read_kib())

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self._sample()
        self.cpu_seconds = time.thread_time()

    def __enter__(self) -> _Peak:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


class NoPeak(_Peak):
    """No sampling: the timed runs carry no measuring thread (a sampler reading
    smaps_rollup costs ~10 % of a core, which the baselines do not pay)."""

    def _read_kib(self) -> int:
        return 0

    def __enter__(self) -> _Peak:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


class AnonPeak(_Peak):
    """RssAnon from /proc/self/status (Linux)."""

    def _read_kib(self) -> int:
        try:
            with open("/proc/self/status") as fh:
                return next((int(line.split()[1]) for line in fh if line.startswith("RssAnon:")), 0)
        except OSError:
            return 0


class PssPeak(_Peak):
    """The summed Pss (proportional set size, /proc/PID/smaps_rollup) of this
    process and its build workers: mapped CommitLog pages included, a page
    shared by several processes counted once in total (each holder a
    share), so workers that import the same libraries are not counted twice
    as with RSS."""

    def _read_kib(self) -> int:
        total = 0
        for pid in [os.getpid(), *build_workers()]:
            try:
                with open(f"/proc/{pid}/smaps_rollup") as fh:
                    total += next(int(line.split()[1]) for line in fh if line.startswith("Pss:"))
            except (OSError, StopIteration):
                pass
        return total


def maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def build_workers() -> list[int]:
    """Pids of the segment-build worker processes of this process, if any."""
    try:
        from dispatcher import buildpool
    except ImportError:  # a tree without build workers (comparing with an older commit)
        return []
    pool = buildpool._SHARED
    return list(pool._pool._processes) if pool is not None and pool._pool._processes else []


def worker_usage(pids: list[int]) -> tuple[float, float]:
    """(CPU seconds, peak RSS MiB summed) of the build workers so far: they
    are not our direct children (forkserver), so read from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    cpu = rss = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(") ", 1)[1].split()
            cpu += (int(fields[11]) + int(fields[12])) / tick
            with open(f"/proc/{pid}/status") as fh:
                rss += next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:")) / 1024
        except (FileNotFoundError, StopIteration):
            pass
    return cpu, rss
