"""Segments built in worker processes are the segments built in process,
byte for byte; errors found in a worker reach the dispatcher with their
file and offset; a worker never outlives its dispatcher; and a round gives
back the ConsumeQueue pages it mapped."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from dispatchkit import BROKER, CLUSTER, assert_exact, new_dispatcher, new_writer, produce, read_manifest
from dispatcher.buildpool import BuildJob, ProcessBuilds, WorkerError, build_segment, shared_builds
from tiered.errors import CorruptRecordError
from tiered.store.localstore import LocalStore
from tiered.store.storewriter import StoreWriter
from tiered.archive.manifest import queue_prefix
from tiered.archive.storage import FileStore

QUEUES = [("A", 0), ("A", 1), ("B", 0)]


def _store(root: Path, clock) -> None:  # noqa: ANN001
    with new_writer(root) as w:
        for i, (t, q) in enumerate(QUEUES):
            produce(w, t, q, 150, clock=clock, body_size=400, seed=i)


def _archive(tmp_path: Path, name: str, clock, processes: int) -> FileStore:  # noqa: ANN001
    cold = FileStore(tmp_path / name)
    local = LocalStore(tmp_path / "store")
    d = new_dispatcher(cold, local, tmp_path / f"state-{name}", clock, upload_bytes=1, max_delay_ms=0,
                       segment_bytes=9000, parallelism=2, build_processes=processes,
                       single_pass=False)  # the workers build, not the single pass
    assert (d.archiver.builds is not None) == (processes > 1)
    result = d.run_round()
    assert result.ok, result.errors
    assert_exact(cold, local, QUEUES)
    return cold


def test_process_built_segments_equal_in_process_ones(tmp_path: Path, clock) -> None:  # noqa: ANN001
    _store(tmp_path / "store", clock)
    inproc = _archive(tmp_path, "inproc", clock, 0)
    procs = _archive(tmp_path, "procs", clock, 2)
    for t, q in QUEUES:
        a, b = read_manifest(inproc, t, q), read_manifest(procs, t, q)
        assert a is not None and b is not None and len(a.segments) > 3
        assert a.segments == b.segments  # offsets, CRCs, blooms, keys, times (one manual clock)
        for seg in a.segments:
            assert inproc.get(seg.commitlog_key) == procs.get(seg.commitlog_key)
            if seg.index_key:
                assert inproc.get(seg.index_key) == procs.get(seg.index_key)
            entries = seg.messages * 20  # the entries; the descriptor after them names the history
            assert inproc.get(seg.consumequeue_key)[:entries] == procs.get(seg.consumequeue_key)[:entries]


def _job(root: Path, topic: str, qid: int, start: int = 0) -> BuildJob:
    return BuildJob(prefix=queue_prefix(CLUSTER, BROKER, topic, qid), topic=topic, queue_id=qid, start=start,
                    cl_start=0, segment_bytes=1 << 20, key_index=True)


def test_a_corrupt_record_found_by_a_worker_names_its_file_and_offset(tmp_path: Path, clock) -> None:  # noqa: ANN001
    root = tmp_path / "store"
    _store(root, clock)
    local = LocalStore(root)
    victim = next(local.iter_queue("A", 1, 7, max_count=1)).record
    start = local.commitlog.locate(victim.physical_offset)
    path = local.commitlog.path(start)
    with open(path, "r+b") as fh:  # a wrong magic: corrupt, not a tail being written
        fh.seek(victim.physical_offset - start + 4)
        fh.write(struct.pack(">I", 0x12345678))
    expected_built, expected = build_segment(LocalStore(root), _job(root, "A", 1), 1000)
    built, stop = shared_builds(2).build(local, _job(root, "A", 1), 1000)
    assert isinstance(stop, CorruptRecordError) and isinstance(expected, CorruptRecordError)
    assert (stop.source, stop.offset, stop.reason) == (expected.source, expected.offset, expected.reason)
    assert stop.source == str(path)
    assert built is not None and expected_built is not None
    assert built.segment.q_end == 7 and built.segment == expected_built.segment
    assert built.commitlog == expected_built.commitlog


def test_bytes_that_changed_since_the_worker_read_them_are_refused(tmp_path: Path, clock) -> None:  # noqa: ANN001
    root = tmp_path / "store"
    _store(root, clock)
    local = LocalStore(root)
    built, stop = build_segment(local, _job(root, "B", 0), 1000)
    assert built is not None and stop is None
    lying = replace(built, segment=replace(built.segment, commitlog_crc=built.segment.commitlog_crc ^ 1))
    records = [r.record for r in local.iter_queue("B", 0, 0)]
    spans = (np.array([r.physical_offset for r in records]), np.array([r.physical_offset + r.size for r in records]))
    assert ProcessBuilds._join(local, _job(root, "B", 0), built, spans) == built.commitlog
    with pytest.raises(WorkerError, match="B/0 from offset 0: the CommitLog bytes read again differ"):
        ProcessBuilds._join(local, _job(root, "B", 0), lying, spans)


_DRIVER = """
import sys, time
sys.path[:0] = {paths!r}
from dispatcher.buildpool import ProcessBuilds
from tiered.store.localstore import LocalStore
from tiered.store.storewriter import StoreWriter
from dispatchkit import BROKER, CLUSTER
from dispatcher.buildpool import BuildJob
from tiered.archive.manifest import queue_prefix
pool = ProcessBuilds(2)
job = BuildJob(prefix=queue_prefix(CLUSTER, BROKER, "A", 0), topic="A", queue_id=0, start=0, cl_start=0,
               segment_bytes=1 << 20, key_index=True)
