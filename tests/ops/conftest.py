"""Restore test fixtures: the every-kind store, archived on file:// and moto S3."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from restorekit import build

from tiered.archive.storage import ObjectStore


@dataclass
class Archived:
    url: str
    store: ObjectStore
    root: Path


@pytest.fixture
def archived(cold_url: str, open_cold, tmp_path: Path) -> Archived:
    store = open_cold(cold_url)
    build(tmp_path / "store", store, tmp_path / "state")
    return Archived(cold_url, store, tmp_path / "store")
