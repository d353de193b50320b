"""End-to-end test fixtures: the BatchCQ topic of the RocketMQ 5.3.3 store
archived (helpers in tests/support/bcqkit.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from bcqkit import TOPIC, run, unconfirmed


@pytest.fixture
def archived(rmq5_store: Path, tmp_path: Path) -> tuple[Path, str]:
    """The 5.3.3 store's BatchCQ topic dispatched into a file:// archive: (store, cold URL)."""
    store, cold = unconfirmed(rmq5_store), f"file://{tmp_path}/cold"
    code, _out, err = run(tmp_path, "dispatch", "--all", "--store", str(store), "--cold", cold, "--topic", TOPIC)
    assert code == 0, err
    return store, cold
