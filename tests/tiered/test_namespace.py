"""Only ``tiered`` is installed (issue 32, item 5): the design card's top-level
dispatcher/, cleaner/ and metrics/ folders are ``tiered.dispatcher``,
``tiered.cleaner`` and ``tiered.metrics``, so no other distribution's
``metrics`` can collide with ours."""

from __future__ import annotations

import os
import pkgutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

import tiered

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("dispatcher", "cleaner", "metrics")


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_the_package_list_is_every_package_in_the_tree() -> None:
    found = {"tiered", *(m.name for m in pkgutil.walk_packages(tiered.__path__, "tiered.") if m.ispkg)}
    assert set(_setuptools()["packages"]) == found


def test_the_top_level_folders_are_tiered_subpackages_in_the_tree_and_in_the_wheel() -> None:
    mapping = _setuptools()["package-dir"]
    for name in FOLDERS:
        assert mapping[f"tiered.{name}"] == name
        link = ROOT / "tiered" / name
        assert link.is_symlink() and link.resolve() == (ROOT / name).resolve()


@pytest.mark.slow
def test_a_built_wheel_installs_tiered_and_the_spark_registration_only(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(ROOT)],
                   check=True, capture_output=True, env={**os.environ, "PIP_NO_INPUT": "1"})
    [wheel] = tmp_path.glob("*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"tiered", "pyspark_rocketmq.py"}
    for name in FOLDERS:
        assert f"tiered/{name}/__init__.py" in names
    assert {"tiered/metrics/alerts.yaml", "tiered/metrics/dashboards/tiered.json"} <= set(names)
