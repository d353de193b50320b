"""The Typer application every command module registers on."""

from __future__ import annotations

import sys
from typing import NoReturn

import typer
from rich.console import Console

app = typer.Typer(
    name="tiered",
    help="Tiered-storage archival sidecar for Apache RocketMQ.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

err_console = Console(stderr=True)


def fail(message: str, code: int = 1) -> NoReturn:
    """One line on stderr, then exit with ``code`` (2 = bad usage or config)."""
    print(f"tiered: {message}", file=sys.stderr)
    raise typer.Exit(code)
