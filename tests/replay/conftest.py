"""Replay fixtures: one archive and one ``tiered replay`` per test module."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from replaykit import Expected, Replay, archive, expected, write  # noqa: E402
from tiered.archive.storage import open_store  # noqa: E402

MESSAGES = 60  # per topic


@dataclass
class Archived:
    root: Path
    cold_url: str
    state: Path
    messages: dict[tuple[str, int, int], Expected]


@pytest.fixture(scope="module", autouse=True)
def client_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The C++ client writes its logs under $HOME: a temporary one."""
    home = tmp_path_factory.mktemp("home")
    old = os.environ.get("HOME")
    os.environ["HOME"] = str(home)
    yield home
    if old is not None:
        os.environ["HOME"] = old


def make_archive(base: Path) -> Archived:
    root, cold, state = base / "store", base / "cold", base / "state"
    write(root, 0, MESSAGES)
    archive(root, open_store(f"file://{cold}"), state)
    return Archived(root, f"file://{cold}", state, expected(root))


@pytest.fixture(scope="module")
def archived(tmp_path_factory: pytest.TempPathFactory) -> Archived:
    return make_archive(tmp_path_factory.mktemp("replay"))


@pytest.fixture(scope="module")
def replay(archived: Archived) -> Iterator[Replay]:
    with Replay(archived.cold_url) as r:
        yield r
