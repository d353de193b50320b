"""Spark test fixtures: archives built like the reader tests' (``tests/support/readerkit.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from counting import CountingRecorder
from readerkit import SPECS, archive, write_store


@pytest.fixture
def build(open_cold, tmp_path: Path):
    """build(url, specs=SPECS) -> (store, local, keys): a store written and archived into ``url``."""

    def _build(url: str, specs=None, *, name: str = "store"):  # noqa: ANN202
        keys = write_store(tmp_path / name, specs or SPECS)
        store = open_cold(url, recorder=CountingRecorder())
        local = archive(tmp_path / name, store, tmp_path / f"state-{name}")
        return store, local, keys

    return _build
