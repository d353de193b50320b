"""Every command's --help: a flag shows no value type (it takes none), an
option taking a value shows its type."""

from __future__ import annotations

from collections.abc import Iterator

import typer
from typer.testing import CliRunner

from tiered.cli import app


def commands(group, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], object]]:  # noqa: ANN001
    """(path, command) for the root and every command under it, sub-groups included."""
    yield path, group
    for name, command in getattr(group, "commands", {}).items():
        yield from commands(command, (*path, name))


def option_rows(text: str) -> dict[str, str]:
    """Each option of a help text -> what follows its names on its row (short names dropped):
    "│ *  --limit,--count  -n  <int>  At most..." gives "--limit" and "--count" -> "<int>  At most..."."""
    rows = {}
    for line in text.splitlines():
        cells = line.strip("│ ").removeprefix("* ").split()
        if cells and cells[0].startswith("--"):
            rest = cells[1:]
            while rest and rest[0].startswith("-") and not rest[0].startswith("--"):
                rest = rest[1:]
            for name in cells[0].split(","):
                rows[name] = " ".join(rest)
    return rows


def test_no_help_shows_a_value_type_for_a_flag() -> None:
    root = typer.main.get_command(app)
    seen = flags = valued = 0
    for path, command in commands(root):
        result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "200", "TERMINAL_WIDTH": "200"})
        assert result.exit_code == 0, (path, result.output)
        assert "<bool>" not in result.output, (path, result.output)
        rows = option_rows(result.output)
        for param in command.params:  # type: ignore[attr-defined]
            longs = [o for o in param.opts if o.startswith("--")]
            if param.param_type_name != "option" or param.hidden or not longs:
                continue
            after = rows[longs[0]]
            if param.is_flag:
                flags += 1
                assert not after.startswith("<"), (path, longs, after)  # "--json  One JSON object..."
            else:
                valued += 1
                assert after.startswith("<"), (path, longs, after)  # "--cold  <str>  Cold-tier URL..."
        seen += 1
    assert seen >= 20 and flags >= 30 and valued >= 100, (seen, flags, valued)  # every command was looked at
