"""tiered --version, completion, config show, lease show / release, and the output layer."""

from __future__ import annotations

import io
import json
import logging
import re
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tiered.cli import app
from tiered.cli.output import progress, table
from tiered.cli.wiring import JsonFormatter, TextFormatter, setup_logging
from tiered.archive.lease import LeaseManager
from tiered.archive.storage import open_store


def run(*args: str, env: dict[str, str | None] | None = None):
    return CliRunner().invoke(app, list(args), env=env or {})


def jlines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_version() -> None:
    from importlib.metadata import version

    from tiered import native

    result = run("--version")
    where = native.reason
    assert result.exit_code == 0
    if native.core is not None:
        assert result.stdout == f"tiered {version('rocketmq-tiered')}\nnative core: {where}\n"
        assert where.startswith("loaded from ") and "_native" in where
    else:
        assert result.stdout == f"tiered {version('rocketmq-tiered')}\nnative core: {where}; running the Python path\n"


def test_version_without_native_core(monkeypatch: pytest.MonkeyPatch) -> None:
    from tiered import native

    monkeypatch.setattr(native, "core", None)
    monkeypatch.setattr(native, "reason", "not built (No module named 'tiered._native')")
    result = run("--version")
    assert result.exit_code == 0
    assert result.stdout.splitlines()[1] == ("native core: not built (No module named 'tiered._native'); "
                                             "running the Python path")


