"""Where `tiered demo` writes: under the state directory, never the working
directory (the whole run: tests/service/test_service_demo.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tiered.cli.demo import demo_root, removal


def test_the_demo_goes_under_the_state_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.delenv("TIERED_STATE_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert demo_root(None) == tmp_path / "xdg" / "tiered" / "demo"
    monkeypatch.setenv("TIERED_STATE_DIR", str(tmp_path / "state"))
    assert demo_root(None) == tmp_path / "state" / "demo"
    # --dir, relative to where the command runs, when the operator asks for it
    assert demo_root(Path("here")) == cwd / "here"
    assert list(cwd.iterdir()) == []


def test_the_removal_command_can_be_pasted(tmp_path: Path) -> None:
    root = tmp_path / "a dir; with $(odd) characters"
    (root / "cold").mkdir(parents=True)
    hint = removal(root)
    assert hint.startswith("rm -rf ")
    subprocess.run(["sh", "-c", hint], check=True, env={"PATH": os.environ["PATH"]})
    assert not root.exists() and tmp_path.exists()
