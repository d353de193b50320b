"""Dispatcher test fixtures. Test helpers live in ``tests/helpers`` as plain
modules (``faultproxy``, ``dispatchkit``): that directory is put on
``sys.path`` here. Not ``tests/`` itself: its ``dispatcher/`` folder would
then be importable as a namespace package shadowing the real one."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_HELPERS = str(Path(__file__).resolve().parents[1] / "helpers")
if _HELPERS not in sys.path:
    sys.path.insert(0, _HELPERS)

# Run as plain ``pytest`` (not ``python -m pytest``), sys.path holds ``tests/``
# (for the rootdir conftest) but not the repository root, so ``import
# dispatcher`` would find this very folder as a namespace package before the
# editable install's finder is asked. Put the root first, as ``python -m``
# does, and drop a namespace ``dispatcher`` imported meanwhile.
_ROOT = str(Path(__file__).resolve().parents[2])
if sys.path[0] != _ROOT:
    sys.path.insert(0, _ROOT)
_mod = sys.modules.get("dispatcher")
if _mod is not None and getattr(_mod, "__file__", None) is None:
    del sys.modules["dispatcher"]

from dispatchkit import CountingRecorder  # noqa: E402
from tiered.clock import ManualClock  # noqa: E402


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def recorder() -> CountingRecorder:
    return CountingRecorder()
