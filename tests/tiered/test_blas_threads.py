"""numpy's OpenBLAS threads are not started by tiered (tiered/__init__.py):
they spin after a call and cost a dispatch round CPU for no work."""

from __future__ import annotations

import os
import subprocess
import sys

PROBE = ("import tiered.dispatcher, numpy, os; "
         "print(os.environ['OPENBLAS_NUM_THREADS'], len(os.listdir('/proc/self/task')))")


def run(env: dict[str, str]) -> list[str]:
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_importing_tiered_before_numpy_starts_no_blas_threads() -> None:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    assert run(env) == ["1", "1"]  # one thread: the interpreter's own


def test_an_operators_own_setting_is_kept() -> None:
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "2"}
    assert run(env)[0] == "2"