def test_shell_completion_script() -> None:
    # --show-completion finds the shell from the process's parents (shellingham),
    # so ask from a bash, as a user would: under CliRunner the answer depended
    # on what started pytest
    import subprocess

    tiered = Path(sys.executable).with_name("tiered")
    out = subprocess.run(["bash", "-c", '"$0" --show-completion; exit $?', str(tiered)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert "_TIERED_COMPLETE=complete_bash" in out.stdout and "complete -o default -F _tiered_completion tiered" \
        in out.stdout


def test_config_show_names_each_source_and_masks_secrets(tmp_path: Path) -> None:
    cfg = tmp_path / "tiered.yaml"
    cfg.write_text("cluster: FromFile\ndispatch:\n  parallelism: 2\nretention:\n  topics: {Orders: 7d}\n")
    result = run("config", "show", "--config", str(cfg), "--cold", "s3://bucket-a/p", "--json",
                 env={"TIERED_BROKER": "broker-env", "TIERED_S3__ACCESS_KEY_ID": "AKIAXXXX",
                      "TIERED_S3__SECRET_ACCESS_KEY": "very-secret", "XDG_STATE_HOME": str(tmp_path / "xdg")})
    assert result.exit_code == 0, result.output
    rows = {r["key"]: (r["value"], r["source"]) for r in jlines(result.stdout)}
    assert rows["cluster"] == ("FromFile", f"{cfg} line 1")
    assert rows["dispatch.parallelism"] == (2, f"{cfg} line 3")
    assert rows["retention.topics.Orders"] == (168.0, f"{cfg} line 5")
    assert rows["broker"] == ("broker-env", "env TIERED_BROKER")
    assert rows["cold_url"] == ("s3://bucket-a/p", "command line")
    assert rows["s3.access_key_id"] == ("**********", "env TIERED_S3__ACCESS_KEY_ID")
    assert rows["s3.secret_access_key"] == ("**********", "env TIERED_S3__SECRET_ACCESS_KEY")
    assert rows["dispatch.interval"] == (20.0, "default")
    # the state directory never depends on the working directory
    assert rows["state_dir"] == (str(tmp_path / "xdg" / "tiered"), "default")
    assert "very-secret" not in result.output and "AKIAXXXX" not in result.output


def test_config_show_without_json(tmp_path: Path) -> None:
    result = run("config", "show", "--cold", "s3://bucket-a/p", env={"XDG_STATE_HOME": "/x"})
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    # off a terminal: the same table, one line per row however wide
    assert lines[0].split() == ["KEY", "VALUE", "SOURCE"]
    rows = [ln.rstrip().split(None, 2) for ln in lines[1:]]
    assert len(rows) == len(jlines(run("config", "show", "--cold", "s3://bucket-a/p", "--json",
                                       env={"XDG_STATE_HOME": "/x"}).stdout))
    assert ["cleaner.orphan_scan_interval", "21600.0", "default"] in rows
    assert ["cold_url", "s3://bucket-a/p", "command line"] in rows
    assert ["state_dir", "/x/tiered", "default"] in rows


def _env(tmp_path: Path) -> dict[str, str | None]:
    return {"TIERED_CLUSTER": "C", "TIERED_BROKER": "b", "TIERED_STATE_DIR": str(tmp_path / "state")}


def test_lease_show_and_release(tmp_path: Path) -> None:
    cold = f"file://{tmp_path}/cold"
    env = _env(tmp_path)
    result = run("lease", "show", "--cold", cold, "--json", env=env)
    assert result.exit_code == 0 and jlines(result.stdout) == [{"prefix": "C/b", "held": False, "owner": None}]

    holder = LeaseManager(open_store(cold), "C/b", "other-host:/store", ttl_s=120)
    held = holder.acquire()
    result = run("lease", "show", "--cold", cold, "--json", env=env)
    (row,) = jlines(result.stdout)
    assert (row["held"], row["owner"], row["epoch"]) == (True, "other-host:/store", held.epoch)

    result = run("lease", "release", "--cold", cold, env=env)
    assert result.exit_code == 1
    assert result.stderr.startswith("tiered: C/b: the lease is live, held by 'other-host:/store'")
    assert result.stderr.rstrip().endswith("stop that process, or pass --force")
    result = run("lease", "release", "--cold", cold, "--force", "--owner", "someone-else", env=env)
    assert result.exit_code == 1 and "not 'someone-else'; nothing released" in result.stderr

    result = run("lease", "release", "--cold", cold, "--force", env=env)
    assert result.exit_code == 0, result.output
    assert result.stderr == f"C/b: released the lease of 'other-host:/store' (epoch {held.epoch})\n"
    (row,) = jlines(run("lease", "show", "--cold", cold, "--json", env=env).stdout)
    assert (row["held"], row["owner"]) == (False, "other-host:/store")
    # the next writer takes it at once
    nxt = LeaseManager(open_store(cold), "C/b", "new-host:/store", ttl_s=120).acquire()
    assert nxt.owner == "new-host:/store" and nxt.epoch == held.epoch + 1


def test_table_off_a_terminal_keeps_each_row_on_one_line(capsys) -> None:
    topic = "%RETRY%" + "a-really-long-consumer-group-name-" * 3
    table(("topic", "queue", "last stored"), [(topic, 0, "2026-01-01T00:00:00.000Z"), ("A", 1, "a b")])
    # wider than 80 columns off a terminal: the same table, nothing wrapped or cut
    pad = " " * (len(topic) - 5)
    assert capsys.readouterr().out.splitlines() == [
        f"TOPIC{pad}  QUEUE  LAST STORED", f"{topic}  0      2026-01-01T00:00:00.000Z", f"A{pad}      1      a b"]


def test_table_that_fits_is_a_table(capsys) -> None:
    table(("topic", "queue", "bytes"), [("%DLQ%billing", 0, 123), ("Orders", 11, None)], right=("queue", "bytes"))
    assert capsys.readouterr().out.splitlines() == ["TOPIC         QUEUE  BYTES", "%DLQ%billing      0    123",
                                                    "Orders           11      -"]


def test_table_json_is_one_object_per_row(capsys) -> None:
    table(("topic", "first stored"), [("A", "2026-01-01T00:00:00.000Z"), ("B", None)], as_json=True)
    assert jlines(capsys.readouterr().out) == [{"topic": "A", "first_stored": "2026-01-01T00:00:00.000Z"},
                                               {"topic": "B", "first_stored": None}]


def test_log_times_are_utc_iso_with_milliseconds() -> None:
    rec = logging.makeLogRecord({"msg": "hello %s", "args": ("x",), "levelname": "INFO", "name": "t",
                                 "created": 1_700_000_000.123456, "topic": "Orders"})
    doc = json.loads(JsonFormatter().format(rec))
    assert doc == {"time": "2023-11-14T22:13:20.123Z", "level": "INFO", "logger": "t", "message": "hello x",
                   "topic": "Orders"}
    text = TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s").format(rec)
    assert text == "2023-11-14T22:13:20.123Z INFO t: hello x topic=Orders"


def test_log_lines_go_to_stderr_as_it_is_when_they_come(monkeypatch) -> None:
    """A command run in-process after another (CliRunner, a notebook) logs to
    its own stderr, not to the closed stream of the run that set logging up."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        first = io.StringIO()
        monkeypatch.setattr(sys, "stderr", first)
        setup_logging("text", "WARNING")
        first.close()
        second = io.StringIO()
        monkeypatch.setattr(sys, "stderr", second)
        logging.getLogger("tiered.t").error("manifest unreadable")
        assert second.getvalue().endswith(" ERROR tiered.t: manifest unreadable\n")
    finally:
        root.handlers[:], _ = saved
        root.setLevel(saved[1])


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_quiet_off_a_terminal(capsys) -> None:
    with progress("archiving", total=10, unit="bytes") as bar:
        bar.advance(10)
    assert not bar.enabled
    assert capsys.readouterr() == ("", "")


def test_progress_on_a_terminal_shows_count_rate_and_eta(monkeypatch) -> None:
    fake = _Tty()
    monkeypatch.setattr(sys, "stderr", fake)
    now = [100.0]
    with progress("exporting", total=8, unit="tasks", get_time=lambda: now[0]) as bar:
        bar.set_total(20)  # learnt late (a new total restarts the rate estimate)
        now[0] = 101.0
        bar.advance(5)
        now[0] = 102.0
        bar.set_completed(10)
    assert bar.enabled
    # the last frame before the bar is erased: count, percentage, rate (5 tasks in 1 s), ETA (10 left)
    frame = fake.getvalue().split("\r")[-2]
    assert ["exporting", "10/20", "50%", "5", "tasks/s", "0:00:02"] == [
        w for w in re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", frame).split() if not w.startswith("━")]


def test_export_progress_runs_tasks_in_chunks_in_order(monkeypatch) -> None:
    from tiered.cli.query import progress_executor

    calls: list[list[int]] = []

    def inner(ctx: object, tasks: list[dict]) -> list[dict]:
        calls.append([t["n"] for t in tasks])
        return [{"n": t["n"] * 10} for t in tasks]

    tasks = [{"n": i} for i in range(5)]
    # off a terminal: the executor itself, one batch
    assert progress_executor(inner, 2) is inner
    monkeypatch.setattr(sys, "stderr", _Tty())
    assert progress_executor(inner, 2)(None, tasks) == [{"n": i * 10} for i in range(5)]
    assert calls == [[0, 1], [2, 3], [4]]
