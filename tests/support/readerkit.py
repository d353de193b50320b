"""Archives for the reader, CLI and Spark tests: a store written in the broker's
format (``StoreWriter``), archived by the real dispatcher with thresholds that
upload at once and small segments, so every queue has several segments; and
the ``archived`` fixtures the query and CLI tests' conftests take from here."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from counting import CountingRecorder

from tiered.dispatcher import ArchiveOptions, Dispatcher, DispatchOptions, TopicFilter
from tiered.archive.coldtier import ColdTier
from tiered.store.localstore import LocalStore
from tiered.archive.storage import ObjectStore
from tiered.store.storewriter import StoreWriter

CLUSTER = "ReadCluster"
BROKER = "broker-r"
T0 = 1_700_000_000_000  # 2023-11-14T22:13:20Z
HOUR = 3_600_000


@dataclass
class TopicSpec:
    topic: str
    queues: int = 2
    messages: int = 200  # per topic, round robin over the queues
    body_size: int = 300
    start_ms: int = T0
    interval_ms: int = 60_000  # store-time step between consecutive messages of the topic
    tags: tuple[str | None, ...] = ("TagA", "TagB", None)
    delay_every: int = 0  # every n-th message gets DELAY / REAL_TOPIC properties
    ipv6_every: int = 0


@dataclass
class Built:
    local: LocalStore
    messages: dict[tuple[str, int], int] = field(default_factory=dict)
    keys: dict[str, tuple[str, int, int]] = field(default_factory=dict)  # key -> (topic, queue, offset)


# Orders (2 queues) and a DLQ topic: the archive of the ``archived`` fixtures and Spark's ``build``
SPECS = [TopicSpec("Orders", queues=2, messages=240), TopicSpec("%DLQ%billing", queues=1, messages=40, delay_every=3,
                                                                 ipv6_every=4)]
# a smaller archive for the layout variants
SPECS_V2 = [TopicSpec("Orders", queues=2, messages=120), TopicSpec("%DLQ%billing", queues=1, messages=20,
                                                                   ipv6_every=4)]


def write_store(root: Path, specs: list[TopicSpec], *, seed: int = 7) -> dict[str, tuple[str, int, int]]:
    """Write the messages; returns key -> (topic, queue, offset) for every KEYS entry."""
    from tiered.format.codec import Host

    rng = random.Random(seed)
    keys: dict[str, tuple[str, int, int]] = {}
    with StoreWriter(root, commitlog_file_size=1 << 20, cq_entries_per_file=1000) as w:
        for spec in specs:
            for i in range(spec.messages):
                qid = i % spec.queues
                ts = spec.start_ms + i * spec.interval_ms
                key = f"{spec.topic}-k{i}"
                props = {}
                if spec.delay_every and i % spec.delay_every == 0:
                    props = {"DELAY": "3", "REAL_TOPIC": f"{spec.topic}-real"}
                six = bool(spec.ipv6_every and i % spec.ipv6_every == 0)
                a = w.put(spec.topic, qid, rng.randbytes(rng.randint(spec.body_size // 2, spec.body_size * 2)),
                          tags=spec.tags[i % len(spec.tags)], keys=[key, f"shared-{i % 5}"],
                          unique_key=f"UNIQ{spec.topic}{i:08d}", properties=props,
                          store_timestamp=ts, born_timestamp=ts - 5,
                          born_host=Host("::1", 40000 + i % 3) if six else Host(f"10.0.0.{i % 4}", 40000 + i % 3))
                keys[key] = (spec.topic, qid, a.queue_offset)
    return keys


def archive(local_root: Path, store: ObjectStore, state_dir: Path, *, segment_bytes: int = 16 * 1024,
            cluster: str = CLUSTER, broker: str = BROKER, **options: Any) -> LocalStore:
    """Archive everything in the store (as many rounds as needed); ``options``
    are further ``ArchiveOptions`` (key_index, layout, compression)."""
    local = LocalStore(local_root)
    cold = ColdTier(store, cluster, broker, state_dir=state_dir, writer="test")
    archive = ArchiveOptions(upload_bytes=1, max_delay_ms=0, segment_bytes=segment_bytes, **options)
    opts = DispatchOptions(archive=archive, parallelism=1, round_budget_s=float("inf"))
    d = Dispatcher(local, cold, options=opts, topic_filter=TopicFilter(include_system=False))
    for _ in range(20):
        result = d.run_round()
        assert result.ok, result.errors
        if result.lag_messages == 0 and result.segments == 0:
            break
    return local


def local_rows(local: LocalStore) -> list[dict]:
    """Every local record as ``Record.to_dict()`` plus the body."""
    out = []
    for topic, qid in local.queues():
        rng = local.queue_range(topic, qid)
        for item in local.iter_queue(topic, qid, rng.min_offset):
            d = item.record.to_dict()
            d["body"] = item.record.body_bytes()
            out.append(d)
    return out


@dataclass
class Archived:
    url: str
    store: ObjectStore
    counter: CountingRecorder
    local: LocalStore
    keys: dict[str, tuple[str, int, int]]


def _archived(cold_url: str, open_cold: Any, tmp_path: Path, layout: int) -> Archived:
    keys = write_store(tmp_path / "store", SPECS)
    counter = CountingRecorder()
    store = open_cold(cold_url, recorder=counter)
    local = archive(tmp_path / "store", store, tmp_path / "state", layout=layout)
    counter.reset()
    return Archived(cold_url, store, counter, local, keys)


@pytest.fixture
def archived(cold_url: str, open_cold: Any, tmp_path: Path) -> Archived:
    """SPECS archived in segments of ~16 KiB, on file:// and on the S3 server."""
    return _archived(cold_url, open_cold, tmp_path, 2)


@pytest.fixture
def archived_v1(cold_url: str, open_cold: Any, tmp_path: Path) -> Archived:
    """The same archived in layout 1 (three objects a segment, a bloom per
    segment in the manifest): for what only that layout has."""
    return _archived(cold_url, open_cold, tmp_path, 1)
