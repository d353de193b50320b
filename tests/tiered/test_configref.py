"""The configuration reference (docs/configuration.md) is made from the
settings model: it names every setting, describes each one, and its
defaults, written back into a YAML file, load as the defaults they name."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml
from pydantic import BaseModel

from tiered.config import Settings, load_settings
from tiered.configref import reference

ROOT = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^\| `(?P<key>[a-z_.0-9]+)` \| (?P<default>.*?) \| (?P<accepts>.*?) \| `(?P<env>TIERED_[A-Z_0-9]+)` "
                 r"\| (?P<doc>.*) \|$")


def _leaves(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for name, field in model.model_fields.items():
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            out += _leaves(field.annotation, (*prefix, name))
        else:
            out.append((*prefix, name))
    return out


def _rows() -> dict[str, dict[str, str]]:
    return {m["key"]: m.groupdict() for line in reference().splitlines() if (m := ROW.match(line))}


def test_the_committed_reference_is_what_the_model_generates() -> None:
    committed = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert committed == reference(), "regenerate it: tiered config reference > docs/configuration.md"


def test_every_setting_has_a_row_an_environment_variable_and_a_description() -> None:
    rows = _rows()
    leaves = [".".join(p) for p in _leaves(Settings)]
    assert list(rows) == leaves
    for key, row in rows.items():
        assert row["env"] == "TIERED_" + key.replace(".", "__").upper()
        assert len(row["doc"]) > 10, key  # a field without a docstring would have none
    assert rows["dispatch.segment_bytes"]["default"] == "`32MiB`" and rows["dispatch.interval"]["default"] == "`20s`"
    assert rows["s3.max_attempts"]["accepts"] == "integer 1-20"
    assert rows["s3.secret_access_key"]["accepts"] == "secret string or `null`"
    assert rows["log.level"]["accepts"] == "`DEBUG` \\| `INFO` \\| `WARNING` \\| `ERROR`"


def test_the_defaults_it_names_load_back_as_the_defaults(tmp_path: Path) -> None:
    """Every default but the computed ones, spelled as the reference spells
    it, in one YAML file: the settings loaded are the defaults."""
    doc: dict = {}
    computed = []
    for key, row in _rows().items():
        if not row["default"].startswith("`") or not row["default"].endswith("`"):
            computed.append(key)
            continue
        node = doc
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = yaml.safe_load(row["default"].strip("`"))
    assert computed == ["cold_url", "state_dir", "broker"]
    path = tmp_path / "tiered.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    loaded, defaults = load_settings(path), Settings()
    for parts in _leaves(Settings):
        key = ".".join(parts)
        if key in computed:
            continue
        got, want = loaded, defaults
        for part in parts:
            got, want = getattr(got, part), getattr(want, part)
        assert got == want, key


def test_the_cli_prints_it() -> None:
    out = subprocess.run([sys.executable, "-m", "tiered.cli", "config", "reference"], capture_output=True,
                         text=True, timeout=120, check=True)
    assert out.stdout == reference()
