"""The slim sidecar image: no pyspark or pyarrow in it, and every command the
sidecar runs works without them.

* pyspark and pyarrow are the `spark` extra; `test` pulls it in (checked by
  pip's own resolver in an empty virtualenv, not by reading pyproject).
* In the dev virtualenv, the CLI runs in a subprocess where importing
  pyspark or pyarrow raises (and is logged): the sidecar's commands must not
  even try, against a real moto S3; `tiered sql` / `export` exit 2 with one
  line naming the extra.
* bench/image_size.py builds the image's virtualenv exactly as the
  Dockerfile does, and the result is measured (goal <= 250 MB) and run.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.helm

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import image_size  # noqa: E402 - bench/ is not a package

from test_helm_dockerfile import stages  # noqa: E402

EXTRA_MESSAGE = "this command needs the 'spark' extra (pip install 'rocketmq-tiered[spark]')"

# Runs `tiered ARGS...` with pyspark and pyarrow unimportable; every attempt
# to import them is appended to $BLOCKED_LOG, so a caught ImportError shows.
BLOCKED_CLI = """
import importlib.abc, os, sys
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("pyspark", "pyarrow"):
            with open(os.environ["BLOCKED_LOG"], "a") as log:
                log.write(name + "\\n")
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Blocker())
for name in list(sys.modules):
    if name.split(".")[0] in ("pyspark", "pyarrow"):
        del sys.modules[name]
