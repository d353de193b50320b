"""Where segments are built: in this process, one at a time, or in worker
processes, one per core.

Building a segment (reading and checking its records, extracting keys,
the ConsumeQueue and index objects) is CPU work under the GIL: in threads
it runs one at a time whatever the parallelism. ``ProcessBuilds`` runs it
in worker processes, each with its own read-only ``LocalStore``, while the
dispatcher's threads upload and commit. A worker hands back everything the
builder produced except the CommitLog bytes themselves: those are records
already on local disk, so it names their CommitLog spans and the dispatcher
joins them from its own mapping (one copy, as the builder makes) and checks
them against the CRC the worker computed. What reaches the upload step is
the same ``BuiltSegment`` the in-process builder gives.

Workers exit on their own when the dispatcher process is gone (a kill -9
leaves no orphan behind): each watches its parent's pid.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time
from concurrent.futures import BrokenExecutor, ProcessPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from dispatcher.segment import BuiltSegment, SegmentBuilder
from tiered.format.codec import crc32
from tiered.errors import CorruptRecordError, ExpiredLocallyError, WorkerError
from tiered.store.localstore import LocalStore

log = logging.getLogger(__name__)
_PHYS_AT = 28  # a record's physical offset (i64), checked against its ConsumeQueue entry


@dataclass(frozen=True, kw_only=True)
class BuildJob:
    """One segment to build: ``queue_id`` of ``topic`` from queue offset
    ``start``, its bytes numbered from cold CommitLog byte ``cl_start``."""

    prefix: str
    topic: str
    queue_id: int
    start: int
    cl_start: int
    segment_bytes: int
    key_index: bool
    layout: int = 1
    compression: str = "none"
    batch: bool = False  # a BatchCQ queue (``SegmentBuilder``'s ``batch``)


def build_segment(local: LocalStore, job: BuildJob, now_ms: int) -> tuple[BuiltSegment | None, Exception | None]:
    """The segment's records from ``job.start`` up to ``segment_bytes``, built;
    and the corrupt record or locally expired offset that stopped it early."""
    built, stop, _spans = _build(local, job, now_ms, want_spans=False)
    return built, stop


def _build(local: LocalStore, job: BuildJob, now_ms: int, *, want_spans: bool
           ) -> tuple[BuiltSegment | None, Exception | None, tuple[np.ndarray, np.ndarray]]:
    builder = SegmentBuilder(job.prefix, job.start, job.cl_start, key_index=job.key_index, layout=job.layout,
                             compression=job.compression, batch=job.batch)
    stop: Exception | None = None
    los: list[np.ndarray] = []  # physical [start, end) of the records taken, per batch
    his: list[np.ndarray] = []
    try:
        for batch in local.iter_batches(job.topic, job.queue_id, job.start, max_bytes=job.segment_bytes):
            before = builder.count
            try:
                builder.add(batch)
            finally:
                taken = builder.count - before
                if want_spans and taken:
                    lo, hi = _physical(batch.view, batch.positions[:taken], batch.sizes[:taken])
                    los.append(lo)
                    his.append(hi)
    except (CorruptRecordError, ExpiredLocallyError) as exc:
        stop = exc
    built = builder.build(now_ms) if builder.count else None
    return built, stop, _merged(los, his)


def _physical(view: memoryview, positions: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # the first record's physical offset names the file: positions are relative to it
    first = int(positions[0])
    base = int.from_bytes(view[first + _PHYS_AT:first + _PHYS_AT + 8], "big") - first
    return positions + base, positions + sizes + base


def _merged(los: list[np.ndarray], his: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The spans, adjacent ones merged (a queue alone in its CommitLog is one span)."""
    if not los:
        empty = np.zeros(0, np.int64)
        return empty, empty
    lo, hi = np.concatenate(los), np.concatenate(his)
    if len(lo) > 1:
        cut = np.flatnonzero(lo[1:] != hi[:-1]) + 1
        lo, hi = lo[np.concatenate(([0], cut))], hi[np.concatenate((cut - 1, [len(hi) - 1]))]
    return lo, hi


# --- worker side ------------------------------------------------------------------

def _watch_parent(pid: int) -> None:
    """Exit when the dispatcher process is gone: a worker must not outlive a
    kill -9 of it (nothing of the worker's is needed then)."""
    def run() -> None:
        while True:
            time.sleep(1.0)
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                os._exit(0)
            except PermissionError:
                pass  # exists, another user's: cannot be ours once it died, but harmless

    threading.Thread(target=run, name="parent-watch", daemon=True).start()


