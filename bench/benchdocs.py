"""Bench figures into docs/performance.md, written by the benches themselves.

A bench run with ``--write-docs`` replaces its own section of the page, the
text between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->``, with what
it printed, headed by the command, the core count, the date and the commit:
figures are never copied by hand, and the prose around the markers (what
the figures mean, the goals) stays as written.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "performance.md"
OPTION = "--write-docs"


def markers(name: str) -> tuple[str, str]:
    return f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"


def replace_section(text: str, name: str, body: str) -> str:
    """``text`` with the section ``name`` holding ``body`` (and nothing else);
    ValueError naming the section when its markers are missing, repeated or
    out of order, so a bench never writes its figures somewhere unseen."""
    begin, end = markers(name)
    if text.count(begin) != 1 or text.count(end) != 1:
        raise ValueError(f"section {name!r} needs exactly one {begin} and one {end}")
    start, stop = text.index(begin) + len(begin), text.index(end)
    if stop < start:
        raise ValueError(f"section {name!r}: {end} comes before {begin}")
    return f"{text[:start]}\n{body.strip(chr(10))}\n{text[stop:]}"


def write_section(path: Path, name: str, body: str) -> None:
    """Rewrites section ``name`` of ``path`` in place (through a temporary file
    beside it: a bench stopped half-way leaves the page as it was)."""
    text = replace_section(path.read_text(encoding="utf-8"), name, body)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def command_line(argv: list[str]) -> str:
    """The command that ran the bench, without the option that wrote the page."""
    kept, skip = [], False
    for arg in argv[1:]:
        if skip:
            skip = False
            if not arg.startswith("-"):
                continue
        if arg == OPTION:
            skip = True
            continue
        if not arg.startswith(OPTION + "="):
            kept.append(arg)
    script = Path(argv[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    return shlex.join(["python", str(shown), *kept])


def revision() -> str | None:
    """The commit measured, marked when the tree had changes beside it (the
    page the benches write is not one: it changes with every run)."""
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no", "--",
                                ".", f":(exclude){DOC.relative_to(ROOT).as_posix()}"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return f"{head} with uncommitted changes" if head and dirty else head or None


def section_body(output: str, *, command: str, cores: int | None, day: datetime.date, commit: str | None,
                 tables: list[str] | None = None) -> str:
    """A section's text: who wrote it, how, where and when, then the bench's
    output as printed, then any Markdown tables it made."""
    at = f", commit {commit}" if commit else ""
    head = (f"Written by `{command}` on {day.isoformat()}, {cores or '?'} cores{at} (a shared or small "
            "machine's figures are indicative):")
    parts = [head, "```text\n" + output.strip("\n") + "\n```", *(tables or [])]
    return "\n\n".join(parts)


def add_option(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(OPTION, nargs="?", const=str(DOC), default=None, metavar="FILE",
                    help=f"also write the figures into their section of FILE (default {DOC.relative_to(ROOT)})")


class _Tee(io.TextIOBase):
    def __init__(self, *streams: TextIO) -> None:
        self.streams = streams

    def write(self, s: str) -> int:
        for stream in self.streams:
            stream.write(s)
        return len(s)

    def flush(self) -> None:
        for stream in self.streams:
            stream.flush()


@dataclass
class Recording:
    """What a bench adds to its section beside its printed output."""

    tables: list[str] = field(default_factory=list)


@contextlib.contextmanager
def recorded(args: argparse.Namespace, name: str) -> Iterator[Recording]:
    """Everything printed inside, also written as section ``name`` when the
    bench was given ``--write-docs`` (and nothing, should the bench fail)."""
    rec = Recording()
    path = getattr(args, "write_docs", None)
    if not path:
        yield rec
        return
    buf = io.StringIO()
    with contextlib.redirect_stdout(_Tee(sys.stdout, buf)):
        yield rec
    body = section_body(buf.getvalue(), command=command_line(sys.argv), cores=os.cpu_count(),
                        day=datetime.datetime.now(datetime.timezone.utc).date(), commit=revision(), tables=rec.tables)
    write_section(Path(path), name, body)
    print(f"figures written to section {name!r} of {path}")
