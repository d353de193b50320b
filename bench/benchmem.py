"""Memory and CPU figures of a benchmark process,
sampled while a phase runs (bench/dispatch.py)."""

from __future__ import annotations

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
    """The Pss (proportional set size, /proc/self/smaps_rollup) of this
    process: mapped CommitLog pages included, a page shared with another
    process counted as this one's share."""

    def _read_kib(self) -> int:
        total = 0
        try:
            with open("/proc/self/smaps_rollup") as fh:
                total = next(int(line.split()[1]) for line in fh if line.startswith("Pss:"))
        except (OSError, StopIteration):
            pass
        return total


def maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
