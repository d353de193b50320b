"""Command-line entry point: the composition root.

Only here do ``tiered``, ``dispatcher``, ``cleaner`` and ``metrics`` meet;
each command module registers its commands on the shared Typer app. The
modules are imported when the app's command list is first needed (every
one of them, in ``COMMAND_MODULES`` order), except that ``main`` imports
only the module of a command in ``_ALONE``: those need nothing else, and
importing the rest cost `tiered produce` most of its time.
"""

from __future__ import annotations

import importlib
import sys

from tiered.cli.app import app

# every command module, in the order their commands are listed
COMMAND_MODULES = ("archive", "demo", "serve", "status", "store", "clean", "query", "repair", "restore", "admin",
                   "replay")
# command -> the one module it needs (tests/cli/test_cli_store.py checks the list against the app)
_ALONE = {"produce": "store"}
# global options that may come before the command, none taking a value
_GLOBAL_FLAGS = {"--debug"}


def load_commands() -> None:
    for name in COMMAND_MODULES:
        importlib.import_module(f"tiered.cli.{name}")


app.loader = load_commands


def _alone(argv: list[str]) -> str | None:
    """The module that alone serves this command line, if any."""
    for arg in argv:
        if arg not in _GLOBAL_FLAGS:
            return _ALONE.get(arg)
    return None


def main() -> None:
    module = _alone(sys.argv[1:])
    if module is not None:
        app.load_only(f"tiered.cli.{module}")
    app()


__all__ = ["app", "main", "load_commands", "COMMAND_MODULES"]
