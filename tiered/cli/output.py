"""The CLI's one output layer: tables, JSON, progress and errors.

Every command prints through these functions so that all of them behave
alike:

- **Tables** (:func:`table`): one renderer for every command, as ``kubectl``
  and ``docker ps`` print: upper-case headers, columns two spaces apart,
  cells never cut. On a terminal the table fits its width (free text wraps
  within its column; a name too long for its column gets a line of its
  own); off a terminal the same table, each row on one line. Wide-only
  columns (``--wide``) and human units (:func:`human_bytes`,
  :func:`human_duration`) for people; ``--json`` keeps exact values.
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
from dataclasses import dataclass, replace
from typing import Any, TextIO

from rich.console import Console
from rich.progress import (BarColumn, DownloadColumn, MofNCompleteColumn, Progress, ProgressColumn, Task,
                           TaskProgressColumn, TextColumn, TimeRemainingColumn, TransferSpeedColumn)
from rich.cells import cell_len
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


@dataclass(frozen=True, kw_only=True)
class Col:
    """A table column. ``wrap``: free text (a problem, a value) that wraps
    between words, and folds a word longer than the column, when the table
    must shrink. ``keep``: a name (a topic, a group), never wrapped nor cut:
    a cell longer than the column gets a line of its own; the first column
    is always kept so. The others wrap only between words. ``wide``: only
    in the wide table (``--wide``). ``literal``: the header as named (a
    query's column names are data), not in capitals."""

    name: str
    right: bool = False
    wrap: bool = False
    keep: bool = False
    wide: bool = False
    literal: bool = False


def table_width(stream: TextIO | None = None) -> int | None:
    """The width a table must fit: the terminal's; None (no limit) off a
    terminal, so that piped rows stay one line each, whole and greppable."""
    stream = stream or sys.stdout
    try:
        if stream.isatty():
            return shutil.get_terminal_size((NOT_A_TTY_WIDTH, 24)).columns
    except (AttributeError, ValueError):
        pass
    return None


def paragraph(text: str) -> None:
    """A line of free text that fits the terminal as a table's free text
    does (broken between words, later lines indented); whole off a terminal."""
    width = table_width()
    lines = [text] if width is None else _wrap(text, width - 2, fold=True)
    for i, line in enumerate(lines):
        out(line if i == 0 else "  " + line)


def table(columns: Sequence[str | Col], rows: Iterable[Sequence[Any]], *, as_json: bool = False,
          right: Iterable[str] = (), wide: bool = False, header: bool = True) -> None:
    """Rows as a table that fits the terminal (:func:`render_table`), or as
    JSON lines keyed by column name (``as_json``, every column)."""
    cols = [c if isinstance(c, Col) else Col(name=c) for c in columns]
    if as_json:
        json_lines({c.name.replace(" ", "_"): v for c, v in zip(cols, row, strict=True)} for row in rows)
        return
    aligned = set(right)
    cols = [replace(c, right=True) if c.name in aligned else c for c in cols]
    for line in render_table(cols, rows, width=table_width(), wide=wide, header=header):
        out(line)


_GAP = 2  # spaces between columns


def render_table(columns: Sequence[Col], rows: Iterable[Sequence[Any]], *, width: int | None,
                 wide: bool = False, header: bool = True) -> list[str]:
    """The lines of a table: upper-case headers, columns two spaces apart,
    every cell whole. ``width`` None: each row on one line at its natural
    width. Otherwise the table shrinks to ``width`` (:func:`_widths`): free
    text wraps first, then a name longer than its column moves onto a line
    of its own (the row's other cells on the next), then the other columns
    wrap between words."""
    keep = [i for i, c in enumerate(columns) if wide or not c.wide]
    cols = [columns[i] for i in keep]
    cells = [[_cell_text(row[i]) for i in keep] for row in rows]
    heads = [(c.name if c.literal else c.name.upper()) if header else "" for c in cols]

    def lay_out(widths: list[int]) -> list[str]:
        lines = _render_row(cols, heads, widths) if header else []
        for row in cells:
            lines += _render_row(cols, row, widths)
        return lines

    # hanging the longer names or wrapping the other columns: whichever takes fewer lines
    return min((lay_out(_widths(cols, heads, cells, width, names_first=first)) for first in (True, False)), key=len)


def _cell_text(value: Any) -> str:
    return "-" if value is None or value == "" else " ".join(str(value).split("\n"))


def _words(text: str) -> list[str]:
    return text.split() or [""]


def _widths(cols: Sequence[Col], heads: Sequence[str], cells: Sequence[Sequence[str]],
            width: int | None, *, names_first: bool = True) -> list[int]:
    """Column widths: the natural ones when they fit ``width`` (or it is
    None); else the columns give way in this order, each only while the
    table is too wide: the name columns to their longest name up to 2/5 of
    the width (longer ones hang), free text down to 12, the name columns
    down to 16 and the other columns to their longest word (rightmost
    first; right-aligned cells, numbers, stay whole), in this order or the
    other (``names_first``), free text to its header's longest word, the
    name columns to their headers. What is left over then goes back to the
    names, then to free text."""
    natural = [max([cell_len(h)] + [cell_len(r[i]) for r in cells]) for i, h in enumerate(heads)]
    if width is None or not cols:
        return natural
    widths = list(natural)
    room = width - _GAP * (len(cols) - 1)
    names = [i for i in reversed(range(len(cols))) if i == 0 or cols[i].keep]
    free = [i for i in reversed(range(len(cols))) if cols[i].wrap and i not in names]
    others = [i for i in reversed(range(len(cols))) if i not in names and i not in free]

    def shrink(i: int, floor: int) -> None:
        excess = sum(widths) - room
        if excess > 0 and widths[i] > floor:
            widths[i] = max(floor, widths[i] - excess)

    def longest(texts: Iterable[str], *, words: bool = True, at_most: int | None = None) -> int:
        sizes = [cell_len(w) for t in texts for w in (_words(t) if words else [t])]
        return max([1] + [n for n in sizes if at_most is None or n <= at_most])

    cap = max(16, width * 2 // 5)
    for i in names:  # a partly narrowed name column fits no more names: straight to the floor
        if sum(widths) > room:
            widths[i] = min(widths[i], max(cell_len(heads[i]), longest((r[i] for r in cells), words=False,
                                                                        at_most=cap)))
    for i in free:
        shrink(i, min(natural[i], max(12, longest([heads[i]]))))
    steps = [(i, max(cell_len(heads[i]), min(natural[i], 16))) for i in names]
    steps += [(i, max([longest([heads[i]])] + [cell_len(r[i]) for r in cells]) if cols[i].right
               else longest([heads[i], *(r[i] for r in cells)])) for i in others]
    for i, floor in steps if names_first else steps[len(names):] + steps[:len(names)]:
        shrink(i, floor)
    for i in free:
        shrink(i, longest([heads[i]]))
    for i in names:
        shrink(i, cell_len(heads[i]))
    for i in reversed(names):
        spare = room - sum(widths)
        widths[i] = max(widths[i], longest((r[i] for r in cells), words=False, at_most=widths[i] + spare))
    for i in reversed(free):
        widths[i] = min(natural[i], widths[i] + max(0, room - sum(widths)))
    return widths


def _wrap(text: str, width: int, *, fold: bool) -> list[str]:
    """``text`` in lines of at most ``width`` cells, broken between words;
    a longer word is cut into pieces only when ``fold``."""
    lines: list[str] = []
    line = ""
    for word in _words(text):
        while fold and cell_len(word) > width:
            if line:
                lines.append(line)
                line = ""
            cut = width
            while cell_len(word[:cut]) > width:
                cut -= 1
            lines.append(word[:max(1, cut)])
            word = word[max(1, cut):]
        if line and cell_len(line) + 1 + cell_len(word) <= width:
            line += " " + word
        else:
            if line:
                lines.append(line)
            line = word
    lines.append(line)
    return lines


def _render_row(cols: Sequence[Col], cells: Sequence[str], widths: Sequence[int]) -> list[str]:
    """One row's lines: a name longer than its column first, alone on a
    line (at its column, or at the left edge when it does not fit there),
    then the other cells, wrapped within their columns."""
    total = sum(widths) + _GAP * (len(widths) - 1)
    lines = []
    parts = []
    for i, (c, text) in enumerate(zip(cols, cells, strict=True)):
        if (i == 0 or c.keep) and cell_len(text) > widths[i]:
            at = sum(widths[:i]) + _GAP * i
            lines.append((" " * at if at + cell_len(text) <= total else "") + text)
            parts.append([""])
        else:
            parts.append(_wrap(text, widths[i], fold=not (i == 0 or c.keep)))
    for k in range(max(map(len, parts))):
        row = []
        for i, c in enumerate(cols):
            text = parts[i][k] if k < len(parts[i]) else ""
            pad = " " * max(0, widths[i] - cell_len(text))
            row.append(pad + text if c.right else text + pad)
        lines.append((" " * _GAP).join(row).rstrip())
    return lines


_BYTE_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def human_bytes(n: int | None) -> str:
    """``512 B``, ``1.2 MiB``: binary units, one decimal; ``-`` for unknown."""
    if n is None:
        return "-"
    if abs(n) < 1024:
        return f"{n} B"
    value = float(n)
    for unit in _BYTE_UNITS:
        value /= 1024
        if abs(round(value, 1)) < 1024 or unit == _BYTE_UNITS[-1]:
            return f"{value:.1f} {unit}"
    raise AssertionError("unreachable")


def human_duration(ms: int | None) -> str:
    """A duration the way people read it: ``850ms``, ``42s``, ``3m12s``,
    ``5h02m``, ``3d04h``, ``412d``; truncated, never rounded up (a lag of
    59.9 s is ``59s``); negative (a clock ahead of ours) with a minus sign;
    ``-`` for unknown."""
    if ms is None:
        return "-"
    if ms < 0:
        return "-" + human_duration(-ms)
    if ms < 1000:
        return f"{ms}ms"
    s = ms // 1000
    if s < 60:
        return f"{s}s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d{h:02d}h" if d < 100 else f"{d}d"


def age(now_ms: int, then_ms: int | None) -> str:
    """How long ago ``then_ms`` was, in :func:`human_duration` units."""
    return "-" if then_ms is None else human_duration(now_ms - then_ms)


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
