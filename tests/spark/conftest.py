"""Spark test fixtures: archives built like the reader tests' (``tests/reader/readerkit.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reader"))

from readerkit import GetCounter, TopicSpec, archive, write_store  # noqa: E402

SPECS = [TopicSpec("Orders", queues=2, messages=240), TopicSpec("%DLQ%billing", queues=1, messages=40, delay_every=3,
                                                                 ipv6_every=4)]


@pytest.fixture
def build(open_cold, tmp_path: Path):
    """build(url, specs=SPECS) -> (store, local, keys): a store written and archived into ``url``."""

    def _build(url: str, specs=None, *, name: str = "store"):  # noqa: ANN202
        keys = write_store(tmp_path / name, specs or SPECS)
        store = open_cold(url, recorder=GetCounter())
        local = archive(tmp_path / name, store, tmp_path / f"state-{name}")
        return store, local, keys

    return _build