built, stop = pool.build(LocalStore({root!r}), job, 1)
print(" ".join(str(p) for p in pool._pool._processes), flush=True)
time.sleep(600)
"""


def test_workers_exit_when_the_dispatcher_is_killed(tmp_path: Path, clock) -> None:  # noqa: ANN001
    root = tmp_path / "store"
    _store(root, clock)
    here = Path(__file__).resolve().parents[1]
    code = _DRIVER.format(paths=[str(here.parent), str(here / "helpers")], root=str(root))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert pids and all(_alive(p) for p in pids)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 30  # a bound, not a duration asserted: they poll every second
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if _alive(p)]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def _consumequeue_rss_kib(root: Path) -> int:
    """Resident KiB of this process's mappings of the ConsumeQueue files under ``root``."""
    prefix = f"{root}/consumequeue/"
    total, inside = 0, False
    with open("/proc/self/smaps") as fh:
        for line in fh:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5 and ":" in head[3]:
                inside = len(head) >= 6 and head[5].startswith(prefix)
            elif inside and head and head[0] == "Rss:":
                total += int(head[1])
    return total


def test_a_round_gives_back_the_consumequeue_pages_it_mapped(tmp_path: Path, clock) -> None:  # noqa: ANN001
    root = tmp_path / "store"
    with new_writer(root, cq_entries_per_file=20_000) as w:  # 400 KB preallocated files
        for q in range(40):
            produce(w, "Many", q, 3, clock=clock)
    cold = FileStore(tmp_path / "cold")
    local = LocalStore(root)
    d = new_dispatcher(cold, local, tmp_path / "state", clock, upload_bytes=1, max_delay_ms=0, parallelism=1)
    assert d.run_round().messages == 120
    assert _consumequeue_rss_kib(root) == 0
    # an idle round maps (and bisects) every queue's file, then gives the pages back
    assert d.run_round().messages == 0
    assert len(local._queues) == 40 and _consumequeue_rss_kib(root) == 0
    # what the check measures: without the release, the pages stay
    assert local.max_offset("Many", 0) == 3 and _consumequeue_rss_kib(root) > 0
    local.release_queue("Many", 0)
    assert _consumequeue_rss_kib(root) == 0
    assert os.path.exists(root / "consumequeue" / "Many" / "0")


def test_a_broken_worker_pool_falls_back_to_building_in_process(tmp_path: Path, clock, caplog) -> None:  # noqa: ANN001
    root = tmp_path / "store"
    _store(root, clock)
    local = LocalStore(root)
    expected, _ = build_segment(local, _job(root, "A", 0), 1000)
    pool = ProcessBuilds(2)
    try:
        pool.build(local, _job(root, "A", 0), 1000)  # workers up
        for pid in list(pool._pool._processes):
            os.kill(pid, signal.SIGKILL)
        built, stop = pool.build(local, _job(root, "A", 0), 1000)
        assert stop is None and built is not None and expected is not None
        assert built.segment == expected.segment and built.commitlog == expected.commitlog
        assert "building in the dispatcher process from now on" in caplog.text
        built, _ = pool.build(local, _job(root, "A", 0), 1000)  # and stays so
        assert built is not None and built.commitlog == expected.commitlog
    finally:
        pool.close()


def test_a_worker_holds_at_the_confirm_offset_of_the_mode_the_dispatcher_was_told(tmp_path: Path,
                                                                                   clock) -> None:  # noqa: ANN001
    """The store shows no sign of controller mode; the setting said so: the
    worker's own LocalStore must bind the confirm offset too."""
    root = tmp_path / "store"
    _store(root, clock)
    tenth = next(LocalStore(root).iter_queue("A", 0, 9, max_count=1)).record
    with StoreWriter(root, commitlog_file_size=64 * 1024, cq_entries_per_file=128) as w:
        w.write_checkpoint(confirm_offset=tenth.physical_offset + tenth.size)
    builds = ProcessBuilds(1)
    try:
        built, _stop = builds.build(LocalStore(root, broker_mode="controller"), _job(root, "A", 0), 1000)
        assert built is not None and built.segment.q_end == 10
        built, _stop = builds.build(LocalStore(root), _job(root, "A", 0), 1000)  # default: no bound
        assert built is not None and built.segment.q_end == 150
    finally:
        builds.close()
