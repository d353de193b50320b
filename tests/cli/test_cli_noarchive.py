"""A cold-tier URL with nothing under it (a mistyped bucket or prefix) is an
error of every reading command, never an empty, healthy archive; dispatch
creates the archive there as before."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tiered.cli import app
from tiered.cli.wiring import shown_url

READERS = {
    "status": ["status"],
    "ls": ["ls"],
    "verify": ["verify"],
    "cat": ["cat", "--topic", "Orders", "--queue", "0"],
    "find": ["find", "--key", "k1"],
    "sql": ["sql", "SELECT count(*) FROM messages"],
    "export": ["export", "--to", "file:///nowhere-to-write/out"],
}


def run(env: dict[str, str], *args: str):
    return CliRunner().invoke(app, list(args), env=env)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {"TIERED_STATE_DIR": str(tmp_path / "state"), "TIERED_CLUSTER": "C", "TIERED_BROKER": "b",
            "TIERED_S3__MAX_ATTEMPTS": "1", "TIERED_LOG__LEVEL": "WARNING"}


@pytest.fixture
def store(store_writer) -> Path:  # noqa: ANN001
    with store_writer() as w:
        for i in range(6):
            w.put("Orders", i % 2, b"o%d" % i, keys=[f"k{i}"])
    return w.root


def neighbour(cold_url: str, request: pytest.FixtureRequest, env: dict[str, str], tmp_path: Path) -> None:
    """Something next to the prefix, so the store is not empty, only the prefix is."""
    if cold_url.startswith("s3://"):
        env["TIERED_S3__ENDPOINT_URL"] = request.getfixturevalue("moto_endpoint")
        request.getfixturevalue("s3_client").put_object(Bucket=cold_url[5:].split("/", 1)[0],
                                                        Key="other/C/b/_identity.json", Body=b"{}")
    else:
        (tmp_path / "other" / "C" / "b").mkdir(parents=True)
        (tmp_path / "other" / "C" / "b" / "_identity.json").write_text("{}")


@pytest.mark.parametrize("command", list(READERS))
def test_reading_commands_refuse_a_url_with_nothing_under_it(command: str, cold_url: str, env: dict[str, str],
                                                             store: Path, request: pytest.FixtureRequest,
                                                             tmp_path: Path) -> None:
    neighbour(cold_url, request, env, tmp_path)
    # with a store that has queues: status would otherwise print their lag rows
    local = ["--store", str(store)] if command in ("status", "verify") else []
    result = run(env, *READERS[command], "--cold", cold_url, *local)
    assert result.exit_code == 1, result.output
    assert result.stdout == ""
    assert result.stderr == f"tiered: no archive at {cold_url} (nothing under it: check the bucket and prefix)\n"


def test_dispatch_creates_the_archive_the_readers_then_read(cold_url: str, env: dict[str, str], store: Path,
                                                            request: pytest.FixtureRequest, tmp_path: Path) -> None:
    neighbour(cold_url, request, env, tmp_path)
    created = run(env, "dispatch", "--all", "--store", str(store), "--cold", cold_url)
    assert created.exit_code == 0, created.output
    for command in ("status", "ls", "verify", "cat", "find"):  # sql and export: their own tests read archives
        local = ["--store", str(store)] if command in ("status", "verify") else []
        result = run(env, *READERS[command], "--cold", cold_url, *local)
        assert result.exit_code == 0 and "no archive" not in result.output, (command, result.output)
        assert result.stdout, command


def test_an_empty_directory_and_a_path_without_scheme(tmp_path: Path, env: dict[str, str]) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    for url in (str(tmp_path / "absent"), f"file://{empty}"):
        result = run(env, "ls", "--cold", url)
        assert (result.exit_code, result.stdout) == (1, ""), result.output
        assert result.stderr == f"tiered: no archive at {url} (nothing under it: check the bucket and prefix)\n"


def test_the_url_shown_carries_no_secret(tmp_path: Path, env: dict[str, str]) -> None:
    assert shown_url("s3://bucket/prefix") == "s3://bucket/prefix"
    assert shown_url("/var/archive") == "/var/archive"
    assert shown_url("s3://AKIAEXAMPLE:hunter2@bucket/p?X-Amz-Signature=abc") == "s3://AKIAEXAMPLE:***@bucket/p?***"
    result = run(env, "status", "--cold", f"file://me:hunter2@{tmp_path}/cold")
    assert result.exit_code == 1, result.output
    assert "hunter2" not in result.output and f"no archive at file://me:***@{tmp_path}/cold " in result.stderr
