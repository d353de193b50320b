"""No import runs back up: the floors that keep and read the archive
(tiered.store, tiered.format, tiered.archive) import nothing from the
rooms built on them, so the dispatcher hands the archive a built segment
(``ColdTier.append``) and the archive never reaches back for its types."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "tiered"
LOWER = ("store", "format", "archive")
UPPER = ("tiered.dispatcher", "tiered.cleaner", "tiered.metrics", "tiered.query", "tiered.cli", "tiered.ops")


def _imports(path: Path) -> set[str]:
    """Every absolute module a file imports, at its top or inside a function."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
    return out


@pytest.mark.parametrize("floor", LOWER)
def test_the_lower_floors_import_nothing_from_the_rooms_above(floor: str) -> None:
    files = sorted((ROOT / floor).rglob("*.py"))
    assert files
    upward = {f"{path.relative_to(ROOT)}: {name}" for path in files for name in _imports(path)
              if ".".join(name.split(".")[:2]) in UPPER}
    assert not upward


def test_the_check_sees_an_upward_import(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from tiered.dispatcher.segment import BuiltSegment\n")
    assert "tiered.dispatcher.segment" in _imports(probe)
