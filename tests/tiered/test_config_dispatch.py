"""Keys of removed dispatch features (the per-queue switch, the build worker
processes) still load, with a warning naming each: a YAML file written for
an older release must not stop the service."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tiered.cli import app
from tiered.config import load_settings


def test_removed_dispatch_keys_warn_and_load(tmp_path: Path) -> None:
    cfg = tmp_path / "tiered.yaml"
    cfg.write_text("dispatch:\n  single_pass: false\n  build_processes: 4\n  parallelism: 3\n")
    with pytest.warns(FutureWarning) as caught:
        settings = load_settings(cfg)
    assert settings.dispatch.parallelism == 3  # the rest of the section still applies
    assert not hasattr(settings.dispatch, "single_pass") and not hasattr(settings.dispatch, "build_processes")
    said = [str(w.message) for w in caught]
    assert sorted(m.split(" ")[0] for m in said) == ["dispatch.build_processes", "dispatch.single_pass"]
    assert all("is deprecated and ignored" in m for m in said)


def test_a_file_without_them_warns_nothing(tmp_path: Path) -> None:
    cfg = tmp_path / "tiered.yaml"
    cfg.write_text("dispatch:\n  parallelism: 3\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_settings(cfg)


def test_the_cli_runs_with_a_removed_key(tmp_path: Path) -> None:
    cfg = tmp_path / "tiered.yaml"
    cfg.write_text("dispatch:\n  single_pass: true\n")
    result = CliRunner().invoke(app, ["config", "show", "--config", str(cfg), "--cold", f"file://{tmp_path}/cold",
                                      "--cluster", "C", "--broker", "b"],
                                env={"TIERED_STATE_DIR": str(tmp_path / "state")})
    assert result.exit_code == 0, result.output  # not 2: the key is known, only retired
    assert "single_pass" not in result.stdout
    assert result.stderr.splitlines() == [
        "tiered: warning: dispatch.single_pass is deprecated and ignored: every round builds its segments in one "
        "CommitLog pass; remove it from the configuration"]


def test_an_unknown_key_is_still_refused(tmp_path: Path) -> None:
    cfg = tmp_path / "tiered.yaml"
    cfg.write_text("dispatch:\n  single_passes: false\n")
    with pytest.raises(Exception, match="dispatch.single_passes"):
        load_settings(cfg)
