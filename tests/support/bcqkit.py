"""Helpers of the BatchCQ tests: the real 5.3.3 store's batch queues and
RocketMQ's read-back of them, and the CLI run against them."""

from __future__ import annotations

import struct
from collections import defaultdict
from pathlib import Path

from typer.testing import CliRunner

from tiered.cli import app

TOPIC = "BulkEvents"
runner = CliRunner()


def unconfirmed(store: Path) -> Path:
    """The store with checkpoint's confirm offset zeroed: in default mode the
    broker does not honour it (issue 30 item 1), and its stale value would
    hold back the last entries these tests read."""
    with open(store / "checkpoint", "r+b") as fh:
        fh.seek(32)
        fh.write(struct.pack(">q", 0))
    return store


def batch_lines(expected: list[dict]) -> list[dict]:
    lines = [e for e in expected if e["cq_type"] == "batch"]
    assert len(lines) == 26 and sum(e["cq_batch_num"] for e in lines) == 111
    return lines


def messages_by_queue(expected: list[dict]) -> dict[int, list[dict]]:
    """RocketMQ's read-back per queue, one dict per message (singles as themselves)."""
    out: dict[int, list[dict]] = defaultdict(list)
    for e in batch_lines(expected):
        for m in e.get("inner_messages") or [{"queue_offset": e["queue_offset"], "flag": e["flag"],
                                               "msg_id": e["unique_key"], "properties": e["properties"],
                                               "body_b64": e["body_b64"]}]:
            out[e["cq_queue_id"]].append({**m, "commitlog_offset": e["commitlog_offset"],
                                          "store_timestamp": e["store_timestamp"], "born_host": e["born_host"]})
    return out


def env(tmp_path: Path) -> dict[str, str]:
    return {"TIERED_STATE_DIR": str(tmp_path / "state"), "TIERED_CLUSTER": "DevCluster",
            "TIERED_BROKER": "broker-dev", "TIERED_LOG__LEVEL": "WARNING"}


def run(tmp_path: Path, *args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args), env=env(tmp_path))
    return result.exit_code, result.stdout, result.stderr
