"""Dispatcher test fixtures (helpers: tests/support/dispatchkit.py)."""

from __future__ import annotations

import pytest
from dispatchkit import CountingRecorder

from tiered.clock import ManualClock


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def recorder() -> CountingRecorder:
    return CountingRecorder()
