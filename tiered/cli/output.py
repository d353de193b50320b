"""The CLI's one output layer: tables, JSON, progress and errors.

Every command prints through these functions so that all of them behave
alike:

- **Tables** (:func:`table`) follow the terminal's width, and 80 columns
  when stdout is not a terminal; a cell never loses characters. A table
  that does not fit prints one record per line instead
  (``topic=Orders  queue=0  ...``, values with spaces quoted), so nothing is
  cut or wrapped mid-word. With ``--json`` the same rows are printed as JSON
  lines (one object per row).
- **JSON** (:func:`print_json` for one report, :func:`json_lines` for a
  stream of rows or records): compact, one JSON value per line, UTF-8,
  bytes as base64, times as given (the callers pass ISO 8601 UTC strings or
  epoch milliseconds). One style everywhere, so ``jq`` works on every
  command.
- **Progress** (:func:`progress`): a rich bar with rate and ETA on stderr
  when stderr is a terminal, nothing at all otherwise (logs and pipes stay
  clean). The API, for any long command (``restore`` included)::

      with progress("restoring", total=n_bytes, unit="bytes") as bar:
          for chunk in work:
              ...
              bar.advance(len(chunk))
          bar.set_total(new_total)   # when the size is learnt late
          bar.set_completed(done)    # when the work reports a position instead

  ``unit`` is ``"bytes"`` (rate in B/s, KiB/s...) or any noun counted one by
  one (``"records"``, ``"segments"``): the rate is then "N records/s".
  ``total=None`` shows a spinner-like pulse with the rate and no ETA.
- **Errors and notes** (:func:`error`, :func:`warn`, :func:`note`): plain
  lines on stderr prefixed ``tiered:``; never hard-wrapped, whatever the
  width, so a redirected log keeps one line per message.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TextIO

from rich.console import Console
from rich.progress import (BarColumn, DownloadColumn, MofNCompleteColumn, Progress, ProgressColumn, Task,
                           TaskProgressColumn, TextColumn, TimeRemainingColumn, TransferSpeedColumn)
from rich.table import Table
from rich.text import Text

NOT_A_TTY_WIDTH = 80


def width(stream: TextIO | None = None) -> int:
    """Columns of the terminal behind ``stream`` (stdout), 80 when it is not one."""
    stream = stream or sys.stdout
    try:
        if stream.isatty():
            return shutil.get_terminal_size((NOT_A_TTY_WIDTH, 24)).columns
    except (AttributeError, ValueError):  # a closed or replaced stream
        pass
    return NOT_A_TTY_WIDTH


def _console(stream: TextIO) -> Console:
    # rich's own guess forces 80 or reads COLUMNS; being explicit keeps tables
    # and progress the same under a test runner, a pipe and a terminal
    return Console(file=stream, width=width(stream), soft_wrap=False, highlight=False,
                   force_terminal=None, color_system="auto" if stream.isatty() else None)


def _json_default(value: Any) -> Any:
    import base64
    from datetime import date, datetime

    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)


def dumps(value: Any) -> str:
    """The one JSON style: compact, UTF-8, bytes as base64."""
    return json.dumps(value, default=_json_default, ensure_ascii=False, separators=(",", ":"))


def out(line: str) -> None:
    """One line on stdout; a closed pipe (``tiered cat | head``) ends the command quietly."""
    try:
        sys.stdout.write(line + "\n")
    except BrokenPipeError:
        import typer

        try:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the interpreter's final flush
        finally:
            raise typer.Exit(0)


def print_json(value: Any) -> None:
    """One JSON document (a report) on one line of stdout."""
    out(dumps(value))


def json_lines(rows: Iterable[Mapping[str, Any]]) -> None:
    """A stream of JSON objects, one per line (rows of a table, records)."""
    for row in rows:
        out(dumps(row))


def table(columns: Sequence[str], rows: Iterable[Sequence[Any]], *, as_json: bool = False,
          right: Iterable[str] = ()) -> None:
    """Rows as a table fitted to the terminal, or as JSON lines keyed by column
    name (``as_json``). Cells are printed whole: long ones wrap."""
    if as_json:
        json_lines({c.replace(" ", "_"): v for c, v in zip(columns, row, strict=True)} for row in rows)
        return
    aligned = set(right)
    cells = [["-" if v is None else str(v) for v in row] for row in rows]
    natural = sum(max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)) + 2 * (len(columns) - 1)
    if natural > width():
        # wrapping would cut times and names mid-word: one record per line instead
        for row in cells:
            out("  ".join(f"{c.replace(' ', '_')}={_quoted(v)}" for c, v in zip(columns, row, strict=True)))
        return
    # the first column names the row (a topic, a key): it keeps its whole
    # width up to half the screen, and the other columns wrap first
    first = max([len(columns[0])] + [len(r[0]) for r in cells]) if columns else 0
    t = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    for i, c in enumerate(columns):
        t.add_column(c, overflow="fold", justify="right" if c in aligned else "left",
                     min_width=min(first, width() // 2) if i == 0 else None)
    for row in cells:
        t.add_row(*row)
    _console(sys.stdout).print(t)


def _quoted(value: str) -> str:
    return json.dumps(value, ensure_ascii=False) if (not value or any(ch.isspace() or ch in "\"=" for ch in value)) \
        else value


def error(message: str) -> None:
    """``tiered: message`` on stderr, unwrapped."""
    print(f"tiered: {message}", file=sys.stderr, flush=True)


def warn(message: str) -> None:
    print(f"tiered: warning: {message}", file=sys.stderr, flush=True)


def note(message: str) -> None:
    """A human summary line (stderr, so stdout stays data)."""
    print(message, file=sys.stderr, flush=True)


class _Rate(ProgressColumn):
    """Items per second for a counted (non-byte) task."""

    def __init__(self, unit: str) -> None:
        super().__init__()
        self.unit = unit

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text("?" if speed is None else f"{speed:,.0f} {self.unit}/s", style="progress.data.speed")


class Bar:
    """What a command drives: ``advance(n)`` and ``set_total(n)``; a no-op off a terminal."""

    def __init__(self, progress: Progress | None, task: Any) -> None:
        self._progress = progress
        self._task = task

    def advance(self, n: int | float = 1) -> None:
        if self._progress is not None:
            self._progress.advance(self._task, n)

    def set_total(self, total: int | float | None) -> None:
        if self._progress is not None:
            self._progress.update(self._task, total=total or None)

    def set_completed(self, done: int | float) -> None:
        """For work that reports where it is rather than what it just did."""
        if self._progress is not None:
            self._progress.update(self._task, completed=done)

    @property
    def enabled(self) -> bool:
        return self._progress is not None


def progress_enabled() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


@contextmanager
def progress(label: str, *, total: int | float | None = None, unit: str = "bytes",
             get_time: Callable[[], float] | None = None) -> Iterator[Bar]:
    """A progress bar with rate and ETA on a terminal (stderr); quiet otherwise.
    ``get_time``: the clock the rate and ETA are measured with (tests)."""
    if not progress_enabled():
        yield Bar(None, None)
        return
    columns: list[ProgressColumn | str]
    if unit == "bytes":
        columns = [TextColumn(label), BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn()]
    else:
        columns = [TextColumn(label), BarColumn(), MofNCompleteColumn(), TaskProgressColumn(), _Rate(unit),
                   TimeRemainingColumn()]
    with Progress(*columns, console=_console(sys.stderr), transient=True, get_time=get_time) as p:
        yield Bar(p, p.add_task(label, total=total or None))
