"""Reader test fixtures: one small archive per test, on file:// and on moto S3."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from readerkit import GetCounter, TopicSpec, archive, write_store  # noqa: E402
from tiered.store.localstore import LocalStore  # noqa: E402
from tiered.archive.storage import ObjectStore  # noqa: E402


@dataclass
class Archived:
    url: str
    store: ObjectStore
    counter: GetCounter
    local: LocalStore
    keys: dict[str, tuple[str, int, int]]


SPECS = [TopicSpec("Orders", queues=2, messages=240), TopicSpec("%DLQ%billing", queues=1, messages=40, delay_every=3,
                                                                 ipv6_every=4)]


def _archived(cold_url: str, open_cold, tmp_path: Path, layout: int) -> Archived:  # noqa: ANN001
    keys = write_store(tmp_path / "store", SPECS)
    counter = GetCounter()
    store = open_cold(cold_url, recorder=counter)
    local = archive(tmp_path / "store", store, tmp_path / "state", layout=layout)
    counter.reset()
    return Archived(cold_url, store, counter, local, keys)


@pytest.fixture
def archived(cold_url: str, open_cold, tmp_path: Path) -> Archived:
    """Orders (2 queues) and a DLQ topic, archived in segments of ~16 KiB."""
    return _archived(cold_url, open_cold, tmp_path, 2)


@pytest.fixture
def archived_v1(cold_url: str, open_cold, tmp_path: Path) -> Archived:
    """The same archived in layout 1 (three objects a segment, a bloom per
    segment in the manifest): for what only that layout has."""
    return _archived(cold_url, open_cold, tmp_path, 1)
