"""Fencing cannot be switched off by accident: lease settings are validated,
an unreadable lease needs force_takeover, and a process never takes the
lease of a live process with the same identity (real processes, real /proc)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tiered.cli import app
from tiered.archive.lease import LeaseManager, Process, _start_ticks
from tiered.archive.storage import FileStore


def invoke(env: dict[str, str], *args: str):  # noqa: ANN201
    return CliRunner().invoke(app, list(args), env=env)


@pytest.fixture
def setup(tmp_path: Path, store_writer) -> tuple[dict[str, str], Path, str]:  # noqa: ANN001
    store = tmp_path / "store"
    with store_writer() as w:
        for i in range(3):
            w.put("T", 0, b"x" * 50, store_timestamp=time.time_ns() // 1_000_000 - 100_000 + i)
    env = {"TIERED_STATE_DIR": str(tmp_path / "state"), "TIERED_CLUSTER": "C", "TIERED_BROKER": "b",
           "TIERED_LOG__LEVEL": "WARNING"}
    return env, store, f"file://{tmp_path / 'cold'}"


@pytest.mark.parametrize(("ttl", "interval", "message"), [
    ("0.0001", "20s", "lease_ttl: 0.0001 s is too short; it must be at least 60 s"),
    ("30s", "20s", "lease_ttl: 30 s is too short; it must be at least 60 s"),
    ("5s", "1s", "lease_ttl: 5 s is too short; it must be at least 10 s"),
])
def test_lease_settings_that_would_disable_fencing_are_refused(setup, ttl: str, interval: str, message: str) -> None:  # noqa: ANN001
    env, store, cold = setup
    res = invoke({**env, "TIERED_LEASE_TTL": ttl, "TIERED_DISPATCH__INTERVAL": interval},
                 "dispatch", "--once", "--store", str(store), "--cold", cold)
    assert res.exit_code == 2 and f"invalid configuration: {message}" in res.output, res.output


def test_an_unreadable_lease_is_taken_over_only_when_forced(setup, tmp_path: Path) -> None:  # noqa: ANN001
    env, store, cold = setup
    lease = tmp_path / "cold" / "C" / "b" / "_lease.json"
    lease.parent.mkdir(parents=True)
    lease.write_bytes(b"\x00garbage")
    res = invoke(env, "dispatch", "--once", "--all", "--store", str(store), "--cold", cold)
    assert res.exit_code == 1 and "held by '<unreadable lease object>' for good (unreadable)" in res.output
    assert lease.read_bytes() == b"\x00garbage"
    res = invoke({**env, "TIERED_FORCE_TAKEOVER": "true"}, "dispatch", "--once", "--all", "--store", str(store),
                 "--cold", cold)
    assert res.exit_code == 0, res.output
    assert json.loads(lease.read_bytes())["epoch"] == 1


def _hold(cold_root: Path, identity: str, process: Process) -> None:
    """Write the lease as a writer ``process`` with ``identity`` would have."""
    m = LeaseManager(FileStore(str(cold_root)), "C/b", identity, ttl_s=120)
    m.process = process
    m.acquire()


def test_a_hand_run_never_takes_the_lease_of_a_live_process_with_the_same_identity(setup, tmp_path: Path) -> None:  # noqa: ANN001
    env, store, cold = setup
    env = {**env, "TIERED_INSTANCE_ID": "sidecar-a"}
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.05)
        _hold(tmp_path / "cold", "sidecar-a", Process(host=Process.this().host, pid=live.pid,
                                                      boot=Process.this().boot, start=_start_ticks(live.pid)))
        res = invoke(env, "dispatch", "--once", "--all", "--store", str(store), "--cold", cold)
        assert res.exit_code == 1, res.output
        assert f"held by 'sidecar-a' ({Process.this().host} pid {live.pid}) until" in res.output
        res = invoke(env, "clean", "--once", "--cold", cold)
        assert res.exit_code == 1 and f"pid {live.pid}" in res.output
    finally:
        live.kill()
        live.wait()
    # the same process gone (a crash): its restart takes over at once
    res = invoke(env, "dispatch", "--once", "--all", "--store", str(store), "--cold", cold)
    assert res.exit_code == 0, res.output
