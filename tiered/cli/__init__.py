"""Command-line entry point: the composition root.

Only here do ``tiered``, ``dispatcher``, ``cleaner`` and ``metrics`` meet;
each command module registers its commands on the shared Typer app.
"""

from __future__ import annotations

from tiered.cli.app import app
from tiered.cli import archive as _archive  # noqa: F401  (registers commands)
from tiered.cli import demo as _demo  # noqa: F401
from tiered.cli import serve as _serve  # noqa: F401
from tiered.cli import status as _status  # noqa: F401
from tiered.cli import store as _store  # noqa: F401
from tiered.cli import clean as _clean  # noqa: F401
from tiered.cli import query as _query  # noqa: F401
from tiered.cli import repair as _repair  # noqa: F401
from tiered.cli import restore as _restore  # noqa: F401
from tiered.cli import admin as _admin  # noqa: F401


def main() -> None:
    app()


__all__ = ["app", "main"]
