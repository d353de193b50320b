"""``tiered clean --cold URL [--store DIR] --once [--dry-run]`` end to end, with
real time: the data is stamped in the past instead of moving a clock."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tiered.cli import app
from tiered.archive.storage import S3Options, open_store
from tiered.store.storewriter import StoreWriter

HOUR_MS = 3_600_000


@pytest.fixture
def env(tmp_path: Path, cold_url: str, request: pytest.FixtureRequest) -> dict[str, str]:
    e = {"TIERED_STATE_DIR": str(tmp_path / "state"), "TIERED_CLUSTER": "C", "TIERED_BROKER": "b",
         "TIERED_LOG__LEVEL": "WARNING"}
    if cold_url.startswith("s3://"):
        e["TIERED_S3__ENDPOINT_URL"] = request.getfixturevalue("moto_endpoint")
    return e


def make_store(store_writer: Callable[..., StoreWriter]) -> Path:
    now = time.time_ns() // 1_000_000
    with store_writer() as w:
        for i in range(3):
            w.put("Old", 0, b"old", keys=[f"o{i}"], store_timestamp=now - 100 * HOUR_MS + i)
            w.put("Kept", 0, b"kept", store_timestamp=now - 100 * HOUR_MS + i)
            w.put("New", 0, b"new", store_timestamp=now - 1000 + i)
        w.set_topic_attribute("Kept", "reserve.time", "200")
    return w.root


def invoke(env: dict[str, str], *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args), env=env)
    return result.exit_code, result.stdout if result.exit_code == 0 else result.output


def test_dry_run_then_clean(store_writer, cold_url: str, env: dict[str, str], moto_endpoint: str) -> None:
    store = make_store(store_writer)
    code, out = invoke(env, "dispatch", "--once", "--all", "--store", str(store), "--cold", cold_url)
    assert code == 0, out
    objects = open_store(cold_url, s3=S3Options(endpoint_url=moto_endpoint))
    before = sorted(o.key for o in objects.list_keys("C/b/"))
    assert any("/Old/0/segment/" in k for k in before)

    code, out = invoke(env, "clean", "--cold", cold_url, "--store", str(store), "--once", "--dry-run")
    assert code == 0, out
    assert "would expire Old/0: 1 segments, 3 messages" in out
    assert "retention 72 h (default)" in out
    assert "Kept/0" not in out and "New/0" not in out
    assert sorted(o.key for o in objects.list_keys("C/b/")) == before  # a dry run changes nothing

    code, out = invoke(env, "clean", "--cold", cold_url, "--store", str(store), "--once", "--json")
    assert code == 0, out
    report = json.loads(out)
    assert [(e["topic"], e["segments"], e["messages"]) for e in report["expired"]] == [("Old", 1, 3)]
    assert report["ok"] and report["delete_requests"] >= 1
    after = sorted(o.key for o in objects.list_keys("C/b/"))
    assert not any("/Old/0/segment/" in k for k in after)
    assert "C/b/Old/0/manifest.json" in after  # progress kept
    assert any("/Kept/0/segment/" in k for k in after) and any("/New/0/segment/" in k for k in after)
    # a one-shot run is the last pass of its process: the catalog says what it expired at once
    listed = {(e["topic"], e["queue_id"]): e for e in json.loads(objects.get("C/b/_catalog.json"))["queues"]}
    assert (listed[("Old", 0)]["first_offset"], listed[("Old", 0)]["segments"]) == (3, 0)
    assert listed[("Kept", 0)]["segments"] == 1

    code, out = invoke(env, "clean", "--cold", cold_url, "--store", str(store), "--once")
    assert code == 0 and "expire 0 segments" in out


def test_without_store_uses_the_retention_recorded_by_the_dispatcher(
        store_writer, cold_url: str, env: dict[str, str]) -> None:  # noqa: ANN001
    store = make_store(store_writer)
    assert invoke(env, "dispatch", "--once", "--all", "--store", str(store), "--cold", cold_url)[0] == 0
    # no --store: Kept's reserve.time (200 h) comes from the catalog the dispatcher wrote
    code, out = invoke(env, "clean", "--cold", cold_url, "--once", "--dry-run")
    assert code == 0, out
    assert "would expire Old/0" in out and "retention 72 h (default)" in out
    assert "Kept/0" not in out
    code, out = invoke(env, "clean", "--cold", cold_url, "--once", "--json")
    report = json.loads(out)
    assert [(e["topic"], e["retention_source"]) for e in report["expired"]] == [("Old", "default")]
    assert report["retention_unknown"] == {}
    env = {**env, "TIERED_RETENTION__DEFAULT_HOURS": "500"}
    code, out = invoke(env, "clean", "--cold", cold_url, "--once", "--dry-run")
    assert code == 0 and "would expire 0 segments" in out


def test_without_store_a_topic_of_unknown_retention_is_kept(
        store_writer, cold_url: str, env: dict[str, str], moto_endpoint: str) -> None:  # noqa: ANN001
    store = make_store(store_writer)
    assert invoke(env, "dispatch", "--once", "--all", "--store", str(store), "--cold", cold_url)[0] == 0
    # a catalog from before retention was recorded: nothing says what the broker keeps
    objects = open_store(cold_url, s3=S3Options(endpoint_url=moto_endpoint))
    doc = json.loads(objects.get("C/b/_catalog.json"))
    assert doc["retention"]["Kept"] == {"hours": 200.0, "source": "reserve.time"}
    del doc["retention"]
    objects.put("C/b/_catalog.json", json.dumps(doc).encode())
    code, out = invoke(env, "clean", "--cold", cold_url, "--once")
    assert code == 0, out
    assert "would expire" not in out and "expire 0 segments" in out
    for topic in ("Old", "Kept", "New"):
        assert f"keep {topic}: retention unknown (no broker store given" in out
    assert any("/Old/0/segment/" in o.key for o in objects.list_keys("C/b/"))
    # an operator's explicit setting makes it known
    code, out = invoke({**env, "TIERED_RETENTION__TOPICS": '{"Old": 24}'}, "clean", "--cold", cold_url, "--once")
    assert code == 0 and "expire Old/0" in out and "retention 24 h (config)" in out


def test_once_is_optional(env: dict[str, str], tmp_path: Path) -> None:
    # one pass is the command's only mode ('tiered serve' schedules): --once is accepted, not required
    for extra in ((), ("--once",)):
        code, out = invoke(env, "clean", "--cold", f"file://{tmp_path}/cold", *extra)
        assert code == 0, out
        assert out.splitlines()[-1] == ("expire 0 segments (0 B), merge 0 segments, delete 0 replaced objects "
                                        "and 0 orphans")
