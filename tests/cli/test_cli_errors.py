"""Every operator error through the CLI: one or two lines naming what is wrong,
and the documented exit code (0 ok, 1 findings, 2 usage/config, 3 storage)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tiered.cli import app

# no credential source but the ones a test gives: no profile, no instance metadata
NO_AWS = {"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None, "AWS_SESSION_TOKEN": None,
          "AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
          "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONTAINER_CREDENTIALS_FULL_URI": None,
          "AWS_WEB_IDENTITY_TOKEN_FILE": None}


def run(*args: str, env: dict[str, str | None] | None = None, tmp: Path | None = None):
    base: dict[str, str | None] = {"TIERED_S3__MAX_ATTEMPTS": "1", "TIERED_DISPATCH__RETRY__ATTEMPTS": "1"}
    if tmp is not None:
        base["TIERED_STATE_DIR"] = str(tmp / "state")
    return CliRunner().invoke(app, list(args), env={**base, **(env or {})})


def lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip()]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_missing_credentials_is_one_line_exit_3(s3_url: str, moto_endpoint: str, tmp_path: Path) -> None:
    result = run("status", "--cold", s3_url, env={**NO_AWS, "TIERED_S3__ENDPOINT_URL": moto_endpoint}, tmp=tmp_path)
    assert result.exit_code == 3, result.output
    [line] = lines(result.stderr)
    assert line.startswith(f"tiered: storage error (endpoint {moto_endpoint}): list {s3_url}/"), line
    assert ": no S3 credentials found for " in line
    for place in ("s3.access_key_id", "AWS_ACCESS_KEY_ID", "AWS_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE",
                  "instance metadata"):
        assert place in line
    assert "Traceback" not in result.output


def test_yaml_syntax_error_names_file_line_and_column(tmp_path: Path) -> None:
    cfg = tmp_path / "tiered.yaml"
    cfg.write_text("cluster: C\ndispatch:\n  interval: [20s\n")
    result = run("status", "--config", str(cfg), "--cold", f"file://{tmp_path}/cold", tmp=tmp_path)
    assert result.exit_code == 2, result.output
    (line,) = lines(result.stderr)
    assert line.startswith(f"tiered: invalid configuration: {cfg} line 4 column 1: ")
    assert "Traceback" not in result.output


def test_config_file_that_is_not_a_mapping(tmp_path: Path) -> None:
    cfg = tmp_path / "tiered.yaml"
    cfg.write_text("- a\n- b\n")
    result = run("status", "--config", str(cfg), tmp=tmp_path)
    assert result.exit_code == 2
    assert lines(result.stderr) == [f"tiered: invalid configuration: {cfg}: the top level must be a mapping of "
                                    f"settings (found list)"]


def test_short_bucket_name_is_a_usage_error() -> None:
    result = run("status", "--cold", "s3://ab")
    assert result.exit_code == 2
    assert lines(result.stderr) == [
        "tiered: invalid configuration: cold_url (command line): 'ab' is not an S3 bucket name (3-63 characters: "
        "lower-case letters, digits, '.', '-'); use s3://BUCKET/PREFIX"]


def test_huge_interval_names_key_file_and_line(tmp_path: Path) -> None:
    cfg = tmp_path / "tiered.yaml"
    cfg.write_text("cluster: C\ndispatch:\n  upload_bytes: 1MiB\n  interval: 1e400\n")
    result = run("status", "--config", str(cfg), tmp=tmp_path)
    assert result.exit_code == 2
    assert lines(result.stderr) == [
        f"tiered: invalid configuration: dispatch.interval ({cfg} line 4): not a duration: '1e400' "
        f"(use e.g. 20, '20s', '5m', '1h', '7d')"]


def test_huge_interval_from_environment_names_the_variable(tmp_path: Path) -> None:
    result = run("status", env={"TIERED_CLEANER__INTERVAL": "1e400"}, tmp=tmp_path)
    assert result.exit_code == 2
    assert lines(result.stderr)[0].startswith(
        "tiered: invalid configuration: cleaner.interval (env TIERED_CLEANER__INTERVAL): not a duration")


def test_infinite_retention_is_refused(tmp_path: Path) -> None:
    cfg = tmp_path / "tiered.yaml"
    cfg.write_text("retention:\n  default_hours: .inf\n")
    result = run("status", "--config", str(cfg), tmp=tmp_path)
    assert result.exit_code == 2
    assert lines(result.stderr) == [
        f"tiered: invalid configuration: retention.default_hours ({cfg} line 2): a retention must be finite: "
        f"use 'forever' to keep data without expiry"]


def test_access_key_without_secret_never_echoes_the_key(tmp_path: Path) -> None:
    cfg = tmp_path / "tiered.yaml"
    cfg.write_text("cold_url: s3://bucket-x/a\ns3:\n  access_key_id: AKIASECRETVALUE\n")
    result = run("status", "--config", str(cfg), tmp=tmp_path)
    assert result.exit_code == 2
    assert lines(result.stderr) == [
        f"tiered: invalid configuration: s3 ({cfg} line 2): s3.access_key_id is set but s3.secret_access_key "
        f"is not: give both or neither"]
    assert "AKIASECRETVALUE" not in result.output


def test_unwritable_state_dir_is_a_config_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    store = tmp_path / "store"
    (store / "consumequeue").mkdir(parents=True)
    (store / "commitlog").mkdir()
    result = run("dispatch", "--store", str(store), "--cold", f"file://{tmp_path}/cold",
                 env={"TIERED_STATE_DIR": str(blocker / "state")})
    assert result.exit_code == 2, result.output
    assert lines(result.stderr) == [
        f"tiered: invalid configuration: state_dir: {blocker / 'state'} is not writable (Not a directory); "
        f"set state_dir in the config file or TIERED_STATE_DIR"]


def test_status_with_storage_unreachable_exit_3(tmp_path: Path) -> None:
    endpoint = f"http://127.0.0.1:{closed_port()}"
    result = run("status", "--cold", "s3://some-bucket/arch", "--cluster", "C", "--broker", "b",
                 env={"TIERED_S3__ENDPOINT_URL": endpoint}, tmp=tmp_path)
    assert result.exit_code == 3, result.output
    first, second = lines(result.stderr)
    # the first request: the listing that finds whether anything is under the URL
    assert first == f"tiered: storage error (endpoint {endpoint}): list s3://some-bucket/arch/: " \
                    f"EndpointConnectionError"
    assert second.startswith(f'  cause: cannot connect: Could not connect to the endpoint URL: "{endpoint}/')
    assert "Traceback" not in result.output


def test_debug_prints_the_traceback(tmp_path: Path) -> None:
    endpoint = f"http://127.0.0.1:{closed_port()}"
    result = run("--debug", "status", "--cold", "s3://some-bucket/arch", env={"TIERED_S3__ENDPOINT_URL": endpoint},
                 tmp=tmp_path)
    assert result.exit_code == 3
    assert "Traceback (most recent call last)" in result.stderr
    assert result.stderr.rstrip().splitlines()[-2].startswith("tiered: storage error")


def test_missing_bucket_names_bucket_and_code(moto_endpoint: str, tmp_path: Path) -> None:
    result = run("status", "--cold", "s3://no-such-bucket-here/p", "--cluster", "C", "--broker", "b",
                 env={"TIERED_S3__ENDPOINT_URL": moto_endpoint}, tmp=tmp_path)
    assert result.exit_code == 3, result.output
    first, second = lines(result.stderr)
    assert first.startswith(f"tiered: storage error (endpoint {moto_endpoint}): list s3://no-such-bucket-here/p/: ")
    assert second.startswith("  cause: refused: NoSuchBucket")


def test_misspelt_environment_variable_gets_a_warning(tmp_path: Path) -> None:
    result = run("config", "show", "--cold", f"file://{tmp_path}/cold", "--cluster", "C", "--broker", "b",
                 env={"TIERED_DISPACH__INTERVAL": "5s", "TIERED_RETENTION__TOPICS__ORDERS": "24"}, tmp=tmp_path)
    assert result.exit_code == 0, result.output
    assert lines(result.stderr) == ["tiered: warning: TIERED_DISPACH__INTERVAL is not a setting and is ignored "
                                    "(did you mean TIERED_DISPATCH__INTERVAL?)"]


def test_unknown_flag_is_exit_2() -> None:
    result = run("status", "--no-such-flag")
    assert result.exit_code == 2


@pytest.mark.parametrize("value,hours", [("36h", 36.0), ("7d", 168.0), ("90m", 1.5), ("forever", 1e9), ("12", 12.0)])
def test_retention_units(value: str, hours: float) -> None:
    from tiered.config import load_settings

    s = load_settings(None, **{"retention.default_hours": value, "retention.topics": {"Orders": value}})
    assert s.retention.default_hours == hours and s.retention.topics == {"Orders": hours}


@pytest.mark.parametrize("value", ["90s", "36h", "7d", 20, "500ms"])
def test_duration_units(value: object) -> None:
    from tiered.config import load_settings

    expect = {"90s": 90.0, "36h": 36 * 3600.0, "7d": 7 * 86400.0, 20: 20.0, "500ms": 0.5}[value]  # type: ignore[index]
    assert load_settings(None, **{"cleaner.interval": value}).cleaner.interval == expect
