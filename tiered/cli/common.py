"""Options shared by the commands, and loading settings from them once."""

from __future__ import annotations

from collections.abc import Callable
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from tiered.cli.app import fail
from tiered.cli.output import warn
from tiered.configsources import unknown_env
from tiered.config import Settings, load_settings
from tiered.errors import ConfigError

TopicsOpt = Annotated[Optional[list[str]], typer.Option(
    "--topic", help="Only this topic (repeatable; shell patterns like 'Order*' work).")]
OnceOpt = Annotated[bool, typer.Option("--once", hidden=True,
                                       help="Accepted for scripts: one run is the only mode ('tiered serve' schedules).")]
ConfigOpt = Annotated[Optional[Path], typer.Option("--config", help="YAML configuration file.")]
StoreOpt = Annotated[Optional[Path], typer.Option("--store", help="Broker store directory.")]
ColdOpt = Annotated[Optional[str], typer.Option("--cold", help="Cold-tier URL: file:///path or s3://bucket/prefix.")]
ClusterOpt = Annotated[Optional[str], typer.Option("--cluster", help="Cluster name (first key level).")]
BrokerOpt = Annotated[Optional[str], typer.Option("--broker", help="Broker name (second key level).")]
BrokerModeOpt = Annotated[Optional[str], typer.Option(
    "--broker-mode", help="auto, default, controller or dledger: only controller mode holds the archive at the "
                          "checkpoint's confirm offset (auto: told from the store).")]

WideOpt = Annotated[bool, typer.Option("--wide", help="More columns.")]
OutputOpt = Annotated[Optional[str], typer.Option("--output", "-o", help="wide (as --wide) or json (as --json).")]


def output_mode(output: str | None, *, as_json: bool, wide: bool) -> tuple[bool, bool]:
    """(as_json, wide) from ``-o``/``--output`` and the flags; exit 2 on an unknown format."""
    if output is not None and output not in ("wide", "json", "table"):
        fail(f"--output {output}: one of table, wide, json", 2)
    return as_json or output == "json", wide or output == "wide"


def settings_from(config: Path | None, **flags: Any) -> Settings:
    """Settings with flags > TIERED_* env > file > defaults; exit 2 with one line on error.
    ``TIERED_*`` variables that name no setting get a warning each."""
    for problem in unknown_env(Settings):
        warn(problem)
    try:
        return load_settings(config, **flags)
    except ConfigError as exc:
        fail(str(exc), 2)


def topic_matcher(topics: list[str] | None) -> Callable[[str], bool] | None:
    """A predicate for ``--topic`` values (exact names or shell patterns); None = every topic."""
    if not topics:
        return None
    patterns = tuple(topics)
    return lambda topic: any(topic == p or fnmatchcase(topic, p) for p in patterns)
