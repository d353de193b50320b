"""Dispatcher test fixtures. Test helpers live in ``tests/helpers`` as plain
modules (``faultproxy``, ``dispatchkit``): that directory is put on
``sys.path`` here."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_HELPERS = str(Path(__file__).resolve().parents[1] / "helpers")
if _HELPERS not in sys.path:
    sys.path.insert(0, _HELPERS)

from dispatchkit import CountingRecorder  # noqa: E402
from tiered.clock import ManualClock  # noqa: E402


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def recorder() -> CountingRecorder:
    return CountingRecorder()
