"""The tables as a person sees them: each command run in a real terminal
(tmux at 80 and 200 columns), the screen read back with ``capture-pane``
(wrapped lines joined, so a line the terminal had to wrap shows as too
long). No line may be wider than the terminal, and every topic name must be
there whole."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tiered.dispatcher import TopicFilter
from dispatchkit import BROKER, CLUSTER, archive_all, new_dispatcher, new_writer
from tiered.archive.storage import open_store
from tiered.clock import ManualClock
from tiered.store.localstore import LocalStore

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")

ROOT = Path(__file__).resolve().parents[2]
GROUP = "settlement-reconciliation-consumer-group"
TOPICS = {  # topic -> queues
    "Orders": 4,
    f"%RETRY%{GROUP}": 1,
    f"%DLQ%{GROUP}": 1,
    "%DLQ%demo-consumers": 1,
    "billing.invoices.v2.eu-central-1.settlement-events": 2,
}
SYSTEM = "SCHEDULE_TOPIC_XXXX"


class Terminal:
    """A private tmux server; ``run`` shows one command's screen."""

    def __init__(self, socket: Path) -> None:
        self.socket = socket
        self.n = 0

    def tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-S", str(self.socket), "-f", "/dev/null", *args], check=True,
                              capture_output=True, text=True).stdout

    def run(self, width: int, args: list[str], env: dict[str, str] | None = None, timeout: float = 120,
            stderr: Path | None = None) -> tuple[int, list[str]]:
        """(exit code, screen lines with wrapped lines joined) of ``tiered ARGS`` at ``width`` columns;
        ``stderr``: a file for the log lines, off the screen."""
        self.n += 1
        name = f"t{self.n}"
        environ = {"PYTHONPATH": str(ROOT), "TIERED_LOG__LEVEL": "WARNING", **(env or {})}
        # COLUMNS from the test runner's environment would override the terminal's width
        command = (f"env -u COLUMNS -u LINES {' '.join(f'{k}={shlex.quote(v)}' for k, v in environ.items())} "
                   f"{shlex.quote(sys.executable)} -m tiered.cli {shlex.join(args)}"
                   f"{'' if stderr is None else ' 2>' + shlex.quote(str(stderr))}; echo __END__ $?; sleep 600")
        self.tmux("new-session", "-d", "-x", str(width), "-y", "50", "-s", name, command)
        try:
            deadline = time.monotonic() + timeout
            while True:
                screen = self.tmux("capture-pane", "-p", "-J", "-S", "-", "-E", "-", "-t", name)
                ends = [ln for ln in screen.splitlines() if ln.startswith("__END__ ")]
                if ends:
                    break
                assert time.monotonic() < deadline, screen
                time.sleep(0.2)
        finally:
            self.tmux("kill-session", "-t", name)
        lines = [ln.rstrip() for ln in screen.splitlines()]
        return int(ends[0].split()[1]), lines[:lines.index(ends[0])]


@pytest.fixture(scope="module")
def terminal(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Terminal]:
    t = Terminal(tmp_path_factory.mktemp("tmux") / "sock")
    # a session that outlives the others: the server stays up between commands
    t.tmux("new-session", "-d", "-s", "keep", "sleep 3600")
    yield t
    subprocess.run(["tmux", "-S", str(t.socket), "kill-server"], capture_output=True)


