"""Shared pieces of the cleaner tests: a store + dispatcher + cleaner rig on one
ManualClock, a storage-interface event log, and an archive reader that is
independent of the cleaner and of ``tiered.ops.verify``."""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from counting import CountingRecorder
from dispatchkit import cq_entries

from tiered.cleaner import CleanOptions, Cleaner
from tiered.cleaner.plan import parse_data_key
from tiered.dispatcher import ArchiveOptions, Dispatcher, DispatchOptions
from tiered.archive import layout
from tiered.clock import ManualClock
from tiered.format.codec import CQ_ENTRY, CQ_ENTRY_SIZE
from tiered.archive.coldtier import ColdTier
from tiered.config import RetentionSettings
from tiered.store.localstore import LocalStore
from tiered.archive.manifest import Manifest, broker_prefix
from tiered.archive.storage import FileStore, ObjectStore
from tiered.store.storewriter import StoreWriter

CLUSTER = "TestCluster"
BROKER = "broker-a"
PREFIX = broker_prefix(CLUSTER, BROKER)
HOUR_MS = 3_600_000


@dataclass
class Event:
    op: str  # put | delete
    key: str
    now_ms: int
    batch: int = 0  # delete request number


@dataclass
class StoreEvents:
    """Every create and delete at the storage interface (the ``_raw_*`` hooks,
    i.e. requests that reached the store), with the sim time."""

    clock: ManualClock
    events: list[Event] = field(default_factory=list)
    delete_requests: list[list[str]] = field(default_factory=list)

    def attach(self, store: ObjectStore) -> ObjectStore:
        raw_put, raw_put_if, raw_delete = store._raw_put, store._raw_put_if, store._raw_delete

        def put(key: str, data: bytes, *crc: int) -> str:
            out = raw_put(key, data, *crc)
            self.events.append(Event("put", key, self.clock.now_ms()))
            return out

        def put_if(key: str, data: bytes, etag: str | None) -> str:
            out = raw_put_if(key, data, etag)
            self.events.append(Event("put", key, self.clock.now_ms()))
            return out

        def delete(keys: list[str]) -> None:
            raw_delete(keys)
            self.delete_requests.append(list(keys))
            for k in keys:
                self.events.append(Event("delete", k, self.clock.now_ms(), len(self.delete_requests)))

        store._raw_put = put  # type: ignore[method-assign]
        store._raw_put_if = put_if  # type: ignore[method-assign]
        store._raw_delete = delete  # type: ignore[method-assign]
        return store

    def data(self, op: str) -> list[Event]:
        return [e for e in self.events if e.op == op and parse_data_key(PREFIX, e.key) is not None]

    def kinds(self, op: str) -> Counter[str]:
        return Counter(parse_data_key(PREFIX, e.key)[2] for e in self.data(op))  # type: ignore[index]


def read_segment(store: ObjectStore, seg: Any) -> list[tuple[int, bytes]]:
    """(queue offset, record bytes) of one segment, checked against its manifest entry."""
    cl = layout.read_part(store, seg.commitlog_key)
    cq = cq_entries(store, seg)
    assert len(cl) == seg.nbytes and zlib.crc32(cl) == seg.commitlog_crc, seg.commitlog_key
    assert zlib.crc32(cq) == seg.consumequeue_crc, seg.consumequeue_key
    out = []
    for i in range(seg.messages):
        off, size, _tags = CQ_ENTRY.unpack_from(cq, i * CQ_ENTRY_SIZE)
        rel = off - seg.cl_start
        assert 0 <= rel and rel + size <= len(cl), (seg.commitlog_key, off)
        out.append((seg.q_start + i, bytes(cl[rel:rel + size])))
    return out


def read_archive(store: ObjectStore, m: Manifest) -> dict[int, bytes]:
    out: dict[int, bytes] = {}
    for seg in m.segments:
        for q, raw in read_segment(store, seg):
            assert q not in out, f"offset {q} archived twice"
            out[q] = raw
    return out


