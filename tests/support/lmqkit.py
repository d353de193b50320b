"""The LMQ queues of the RocketMQ 5.3.3 fixture (``rmq5_store``), for the LMQ tests."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from tiered.cli import app

# %LMQ% queue -> entries, as the fixture's description and expected.jsonl say
LMQ_COUNTS = {"%LMQ%room-red": 17, "%LMQ%room-blue": 15, "%LMQ%room-green": 17}


def unconfirmed(store: Path) -> Path:
    """``store`` with checkpoint's confirmPhyOffset zeroed. The fixture's holds
    the stale value a default-mode broker never honours (issue 30, item 1,
    handled elsewhere); zero means "no bound" to LocalStore, so these tests
    see the whole store, LMQ entries of the third run included."""
    with open(store / "checkpoint", "r+b") as fh:
        fh.seek(32)
        fh.write(bytes(8))
    return store


def lmq_lines(expected: list[dict[str, Any]], topic: str) -> list[dict[str, Any]]:
    """RocketMQ's read-back of one LMQ queue, in offset order."""
    lines = sorted((e for e in expected if e["cq_type"] == "lmq" and e["cq_topic"] == topic),
                   key=lambda e: e["cq_offset"])
    assert [e["cq_offset"] for e in lines] == list(range(LMQ_COUNTS[topic]))
    return lines


def point_entry(store: Path, topic: str, offset: int, physical: int) -> Path:
    """Make entry ``offset`` of ``topic``/0 point at CommitLog offset ``physical``;
    the ConsumeQueue file changed."""
    path = store / "consumequeue" / topic / "0" / f"{0:020d}"
    with open(path, "r+b") as fh:
        fh.seek(offset * 20)
        fh.write(struct.pack(">q", physical))
    return path


def cli_env(tmp_path: Path, cold_url: str = "", moto_endpoint: str | None = None) -> dict[str, str]:
    env = {"TIERED_STATE_DIR": str(tmp_path / "state"), "TIERED_CLUSTER": "C", "TIERED_BROKER": "b",
           "TIERED_LOG__LEVEL": "WARNING"}
    if cold_url.startswith("s3://") and moto_endpoint:
        env["TIERED_S3__ENDPOINT_URL"] = moto_endpoint
    return env


def invoke(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of one ``tiered`` command."""
    result = CliRunner().invoke(app, list(args), env=env)
    return result.exit_code, result.stdout, result.stderr
