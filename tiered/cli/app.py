"""The Typer application every command module registers on.

Global options (before the command): ``--debug`` (tracebacks), ``--version``;
shell completion through ``--install-completion`` / ``--show-completion``.
Every exception a command leaves unhandled becomes one or two lines and an
exit code in one place (:mod:`tiered.cli.failures`).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as dist_version
from typing import Annotated, Any, NoReturn

import typer
from typer.exceptions import TyperException
from rich.console import Console
from typer.core import TyperGroup, TyperOption
from typer.models import CommandInfo

from tiered.cli import failures
from tiered.cli.output import error


_option_type = TyperOption.display_type_rich


def _no_type_for_flags(self: TyperOption, ctx: Any) -> str | None:
    """The type shown after an option in help: none for a flag (``--json``,
    ``--debug``, ``--help``), which takes no value. Typer's rich help prints
    one for every option (``--json <bool>``), its plain help only for options
    taking a value; every command's help, and the root's, goes through here."""
    return None if self.is_flag or self.count else _option_type(self, ctx)


TyperOption.display_type_rich = _no_type_for_flags  # type: ignore[method-assign]


class TieredGroup(TyperGroup):
    """Runs a command and maps what escapes it to an exit code and a message."""

    # ``Any``: typer's vendored click Context, private to typer
    def invoke(self, ctx: Any) -> Any:
        failures.reset()
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, TyperException, SystemExit):
            raise
        except KeyboardInterrupt:
            error("interrupted")
            raise typer.Exit(130) from None
        except Exception as exc:  # noqa: BLE001 - the CLI's edge: one message and a code, not a traceback
            debug = bool(ctx.meta.get("tiered.debug")) or os.environ.get("TIERED_DEBUG") == "1"
            raise typer.Exit(failures.report(exc, debug=debug)) from None


class TieredTyper(typer.Typer):
    """The app, whose commands the command modules register when imported.

    Imports are most of what a short command costs (`tiered produce` spent
    0.4 s importing every module, the archive's and the dispatcher's
    included): ``tiered.cli.main`` imports only the module of a command
    that needs nothing else (``load_only``); everything else, ``--help``
    and every test's ``from tiered.cli import app`` included, gets every
    command, loaded by ``loader`` on first look at the command list.
    """

    loader: Callable[[], None] | None = None
    _loading = False
    _restricted = False
    _complete = False

    @property
    def registered_commands(self) -> list[CommandInfo]:
        if not (self._complete or self._loading or self._restricted) and self.loader is not None:
            self._loading = True
            try:
                self.loader()
            finally:
                self._loading = False
            self._complete = True
        return self._commands

    @registered_commands.setter
    def registered_commands(self, value: list[CommandInfo]) -> None:
        self._commands = value

    def load_only(self, module: str) -> None:
        """Register the commands of ``module`` alone, for this process's one command."""
        self._restricted = True
        importlib.import_module(module)


app = TieredTyper(
    name="tiered",
    help="Tiered-storage archival sidecar for Apache RocketMQ.\n\n"
         "Exit codes: 0 ok, 1 findings, 2 usage or configuration, 3 storage unreachable or refused.",
    cls=TieredGroup,
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)

# kept for commands that print rich markup; plain messages go through tiered.cli.output
err_console = Console(stderr=True, soft_wrap=True)


def package_version() -> str:
    try:
        return dist_version("rocketmq-tiered")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
        return "unknown"


def _version(value: bool) -> None:
    if value:
        from tiered import native

        print(f"tiered {package_version()}")
        print(native.describe())
        raise typer.Exit(0)


@app.callback()
def _root(
    ctx: typer.Context,
    debug: Annotated[bool, typer.Option("--debug", help="Print tracebacks of errors.")] = False,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    ctx.meta["tiered.debug"] = debug


def fail(message: str, code: int = 1) -> NoReturn:
    """One line on stderr, then exit with ``code`` (see tiered.cli.failures for the codes)."""
    error(message)
    raise typer.Exit(code)