class Rig:
    """A broker store, a dispatcher and a cleaner on one ManualClock."""

    def __init__(
        self,
        root: Path,
        *,
        store: ObjectStore | None = None,
        clock: ManualClock | None = None,
        retention: RetentionSettings | None = None,
        options: CleanOptions | None = None,
        commitlog_file_size: int = 1 << 20,
        cq_entries: int = 10_000,
        key_index: bool = True,
        upload_bytes: int = 1 << 30,
        start_position: str = "earliest",
        layout: int = 1,
        compression: str = "none",
    ) -> None:
        self.root = root
        self.clock = clock or ManualClock()
        self.recorder = CountingRecorder()
        self.events = StoreEvents(self.clock)
        self.objects = self.events.attach(store or FileStore(str(root / "cold")))
        self.objects.recorder = self.recorder
        self.writer = StoreWriter(root / "store", commitlog_file_size=commitlog_file_size,
                                  cq_entries_per_file=cq_entries)
        self.retention = retention or RetentionSettings(default_hours=1)
        self.options = options or CleanOptions(merge=False)
        self.key_index = key_index
        self.upload_bytes = upload_bytes
        self.start_position = start_position
        self.archive_layout = (layout, compression)
        self.produced: dict[tuple[str, int], dict[int, tuple[bytes, int]]] = {}
        self.physical: dict[tuple[str, int], dict[int, int]] = {}  # queue offset -> broker CommitLog offset
        self._build()

    def _build(self) -> None:
        self.local = LocalStore(self.root / "store")
        self.cold = ColdTier(self.objects, CLUSTER, BROKER, state_dir=self.root / "state", writer="test",
                             clock=self.clock)
        self.dispatcher = Dispatcher(
            self.local, self.cold, recorder=self.recorder, clock=self.clock,
            options=DispatchOptions(archive=ArchiveOptions(upload_bytes=self.upload_bytes, max_delay_ms=0,
                                                           key_index=self.key_index,
                                                           start_position=self.start_position,
                                                           layout=self.archive_layout[0],
                                                           compression=self.archive_layout[1]), parallelism=1),
        )
        self.cleaner = Cleaner(self.cold, local=self.local, retention=self.retention, options=self.options,
                               recorder=self.recorder, clock=self.clock)

    def restart(self, *, lose_cache: bool = False) -> None:
        """A new process: every in-memory object rebuilt; the store, the bucket
        and (unless ``lose_cache``) the local manifest cache survive."""
        self.local.close()
        if lose_cache:
            import shutil

            shutil.rmtree(self.root / "state", ignore_errors=True)
        self._build()

    # --- producing -------------------------------------------------------------

    def produce(self, topic: str, queue_id: int = 0, n: int = 1, *, ts: int | None = None,
                body: bytes = b"x" * 64, keys: bool = True) -> list[int]:
        offsets = []
        for _ in range(n):
            stamp = self.clock.now_ms() if ts is None else ts
            off = self.writer.next_queue_offset(topic, queue_id)
            a = self.writer.put(topic, queue_id, body, keys=[f"k-{topic}-{queue_id}-{off}"] if keys else None,
                                unique_key=f"U{topic}{queue_id}{off:010d}", store_timestamp=stamp,
                                born_timestamp=stamp)
            start = a.commitlog_offset - a.commitlog_offset % self.writer.commitlog_file_size
            path = self.root / "store" / "commitlog" / f"{start:020d}"
            with open(path, "rb") as fh:
                fh.seek(a.commitlog_offset - start)
                raw = fh.read(a.size)
            self.produced.setdefault((topic, queue_id), {})[a.queue_offset] = (raw, stamp)
            self.physical.setdefault((topic, queue_id), {})[a.queue_offset] = a.commitlog_offset
            offsets.append(a.queue_offset)
        return offsets

    # --- running -----------------------------------------------------------------

    def dispatch(self) -> Any:
        self.local.refresh()
        return self.dispatcher.run_round()

    def clean(self, **kw: Any) -> Any:
        return self.cleaner.run_pass(**kw)

    def crash_before_commit(self, action: Callable[[], object]) -> list[str]:
        """Run ``action`` (a dispatch or a clean) dying at its first manifest
        commit, after its data uploads; returns the keys it uploaded."""

        class Crash(BaseException):
            pass

        def commit(*a: object, **k: object) -> None:
            raise Crash

        before = {e.key for e in self.events.data("put")}
        real_commit = self.cold.commit
        self.cold.commit = commit  # type: ignore[method-assign]
        try:
            action()
        except Crash:
            pass
        else:
            raise AssertionError("the action never reached a commit")
        finally:
            self.cold.commit = real_commit  # type: ignore[method-assign]
        return sorted({e.key for e in self.events.data("put")} - before)

    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    def manifest(self, topic: str, queue_id: int = 0) -> Manifest | None:
        return self.cold.fetch(topic, queue_id)

    def archive(self, topic: str, queue_id: int = 0) -> dict[int, bytes]:
        m = self.manifest(topic, queue_id)
        return read_archive(self.objects, m) if m else {}

    def expected(self, topic: str, queue_id: int = 0) -> dict[int, bytes]:
        return {o: raw for o, (raw, _ts) in self.produced.get((topic, queue_id), {}).items()}

    def close(self) -> None:
        self.local.close()
        self.writer.close()