@pytest.fixture(scope="module")
def archived(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A store and its archive with long topic names, a system topic, a lag
    and a consumer group."""
    tmp = tmp_path_factory.mktemp("store")
    root, url = tmp / "store", f"file://{tmp / 'cold'}"
    clock = ManualClock(int(time.time() * 1000) - 3 * 3_600_000)
    with new_writer(root) as w:
        for i in range(120):
            for topic, queues in TOPICS.items():
                w.put(topic, i % queues, b"m%d" % i * 30, keys=[f"{topic}-{i}"], store_timestamp=clock.now_ms(),
                      born_timestamp=clock.now_ms())
            if i % 10 == 0:
                w.put("Orders", 0, b"delayed", delay_level=3, store_timestamp=clock.now_ms())
            clock.advance(60)
    queues = [(t, q) for t, n in TOPICS.items() for q in range(n)] + [(SYSTEM, 2)]
    with LocalStore(root) as local:
        d = new_dispatcher(open_store(url), local, tmp / "state", clock, upload_bytes=1, max_delay_ms=0,
                           segment_bytes=2048,
                           topic_filter=TopicFilter(include=("*", SYSTEM)))
        archive_all(d, local, queues)
    with new_writer(root) as w:  # a lag
        for i in range(7):
            w.put("Orders", 1, b"late", store_timestamp=clock.now_ms())
    (root / "config").mkdir(exist_ok=True)
    (root / "config" / "consumerOffset.json").write_text(json.dumps({"offsetTable": {
        f"Orders@{GROUP}": {"0": 10, "1": 30, "2": 30, "3": 30}, f"%RETRY%{GROUP}@{GROUP}": {"0": 120}}}))
    return root, url


def _check(width: int, code: int, lines: list[str], names: set[str], want_code: int = 0) -> None:
    screen = "\n".join(lines)
    assert code == want_code, screen
    assert all(len(ln) <= width for ln in lines), screen
    tokens = {tok for ln in lines for tok in ln.split()}
    assert names <= tokens, (names - tokens, screen)


@pytest.mark.parametrize("width", [80, 200])
def test_status_ls_and_find_fit_the_terminal(terminal: Terminal, archived: tuple[Path, str], width: int) -> None:
    root, url = archived
    scope = ["--cold", url, "--cluster", CLUSTER, "--broker", BROKER]
    env = {"TIERED_TOPICS__INCLUDE": json.dumps(["*", SYSTEM])}
    every = set(TOPICS) | {SYSTEM}
    # --wide is for a wide terminal: its headers alone take more than 80 columns
    for wide in ([], ["--wide"]) if width > 100 else ([],):
        code, lines = terminal.run(width, ["status", "--store", str(root), *scope, *wide], env)
        _check(width, code, lines, every | {GROUP})
        assert lines[0].split()[:3] == ["TOPIC", "QUEUE", "LAG"]
        assert ("BYTES" in lines[0].split()) == bool(wide)
        # the lag, with the age of its oldest record (about an hour: wall clock, not asserted)
        lag = next(ln for ln in lines if ln.split()[:2] == ["Orders", "1"]).split()[2:4]
        assert lag[0] == "7" and lag[1].startswith("(") and lag[1].endswith(")"), "\n".join(lines)
        code, lines = terminal.run(width, ["ls", *scope, *wide])
        _check(width, code, lines, every)
    code, lines = terminal.run(width, ["find", "--key", f"%DLQ%{GROUP}-7", *scope])
    _check(width, code, lines, {f"%DLQ%{GROUP}"})
    assert lines[0].split() == ["TOPIC", "QUEUE", "OFFSET", "STORED", "TAGS", "KEYS", "BODY"]
    code, lines = terminal.run(width, ["config", "show", "--store", str(root), *scope], env)
    _check(width, code, lines, {"topics.include", "cold_url", "TIERED_TOPICS__INCLUDE"})
    code, lines = terminal.run(width, ["lease", "show", *scope])
    _check(width, code, lines, {f"{CLUSTER}/{BROKER}", "writer-1"})
    assert lines[0].split() == ["PREFIX", "STATE", "OWNER", "PROCESS", "EPOCH", "EXPIRES"]


def test_demo_and_status_on_its_archive_at_80_columns(terminal: Terminal, tmp_path: Path) -> None:
    demo = tmp_path / "demo"
    code, lines = terminal.run(80, ["demo", "--dir", str(demo), "--duration", "5", "--rate", "100"], timeout=300)
    topics = {"Orders", "SCHEDULE_TOPIC_XXXX", "%RETRY%demo-consumers", "%DLQ%demo-consumers"}
    _check(80, code, lines, topics | {"OK:"})
    if os.environ.get("SHOW_SCREENS"):
        print("\n".join(lines))
    assert any(ln.split()[:4] == ["segments", "expired", "by", "the"] for ln in lines)
    code, lines = terminal.run(80, ["status", "--store", str(demo / "store"), "--cold", f"file://{demo / 'cold'}",
                                    "--broker", "demo-broker"],
                               {"TIERED_TOPICS__INCLUDE": json.dumps(["*", SYSTEM])})
    _check(80, code, lines, topics)
    if os.environ.get("SHOW_SCREENS"):
        print("\n".join(lines))


@pytest.mark.parametrize("width", [80, 200])
def test_a_long_problem_wraps_in_its_column(terminal: Terminal, tmp_path: Path, width: int) -> None:
    root, url = tmp_path / "store", f"file://{tmp_path / 'cold'}"
    topic = "billing.invoices.v2.eu-central-1.settlement-events"
    clock = ManualClock(int(time.time() * 1000) - 60_000)
    with new_writer(root) as w:
        for i in range(20):
            w.put(topic if i % 2 else "Orders", 0, b"x" * 100, store_timestamp=clock.now_ms())
    store = open_store(url)
    with LocalStore(root) as local:
        archive_all(new_dispatcher(store, local, tmp_path / "state", clock, upload_bytes=1, max_delay_ms=0,
                                   lease=False), local, [("Orders", 0), (topic, 0)])
    store.put(f"{CLUSTER}/{BROKER}/{topic}/0/manifest.json", b"\x00not a manifest")
    log = tmp_path / "stderr"  # the log line of the bad manifest: not the table's business
    code, lines = terminal.run(width, ["status", "--store", str(root), "--cold", url, "--cluster", CLUSTER,
                                       "--broker", BROKER, "--json"], stderr=log)
    [problem] = [json.loads(ln)["problem"] for ln in lines if json.loads(ln)["topic"] == topic]
    assert code == 1 and problem.startswith("manifest unreadable: ") and "manifest.json" in problem
    code, lines = terminal.run(width, ["status", "--store", str(root), "--cold", url, "--cluster", CLUSTER,
                                       "--broker", BROKER], stderr=log)
    _check(width, code, lines, {topic, "Orders"}, want_code=1)
    at = lines[0].index("PROBLEM")
    # the problem in its column, every word of it (a word longer than the column folded), in order
    shown = "".join(ln[at:] for ln in lines[1:] if ln.strip() != topic and ln[at:].strip() not in ("", "-"))
    assert shown.replace(" ", "") == problem.replace(" ", "")
    if os.environ.get("SHOW_SCREENS"):
        print("\n".join(lines))
