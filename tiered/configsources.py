"""Where each setting comes from: flags, ``TIERED_*`` environment, the YAML file
(and its line), or the default.

Used to name the source in configuration errors ("dispatch.interval
(tiered.yaml line 12): not a duration"), to warn about ``TIERED_*`` variables
that are no setting (a typo is otherwise silently ignored), and by
``tiered config show``.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, SecretStr

ENV_PREFIX = "TIERED_"
# variables of the CLI itself, not settings
CLI_ENV = frozenset({"TIERED_DEBUG"})
MASK = "**********"


def env_name(path: Sequence[str | int]) -> str:
    return ENV_PREFIX + "__".join(str(p) for p in path).upper()


def yaml_problem(path: str | Path, exc: yaml.YAMLError) -> str:
    """``FILE line L column C: what`` for a YAML syntax error."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or type(exc).__name__
    if mark is None:
        return f"{path}: {problem}"
    return f"{path} line {mark.line + 1} column {mark.column + 1}: {problem}"


def key_line(path: str | Path, loc: Sequence[str | int]) -> int | None:
    """The 1-based line of ``loc`` (the deepest key found) in a YAML file."""
    try:
        node = yaml.compose(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return None
    line = None
    for part in loc:
        if not isinstance(node, yaml.MappingNode):
            break
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode) and k.value == str(part):
                line, node = k.start_mark.line + 1, v
                break
        else:
            break
    return line


def _in_mapping(data: Any, loc: Sequence[str | int]) -> bool:
    for part in loc:
        if not isinstance(data, Mapping) or str(part) not in data:
            return False
        data = data[str(part)]
    return True


def _env_for(loc: Sequence[str | int], environ: Mapping[str, str]) -> str | None:
    upper = {k.upper(): k for k in environ}
    for depth in range(len(loc), 0, -1):  # TIERED_S3__REGION, or a whole TIERED_S3 JSON value
        name = env_name(loc[:depth])
        if name in upper:
            return upper[name]
    return None


def source_of(loc: Sequence[str | int], *, flags: Mapping[str, Any], config_file: str | Path | None,
              file_data: Any = None, environ: Mapping[str, str] | None = None) -> str:
    """``command line``, ``env TIERED_X``, ``FILE line N``, or ``default``."""
    environ = os.environ if environ is None else environ
    dotted = ".".join(str(p) for p in loc)
    if any(dotted == k or dotted.startswith(k + ".") or k.startswith(dotted + ".") for k in flags):
        return "command line"
    env = _env_for(loc, environ)
    if env is not None:
        return f"env {env}"
    if config_file is not None and _in_mapping(file_data, loc):
        line = key_line(config_file, loc)
        return f"{config_file} line {line}" if line else str(config_file)
    return "default"


def _known_paths(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> tuple[set[str], set[str]]:
    """(exact setting paths, paths under which any name is valid: dict settings)."""
    exact: set[str] = set()
    open_: set[str] = set()
    for name, field in model.model_fields.items():
        path = (*prefix, name)
        exact.add("__".join(path))
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            e, o = _known_paths(ann, path)
            exact |= e
            open_ |= o
        elif getattr(ann, "__origin__", None) is dict:
            open_.add("__".join(path))
    return exact, open_


def unknown_env(model: type[BaseModel], environ: Mapping[str, str] | None = None) -> list[str]:
    """One warning per ``TIERED_*`` variable that names no setting, with a guess."""
    environ = os.environ if environ is None else environ
    exact, open_ = _known_paths(model)
    known_upper = {p.upper() for p in exact}
    out = []
    for name in sorted(environ):
        # TIERED_TEST_*: the test suite's own variables (which S3 server), not settings
        if not name.upper().startswith(ENV_PREFIX) or name.upper() in CLI_ENV or name.upper().startswith("TIERED_TEST_"):
            continue
        path = name[len(ENV_PREFIX):].upper()
        if path in known_upper or any(path.startswith(o.upper() + "__") for o in open_):
            continue
        guess = difflib.get_close_matches(path, sorted(known_upper), n=1, cutoff=0.6)
        hint = f" (did you mean {ENV_PREFIX}{guess[0]}?)" if guess else ""
        out.append(f"{name} is not a setting and is ignored{hint}")
    return out


@dataclass(frozen=True, kw_only=True)
class Effective:
    key: str
    value: Any
    source: str


def _leaves(value: Any, path: tuple[str, ...]) -> list[tuple[tuple[str, ...], Any]]:
    if isinstance(value, BaseModel):
        out: list[tuple[tuple[str, ...], Any]] = []
        for name in type(value).model_fields:
            out += _leaves(getattr(value, name), (*path, name))
        return out
    if isinstance(value, dict) and value:
        return [leaf for k, v in value.items() for leaf in _leaves(v, (*path, str(k)))]
    return [(path, value)]


def _plain(value: Any) -> Any:
    if isinstance(value, SecretStr):
        return MASK
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def explain(settings: BaseModel, *, flags: Mapping[str, Any], config_file: str | Path | None,
            environ: Mapping[str, str] | None = None) -> list[Effective]:
    """Every effective setting, its value (secrets masked) and where it came from."""
    file_data = None
    if config_file is not None:
        file_data = yaml.safe_load(Path(config_file).read_text(encoding="utf-8"))
    given = {k: v for k, v in flags.items() if v is not None}
    return [Effective(key=".".join(path), value=_plain(value),
                      source=source_of(path, flags=given, config_file=config_file, file_data=file_data,
                                       environ=environ))
            for path, value in _leaves(settings, ())]