from tiered.cli import main
sys.argv = ["tiered", *sys.argv[1:]]
main()
"""


# --------------------------------------------------------------------------
# dependency layout
# --------------------------------------------------------------------------


def test_spark_is_an_extra_of_its_own() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[<>=\[; ]", r)[0].lower() for r in project["dependencies"]}
    assert not names & {"pyspark", "pyarrow"}
    assert {re.split(r"[<>= ]", r)[0] for r in project["optional-dependencies"]["spark"]} == {"pyspark", "pyarrow"}
    assert f"{project['name']}[spark]" in project["optional-dependencies"]["test"]
    # the pins cover what the extra installs
    pinned = {line.split("==")[0].lower() for line in (ROOT / "constraints.txt").read_text().splitlines() if "==" in line}
    assert {"pyspark", "pyarrow", "py4j"} <= pinned


def _resolve(spec: str, tmp_path: Path) -> set[str]:
    """What `pip install -c constraints.txt -e SPEC` would install into an empty virtualenv."""
    venv = tmp_path / f"empty-{abs(hash(spec))}"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    report = tmp_path / "report.json"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--dry-run", "-q",
         "--report", str(report), "-c", "constraints.txt", "-e", spec],
        cwd=ROOT, check=True, capture_output=True,
    )
    return {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}


@pytest.mark.slow
def test_pip_resolves_spark_only_for_the_query_side_and_tests(tmp_path: Path) -> None:
    plain = _resolve(".", tmp_path)
    assert "rocketmq-tiered" in plain and "boto3" in plain and "s3fs" in plain
    assert not plain & {"pyspark", "pyarrow", "py4j"}
    with_tests = _resolve(".[test]", tmp_path)
    assert {"pyspark", "pyarrow", "py4j", "pytest", "moto"} <= with_tests


def test_bench_runs_the_dockerfiles_install_commands() -> None:
    """image_size.py measures what the Dockerfile installs, command for command."""
    all_stages = stages()
    for stage, steps in (("build", image_size.BUILD_STEPS), ("build-spark", image_size.SPARK_STEPS)):
        runs = " && ".join(args for ins, args in all_stages[stage] if ins == "RUN")
        commands = [c.strip() for c in re.split(r"&&|>", runs)]
        for step in steps:
            assert step in commands, (stage, step)
    assert image_size.requirements() == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]


# --------------------------------------------------------------------------
# the CLI without pyspark/pyarrow (dev virtualenv, imports blocked)
# --------------------------------------------------------------------------


def _blocked(args: list[str], log: Path, *, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", BLOCKED_CLI, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env | {"BLOCKED_LOG": str(log)})


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _env(moto_endpoint: str) -> dict[str, str]:
    return dict(os.environ, TIERED_S3__ENDPOINT_URL=moto_endpoint, TIERED_BROKER="broker-a",
                TIERED_CLUSTER="slim", TIERED_LOG__LEVEL="WARNING")


@pytest.mark.s3
def test_sidecar_commands_never_import_spark_or_arrow(tmp_path: Path, moto_endpoint: str, s3_bucket: str) -> None:
    log, store, cold = tmp_path / "blocked.log", tmp_path / "store", f"s3://{s3_bucket}/archive"
    env = _env(moto_endpoint) | {"TIERED_STATE_DIR": str(tmp_path / "state")}
    commands: list[tuple[list[str], str]] = [
        (["produce", "--store", str(store), "--topic", "Orders", "--queues", "2", "--messages", "40", "--keys"], ""),
        (["inspect", "--store", str(store)], "Orders"),
        (["dispatch", "--store", str(store), "--cold", cold, "--once", "--all"], "archived 40 messages"),
        (["status", "--store", str(store), "--cold", cold], "Orders"),
        (["verify", "--store", str(store), "--cold", cold], "OK"),
        (["cat", "--cold", cold, "--topic", "Orders", "--queue", "1", "--offset", "0", "--count", "3"], "Orders/1@2"),
        (["clean", "--cold", cold, "--store", str(store), "--once", "--dry-run"], "dry run"),
        (["repair", "--cold", cold, "--dry-run"], "0 manifests would rebuild"),
    ]
    for args, expected in commands:
        done = _blocked(args, log, env=env)
        assert done.returncode == 0, (args, done.stderr[-2000:])
        assert expected in done.stdout + done.stderr, (args, done.stdout[-1000:], done.stderr[-1000:])
        assert not log.exists(), (args, log.read_text())
    cat = _blocked(["cat", "--cold", cold, "--topic", "Orders", "--queue", "0", "--offset", "0"], log, env=env)
    assert len(cat.stdout.splitlines()) == 20 and not log.exists()


@pytest.mark.s3
def test_serve_runs_without_spark_or_arrow(tmp_path: Path, moto_endpoint: str, s3_bucket: str) -> None:
    """The sidecar process itself: it archives and serves its endpoints."""
    log, store, port = tmp_path / "blocked.log", tmp_path / "store", _free_port()
    env = _env(moto_endpoint) | {"TIERED_DISPATCH__INTERVAL": "1s", "TIERED_DISPATCH__MAX_DELAY": "1s"}
    produced = _blocked(["produce", "--store", str(store), "--topic", "Orders", "--messages", "30"], log, env=env)
    assert produced.returncode == 0, produced.stderr
    serve = subprocess.Popen(
        [sys.executable, "-c", BLOCKED_CLI, "serve", "--store", str(store), "--cold", f"s3://{s3_bucket}/a",
         "--metrics-port", str(port), "--state-dir", str(tmp_path / "state")],
        cwd=ROOT, env=env | {"BLOCKED_LOG": str(log)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        metrics = _wait_for_archive(f"http://127.0.0.1:{port}", serve)
    finally:
        serve.send_signal(signal.SIGTERM)
        out, err = serve.communicate(timeout=60)
    assert serve.returncode == 0, err[-2000:]
    assert re.search(r'^tiered_archived_messages_total\{[^}]*topic="Orders"[^}]*\} 30\.0$', metrics, re.MULTILINE), metrics
    assert not log.exists(), log.read_text()


def _wait_for_archive(url: str, proc: subprocess.Popen[str], timeout: float = 90) -> str:
    """/metrics once all 30 messages are archived (polled; the deadline only bounds a hang)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=5) as health:
                assert health.status == 200
            with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
                text = response.read().decode()
            if re.search(r'^tiered_archived_messages_total\{[^}]*\} 30\.0$', text, re.MULTILINE):
                return text
        except urllib.error.URLError:
            pass  # not listening yet
        time.sleep(0.2)
    raise AssertionError("the sidecar did not archive the 30 messages in time")


