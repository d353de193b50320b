"""Crash safety: a dispatcher process is killed with SIGKILL at random
moments (seeded), more messages arrive, it is restarted; over and over.
The final archive is exact, and the objects a crash left behind are
reported by the verifier as orphans, not as failures."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dispatchkit import BROKER, CLUSTER, assert_exact, new_writer, produce
from tiered.cli import app
from tiered.archive.coldtier import ColdTier
from tiered.store.localstore import LocalStore
from tiered.ops.verify import verify

DRIVER = Path(__file__).resolve().parents[1] / "support" / "crash_driver.py"
QUEUES = [("Crash", 0), ("Crash", 1), ("%DLQ%crash", 0), ("Other", 3)]
KILLS = 22


def _start(store_dir: Path, cold_url: str, state: Path, endpoint: str | None, **env: str) -> subprocess.Popen:
    args = [sys.executable, str(DRIVER), str(store_dir), cold_url, str(state)] + ([endpoint] if endpoint else [])
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, **env})


def _wait_ready(proc: subprocess.Popen) -> None:
    line = proc.stdout.readline()
    assert line.strip() == "ready", f"driver did not start: {line!r} (exit {proc.poll()})"


@pytest.mark.slow
@pytest.mark.parametrize("layout", [1, 2])
@pytest.mark.parametrize("backend", ["file", pytest.param("s3", marks=pytest.mark.s3)])
def test_sigkill_at_random_moments_loses_and_duplicates_nothing(backend, layout, tmp_path, request):
    endpoint = None
    if backend == "s3":
        endpoint = request.getfixturevalue("moto_endpoint")
        cold_url = request.getfixturevalue("s3_url")
    else:
        cold_url = f"file://{tmp_path / 'cold'}"
    store_dir, state = tmp_path / "store", tmp_path / "state"
    rng = random.Random(20240601 if backend == "file" else 7)
    w = new_writer(store_dir)
    for q in QUEUES:
        produce(w, *q, 3, seed=0)

    # First, a deterministic orphan: killed after a (short) segment's data
    # objects were written, before its manifest commit; more data then makes
    # the next attempt's segment longer, under another name, so those
    # objects stay unreferenced.
    proc = _start(store_dir, cold_url, state, endpoint, CRASH_AFTER_DATA="1", CRASH_LAYOUT=str(layout))
    assert proc.wait(timeout=60) == -signal.SIGKILL
    for q in QUEUES:
        produce(w, *q, 40, seed=1)

    kills = mid_work = 0
    for i in range(KILLS):
        proc = _start(store_dir, cold_url, state, endpoint, CRASH_LAYOUT=str(layout))
        _wait_ready(proc)
        time.sleep(rng.uniform(0.0, 0.1))  # a random moment: start-up, lease, upload or commit
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
        kills += 1
        lines = proc.stdout.read().splitlines()
        # killed while still working: before its first round ended, or before
        # a round that found nothing new
        if not any(" segments 0 " in line for line in lines):
            mid_work += 1
        for q in rng.sample(QUEUES, 3):
            produce(w, *q, rng.randint(20, 80), seed=100 + i)
    w.close()
    assert kills >= 20
    assert mid_work >= kills // 2, f"only {mid_work} of {kills} kills landed while work was pending"

    # A last, complete round from the command line, then verify.
    env = {"TIERED_STATE_DIR": str(state), "TIERED_CLUSTER": CLUSTER, "TIERED_BROKER": BROKER,
           "TIERED_INSTANCE_ID": "crash-driver", "TIERED_LOG__LEVEL": "WARNING"}
    if endpoint:
        env["TIERED_S3__ENDPOINT_URL"] = endpoint
    runner = CliRunner()
    res = runner.invoke(app, ["dispatch", "--store", str(store_dir), "--cold", cold_url, "--once", "--all"], env=env)
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["verify", "--store", str(store_dir), "--cold", cold_url], env=env)
    assert res.exit_code == 0, res.stdout
    # The upload killed before its first commit is either an orphan (the
    # queue moved on) or was adopted by the manifest rebuild: exact either way.
    assert res.stdout.rstrip().endswith("OK")

    from tiered.archive.storage import RetryPolicy, S3Options, open_store

    store = open_store(cold_url, s3=S3Options(endpoint_url=endpoint), retry=RetryPolicy(attempts=3))
    local = LocalStore(store_dir)
    assert_exact(store, local, QUEUES)
    report = verify(ColdTier(store, CLUSTER, BROKER), local)
    assert report.ok, report.problems
    assert all(any(p in k for p in ("/commitlog/", "/consumequeue/", "/index/", "/segment/", "/manifest/chunk-"))
               for k in report.orphans), report.orphans
    assert not report.unarchived
