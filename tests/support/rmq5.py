"""The store RocketMQ 5.3.3's own code wrote (``../shared/fixtures``).

It lives beside the checkout, never inside it: CI has ``../shared`` next to
the clone. Tests that need it take the ``rmq5_store`` fixture (a fresh,
writable copy per test) or ``rmq5_expected`` (RocketMQ's own read-back, one
dict per ConsumeQueue entry); both skip, saying why, where it is absent.
"""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path
from typing import Any

TARBALL = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "rmq5-dev-store.tar.xz"
SKIP_REASON = f"the RocketMQ 5.3.3 store fixture is not at {TARBALL} (CI has ../shared beside the checkout)"


def unpack(into: Path) -> Path:
    """Unpack the tarball under ``into``; the ``rmq5-dev-store`` folder."""
    with tarfile.open(TARBALL, "r:xz") as tar:
        tar.extractall(into, filter="data")
    return into / "rmq5-dev-store"


def copy_store(unpacked: Path, into: Path) -> Path:
    """A writable copy of the unpacked store directory (the 38 MB, almost
    empty ``timerwheel`` copied sparse-free is cheap enough once a test)."""
    dest = into / "store"
    shutil.copytree(unpacked / "store", dest)
    return dest


def read_expected(unpacked: Path) -> list[dict[str, Any]]:
    with open(unpacked / "expected.jsonl", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]