def _run_job(root: str, job: BuildJob, now_ms: int, broker_mode: str) -> tuple[Any, ...]:
    # A store opened for each job: it sees the files on disk now, as the
    # dispatcher's reads do at the start of a round (a file the broker
    # deleted or replaced is never read through an older mapping). Cheap:
    # mapping is lazy, and the pages read are given back after each read.
    try:
        # the mode the dispatcher told, not told again: its confirm offset binds here too
        with LocalStore(root, broker_mode=broker_mode) as local:
            built, stop, spans = _build(local, job, now_ms, want_spans=True)
    except Exception as exc:  # noqa: BLE001 - handed to the dispatcher, which reports it for the queue
        return ("error", type(exc).__name__, str(exc))
    if built is not None:
        built = replace(built, commitlog=b"")  # the dispatcher joins the bytes from the spans
    return ("ok", built, _stop_fields(stop), spans)


def _stop_fields(stop: Exception | None) -> tuple[Any, ...] | None:
    # these errors take several arguments: rebuilt from their fields, not pickled
    if isinstance(stop, CorruptRecordError):
        return ("corrupt", stop.source, stop.offset, stop.reason)
    if isinstance(stop, ExpiredLocallyError):
        return ("expired", stop.topic, stop.queue_id, stop.offset, stop.next_available)
    return None


def _stop_of(fields: tuple[Any, ...] | None) -> Exception | None:
    if fields is None:
        return None
    if fields[0] == "corrupt":
        return CorruptRecordError(*fields[1:])
    return ExpiredLocallyError(*fields[1:])


# --- dispatcher side -----------------------------------------------------------------


class ProcessBuilds:
    """Builds segments in ``processes`` worker processes."""

    def __init__(self, processes: int) -> None:
        self.processes = processes
        self._broken = False
        self._lock = threading.Lock()  # in-process builds, one at a time (after a broken pool)
        ctx = multiprocessing.get_context("forkserver")
        # workers fork from a server that already imported the build code
        ctx.set_forkserver_preload(["dispatcher.buildpool"])
        self._pool = ProcessPoolExecutor(processes, mp_context=ctx, initializer=_watch_parent,
                                         initargs=(os.getpid(),))

    def build(self, local: LocalStore, job: BuildJob, now_ms: int) -> tuple[BuiltSegment | None, Exception | None]:
        if self._broken:
            with self._lock:
                return build_segment(local, job, now_ms)
        try:
            outcome = self._pool.submit(_run_job, str(local.root), job, now_ms,
                                        local.told_mode.mode).result()
        except BrokenExecutor as exc:
            # Workers that cannot start (a __main__ module that is not import
            # safe, a memory limit) must not stop archiving: build here.
            if not self._broken:
                self._broken = True
                log.error("segment-build worker processes failed (%s); building in the dispatcher process "
                          "from now on", exc)
            with self._lock:
                return build_segment(local, job, now_ms)
        if outcome[0] == "error":
            raise WorkerError(f"building {job.topic}/{job.queue_id} from offset {job.start}: "
                              f"{outcome[1]}: {outcome[2]}")
        _ok, built, stop, spans = outcome
        if built is not None:
            built = replace(built, commitlog=self._join(local, job, built, spans))
        stopped = _stop_of(stop)
        if isinstance(stopped, ExpiredLocallyError):
            # the worker saw files deleted: so must the dispatcher's own reads
            # (the gap it records ends where they say the queue now starts)
            local.refresh()
        return built, stopped

    def warm(self) -> None:
        """Start every worker now (they start on first use otherwise): a
        benchmark's timed round, or a service's first, does not pay for it."""
        futures = [self._pool.submit(time.sleep, 0.2) for _ in range(self.processes)]
        for fut in futures:
            fut.result()

    @staticmethod
    def _join(local: LocalStore, job: BuildJob, built: BuiltSegment, spans: tuple[np.ndarray, np.ndarray]
              ) -> bytes:
        """The segment's CommitLog bytes from the local store, checked against
        the CRC of the bytes the worker read."""
        data = local.commitlog_join(*spans)
        seg = built.segment
        if len(data) != seg.cl_end - seg.cl_start or crc32(data) != seg.commitlog_crc:
            raise WorkerError(f"{job.topic}/{job.queue_id} from offset {job.start}: the CommitLog bytes read "
                              "again differ from those the worker built the segment from")
        return data

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


_SHARED: ProcessBuilds | None = None
_SHARED_LOCK = threading.Lock()


def shared_builds(processes: int) -> ProcessBuilds:
    """One pool per process, for every dispatcher in it (a service has one;
    tests and benches create many): workers are started once, on first use,
    and stopped at interpreter exit. Grows to the largest size asked for."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None or _SHARED.processes < processes:
            old, _SHARED = _SHARED, ProcessBuilds(processes)
            if old is not None:
                old.close()
        return _SHARED
