"""The C library calls a subprocess makes on files under a root, watched and
failed by a preloaded shim (oscalls_shim.c): what patches of ``os.*`` cannot
see, the compiled write of tiered/archive/_filewrite.c."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

SOURCE = Path(__file__).with_name("oscalls_shim.c")

# the snippet's helpers: the shim's two entry points, and page-aligned buffers
PRELUDE = """
import ctypes, mmap, os, random, sys
_shim = ctypes.CDLL(None)
def arm(spec): _shim.shim_arm(spec.encode())
def mark(text): _shim.shim_mark(text.encode())
def aligned(data):
    m = mmap.mmap(-1, max(len(data), 1)); m[:len(data)] = data
    return memoryview(m)[:len(data)]
def payload(n, seed=0): return random.Random(seed).randbytes(n)
"""


def build(out: Path) -> Path:
    """The shim compiled into ``out`` (the README's test command installs the compiler)."""
    lib = out / "oscalls_shim.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", str(lib), str(SOURCE), "-ldl"], check=True)
    return lib


@dataclass(frozen=True, kw_only=True)
class Traced:
    returncode: int
    stdout: str
    stderr: str
    lines: list[str]  # the shim's log, temp files' names without their pid and thread

    def after(self, text: str) -> list[str]:
        """The calls after ``mark(text)``, up to the next mark."""
        i = self.lines.index(f"mark {text}")
        rest = self.lines[i + 1:]
        return rest[:next((j for j, line in enumerate(rest) if line.startswith("mark ")), len(rest))]


_TMP = re.compile(r"\.(\d+)\.(\d+)\.tmp\b")


def run(lib: Path, root: Path, code: str, log: Path, *args: str) -> Traced:
    """``PRELUDE + code`` in a subprocess with the shim preloaded, watching
    ``root``; the log goes to ``log`` (outside ``root``)."""
    env = dict(os.environ, LD_PRELOAD=str(lib), SHIM_ROOT=str(root), SHIM_LOG=str(log))
    done = subprocess.run([sys.executable, "-c", PRELUDE + code, *args], env=env, capture_output=True, text=True,
                          timeout=120)
    text = log.read_text() if log.exists() else ""
    return Traced(returncode=done.returncode, stdout=done.stdout, stderr=done.stderr,
                  lines=[_TMP.sub(".tmp", line) for line in text.splitlines()])
