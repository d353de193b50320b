"""``tiered status`` and ``tiered dispatch --once`` answer for what the
dispatcher is responsible for: excluded topics get no lag row but a line
saying why, and pending data is counted whether or not anything was archived."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from typer.testing import CliRunner

from tiered.cli import app
from tiered.store.storewriter import StoreWriter


def invoke(env: dict[str, str], *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args), env=env)
    if "--json" in args:
        return result.exit_code, result.stdout
    return result.exit_code, " ".join(result.output.split())  # the console wraps long lines


def make_store(store_writer: Callable[..., StoreWriter]) -> Path:
    now = time.time_ns() // 1_000_000
    with store_writer() as w:
        for i in range(12):
            w.put("Orders", i % 2, b"o" * 50, keys=[f"k{i}"], store_timestamp=now - 5000 + i)
        for i in range(5):
            w.put("Orders", 0, b"d" * 50, delay_level=3, store_timestamp=now - 5000 + i)  # SCHEDULE_TOPIC_XXXX
    return w.root


def test_excluded_topics_get_no_lag_row_and_pending_is_counted(tmp_path: Path, store_writer) -> None:  # noqa: ANN001
    store, cold = make_store(store_writer), f"file://{tmp_path / 'cold'}"
    assert (store / "consumequeue" / "SCHEDULE_TOPIC_XXXX").is_dir()
    env = {"TIERED_STATE_DIR": str(tmp_path / "state"), "TIERED_CLUSTER": "C", "TIERED_BROKER": "b",
           "TIERED_LOG__LEVEL": "WARNING", "TIERED_DISPATCH__MAX_DELAY": "1h"}

    # below its thresholds nothing is archived, and the output says what waits
    code, out = invoke(env, "dispatch", "--once", "--store", str(store), "--cold", cold)
    assert code == 0, out
    assert "archived 0 messages (0 bytes) in 0 segments over 2 queues; gaps 0; still pending 12" in out

    code, out = invoke(env, "status", "--json", "--store", str(store), "--cold", cold)
    assert code == 0, out
    rows = [json.loads(line) for line in out.splitlines()]
    assert [(r["topic"], r["queue_id"], r["lag_messages"]) for r in rows if "kind" not in r] == [
        ("Orders", 0, 6), ("Orders", 1, 6)]
    assert [(r["kind"], r["topic"], r["archived"]) for r in rows if "kind" in r] == [
        ("topic", "SCHEDULE_TOPIC_XXXX", False)]

    code, out = invoke(env, "dispatch", "--once", "--all", "--store", str(store), "--cold", cold)
    assert code == 0, out
    assert "archived 12 messages" in out and "nothing pending" in out
    code, out = invoke(env, "status", "--store", str(store), "--cold", cold)
    assert code == 0, out
    assert "EXCLUDED SCHEDULE_TOPIC_XXXX: delay-level messages waiting for their time" in out and "Orders" in out
    assert out.count("SCHEDULE_TOPIC_XXXX") == 1  # that line only, no lag row

    # asked for explicitly, the delay topic is the dispatcher's, and status shows its lag
    env["TIERED_TOPICS__INCLUDE"] = '["*", "SCHEDULE_TOPIC_XXXX"]'
    code, out = invoke(env, "status", "--json", "--store", str(store), "--cold", cold)
    assert code == 0, out
    rows = {(r["topic"], r["queue_id"]): r["lag_messages"] for r in map(json.loads, out.splitlines())
            if "kind" not in r}
    assert rows == {("Orders", 0): 0, ("Orders", 1): 0, ("SCHEDULE_TOPIC_XXXX", 2): 5}
