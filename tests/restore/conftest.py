"""Restore test fixtures: the every-kind store, archived on file:// and moto S3."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from restorekit import build  # noqa: E402
from tiered.archive.storage import ObjectStore  # noqa: E402


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
