"""``tiered cat`` and ``tiered find`` against an archive, in-process."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from readerkit import T0
from tiered.cli import app


@pytest.fixture
def run(archived, moto_endpoint: str):
    runner = CliRunner()
    env = {"TIERED_S3__ENDPOINT_URL": moto_endpoint}

    def invoke(*args: str):
        result = runner.invoke(app, [*args, "--cold", archived.url], env=env)
        return result

    return invoke


def inspect_json(store_dir, topic: str, queue: int) -> list[dict]:
    result = CliRunner().invoke(app, ["inspect", "--store", str(store_dir), "--topic", topic, "--queue", str(queue),
                                      "--json"])
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_cat_json_prints_what_inspect_prints(run, archived) -> None:
    result = run("cat", "--topic", "%DLQ%billing", "--queue", "0", "--offset", "5", "--count", "12", "--json")
    assert result.exit_code == 0, result.output
    got = [json.loads(line) for line in result.stdout.splitlines()]
    local = inspect_json(archived.local.root, "%DLQ%billing", 0)
    assert got == local[5:17]
    assert set(got[0]) == set(local[0])


def test_cat_to_the_end_and_unknown_queue(run) -> None:
    result = run("cat", "--topic", "Orders", "--queue", "1", "--offset", "100")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 20 and lines[0].startswith("Orders/1@100 ")
    result = run("cat", "--topic", "Orders", "--queue", "9")
    assert result.exit_code == 1 and "not in the archive" in result.stderr


def test_find_by_key_and_by_time(run, archived) -> None:
    result = run("find", "--key", "Orders-k77", "--json")
    assert result.exit_code == 0, result.output
    (rec,) = [json.loads(line) for line in result.stdout.splitlines()]
    topic, qid, off = archived.keys["Orders-k77"]
    assert (rec["topic"], rec["queue_id"], rec["queue_offset"]) == (topic, qid, off)
    assert "Orders-k77" in rec["keys"]
    # Orders: message i stored at T0 + i minutes, round robin over 2 queues
    result = run("find", "--topic", "Orders", "--time", str(T0 + 101 * 60_000 - 1), "--json")
    assert result.exit_code == 0, result.output
    recs = sorted((r["queue_id"], r["queue_offset"]) for r in map(json.loads, result.stdout.splitlines()))
    assert recs == [(0, 51), (1, 50)]
    assert run("find", "--key", "absent").exit_code == 1
    assert run("find", "--topic", "Orders").exit_code == 2
