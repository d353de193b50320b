"""BatchCQ test fixtures; helpers live in ``bcqkit`` beside this file."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bcqkit import TOPIC, run, unconfirmed  # noqa: E402


@pytest.fixture
def archived(rmq5_store: Path, tmp_path: Path) -> tuple[Path, str]:
    """The 5.3.3 store's BatchCQ topic dispatched into a file:// archive: (store, cold URL)."""
    store, cold = unconfirmed(rmq5_store), f"file://{tmp_path}/cold"
    code, _out, err = run(tmp_path, "dispatch", "--all", "--store", str(store), "--cold", cold, "--topic", TOPIC)
    assert code == 0, err
    return store, cold
