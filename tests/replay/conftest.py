"""Replay fixtures: one archive and one ``tiered replay`` per test module."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from replaykit import Archived, Replay, make_archive


@pytest.fixture(scope="module", autouse=True)
def client_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The C++ client writes its logs under $HOME: a temporary one."""
    home = tmp_path_factory.mktemp("home")
    old = os.environ.get("HOME")
    os.environ["HOME"] = str(home)
    yield home
    if old is not None:
        os.environ["HOME"] = old


@pytest.fixture(scope="module")
def archived(tmp_path_factory: pytest.TempPathFactory) -> Archived:
    return make_archive(tmp_path_factory.mktemp("replay"))


@pytest.fixture(scope="module")
def replay(archived: Archived) -> Iterator[Replay]:
    with Replay(archived.cold_url) as r:
        yield r