@pytest.mark.parametrize(
    ("args", "missing"),
    [
        (["sql", "SELECT count(*) FROM messages"], "pyspark and pyarrow"),
        (["export", "--to", "file:///nowhere"], "pyarrow"),
        (["export", "--to", "file:///nowhere", "--engine", "spark"], "pyarrow and pyspark"),
    ],
    ids=["sql", "export-local", "export-spark"],
)
def test_query_commands_name_the_extra(args: list[str], missing: str, tmp_path: Path) -> None:
    log = tmp_path / "blocked.log"
    done = _blocked([*args, "--cold", f"file://{tmp_path}/cold"], log, env=dict(os.environ))
    assert done.returncode == 2
    assert done.stderr == f"tiered: {missing} not installed: {EXTRA_MESSAGE}\n"
    assert done.stdout == ""
    assert log.exists()  # the blocker was really consulted


# --------------------------------------------------------------------------
# the image's virtualenv, built as the Dockerfile builds it
# --------------------------------------------------------------------------


@pytest.mark.slow
def test_image_virtualenv_is_slim_and_runs(tmp_path: Path) -> None:
    venv = image_size.build(tmp_path / "opt-tiered", workdir=tmp_path / "work")
    size = image_size.measure(venv)
    assert size.query_side_installed == ()
    assert size.apparent_bytes <= image_size.GOAL_BYTES, size.as_dict()
    assert size.disk_bytes <= image_size.GOAL_BYTES * 1.2, size.as_dict()
    python, tiered = str(venv / "bin" / "python"), str(venv / "bin" / "tiered")
    dists = subprocess.run([python, "-c", "import importlib.metadata as m; print('\\n'.join(sorted("
                            "d.metadata['Name'].lower() for d in m.distributions())))"],
                           capture_output=True, text=True, check=True).stdout.split()
    assert "rocketmq-tiered" in dists and not {"pyspark", "pyarrow", "py4j"} & set(dists)
    # the package is installed, not the repo on a path: run outside the repo
    run: dict[str, Any] = {"cwd": tmp_path, "capture_output": True, "text": True, "timeout": 120}
    subprocess.run([python, "-c", "import tiered.cli.serve, tiered.dispatcher, tiered.cleaner, tiered.metrics.server"],
                   check=True, **run)
    # only tiered: a top-level metrics would collide with other distributions' (issue 32, item 5)
    for name in ("dispatcher", "cleaner", "metrics"):
        assert subprocess.run([python, "-c", f"import {name}"], **run).returncode == 1
    # the build compiled the native core (gcc in the Dockerfile's build stage)
    subprocess.run([python, "-c", "import sys, tiered.native as n; sys.exit(n.core is None)"], check=True, **run)
    store = tmp_path / "store"
    done = subprocess.run([tiered, "produce", "--store", str(store), "--topic", "T", "--messages", "10"], **run)
    assert done.returncode == 0, done.stderr
    cold = f"file://{tmp_path}/cold"
    done = subprocess.run([tiered, "dispatch", "--store", str(store), "--cold", cold, "--broker", "b", "--once",
                           "--all"], **run | {"env": dict(os.environ, TIERED_STATE_DIR=str(tmp_path / "state"))})
    assert done.returncode == 0 and "archived 10 messages" in done.stdout + done.stderr, done.stderr
    done = subprocess.run([tiered, "sql", "SELECT 1", "--cold", cold], **run)
    assert (done.returncode, done.stderr) == (2, f"tiered: pyspark and pyarrow not installed: {EXTRA_MESSAGE}\n")


def test_readme_demo_runs_without_spark_or_arrow(tmp_path: Path) -> None:
    """The README's first command installs `.` (no extra) and runs `tiered demo`."""
    log = tmp_path / "blocked.log"
    done = _blocked(["demo", "--dir", str(tmp_path / "demo"), "--duration", "5", "--rate", "20"], log,
                    env=dict(os.environ), timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert re.search(r"archive verified\s+OK: \d+ records byte-identical", done.stdout), done.stdout[-3000:]
    assert not log.exists(), log.read_text()
