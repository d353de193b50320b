"""dispatch --topic against a known store; the retry attempts each cold tier gets."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from tiered.cli import app
from tiered.cli.wiring import object_store
from tiered.config import load_settings


def test_dispatch_topic_archives_only_that_topic(tmp_path: Path, store_writer) -> None:  # noqa: ANN001
    store = tmp_path / "store"
    with store_writer() as w:
        for i in range(30):
            w.put("Orders", i % 3, b"o%d" % i)
            w.put("Audit", 0, b"a%d" % i)
            w.put("%RETRY%billing", 0, b"r%d" % i)
    cold = f"file://{tmp_path}/cold"
    env = {"TIERED_STATE_DIR": str(tmp_path / "state"), "TIERED_CLUSTER": "C", "TIERED_BROKER": "b",
           "TIERED_LOG__LEVEL": "WARNING"}
    runner = CliRunner()
    # no --once: one round is the command's only mode; system topics by name, not by pattern
    result = runner.invoke(app, ["dispatch", "--all", "--store", str(store), "--cold", cold, "--topic", "Ord*",
                                 "--topic", "%RETRY%billing"], env=env)
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines()[-1].startswith("archived 60 messages")
    result = runner.invoke(app, ["ls", "--cold", cold, "--json"], env=env)
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert sorted((r["topic"], r["queue_id"], r["next_offset"]) for r in rows) == [
        ("%RETRY%billing", 0, 30), ("Orders", 0, 10), ("Orders", 1, 10), ("Orders", 2, 10)]
    result = runner.invoke(app, ["find", "--cold", cold, "--key", "nothing", "--topic", "Audit"], env=env)
    assert result.exit_code == 1


def test_request_attempts_per_cold_tier() -> None:
    s3 = load_settings(None, cold_url="s3://bucket-a/p", **{"s3.max_attempts": 3, "dispatch.retry.attempts": 9})
    assert object_store(s3).retry.attempts == 3
    local = load_settings(None, cold_url="file:///tmp/x", **{"s3.max_attempts": 3, "dispatch.retry.attempts": 9})
    assert object_store(local).retry.attempts == 9
