"""``tiered demo``: the whole sidecar on an embedded default, no other service.

It writes a broker store in the real on-disk format (with a few hours of
back-dated history in a topic whose retention is shorter than that),
produces live traffic into normal, delayed, retry and dead-letter topics in
the background, runs the sidecar (dispatcher + cleaner + metrics endpoint)
on shortened intervals against a ``file://`` cold tier, shows progress,
then verifies the archive byte for byte and prints a summary. The store and
the archive stay on disk for ``tiered status``, ``inspect``, ``cat``, ``find``:
in ``demo/`` under the state directory unless ``--dir`` says otherwise (never
the working directory), named at the start and the end with the command that
removes them.
"""

from __future__ import annotations

import random
import shlex
import shutil
import threading
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.live import Live
from rich.text import Text

from tiered.cli.app import app, fail
from tiered.cli.common import settings_from
from tiered.cli.output import Col, human_bytes, render_table, table
from tiered.cli.serve import Sidecar
from tiered.cli.wiring import cold_tier, setup_logging
from tiered.config import load_settings
from tiered.ops.status import queue_status
from tiered.store.storewriter import StoreWriter
from tiered.ops.verify import verify as run_verify

MARKER = ".tiered-demo"
HISTORY_TOPIC = "Orders"
HISTORY_RETENTION_HOURS = 4
GROUP = "demo-consumers"


def demo_root(directory: Path | None) -> Path:
    """Where the demo's files go: ``--dir``, else ``demo`` under the state
    directory (state_dir: TIERED_STATE_DIR, ~/.local/state/tiered), so a demo
    run from a source tree or a home directory leaves nothing there."""
    if directory is not None:
        return directory.resolve()
    return (settings_from(None).state_dir / "demo").resolve()


def removal(root: Path) -> str:
    """The command that removes the demo's files, to paste as it is."""
    return f"rm -rf {shlex.quote(str(root))}"


def say_where(console: Console, intro: str, root: Path) -> None:
    """Where the demo's files are and how to remove them: the path and the
    command each on a line of their own (indented), so that they fit a
    terminal's width more often and are copied whole."""
    for line in (intro, f"  {root}", "remove them with:", f"  {removal(root)}"):
        console.print(line, soft_wrap=True, markup=False, highlight=False)


def _prepare(root: Path) -> None:
    if root.exists() and any(root.iterdir()):
        if not (root / MARKER).exists():
            fail(f"{root} exists and was not made by 'tiered demo'; pick another --dir", 2)
        for sub in ("store", "cold", "state"):
            shutil.rmtree(root / sub, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    (root / MARKER).write_text("made by tiered demo\n")


def _history(writer: StoreWriter, now_ms: int, messages: int) -> None:
    """Messages stored 6 to 5 hours ago in a topic kept for 4 hours: archived,
    then expired by the cleaner during the demo."""
    writer.set_topic_attribute(HISTORY_TOPIC, "reserve.time", str(HISTORY_RETENTION_HOURS))
    start = now_ms - 6 * 3600_000
    step = 3600_000 // messages
    rng = random.Random(7)
    for i in range(messages):
        ts = start + i * step
        writer.put(HISTORY_TOPIC, i % 4, rng.randbytes(200), tags="history", keys=[f"order-{i}"],
                   unique_key=f"H{i:08d}", store_timestamp=ts, born_timestamp=ts - 3)


class _Producer(threading.Thread):
    """Live traffic: normal (keys, tags), delayed, retry and dead-letter messages."""

    def __init__(self, writer: StoreWriter, rate: int, stop: threading.Event) -> None:
        super().__init__(name="demo-producer", daemon=True)
        self.writer, self.rate, self.stop_event = writer, rate, stop
        self.produced = 0
        self.offset = 10_000

    def run(self) -> None:
        rng = random.Random(11)
        while not self.stop_event.is_set():
            tick = time.monotonic()
            for _ in range(max(1, self.rate // 10)):
                i = self.offset = self.offset + 1
                kind = i % 20
                if kind < 14:
                    self.writer.put(HISTORY_TOPIC, i % 4, rng.randbytes(rng.randint(50, 600)),
                                    tags=rng.choice(["created", "paid", "shipped"]), keys=[f"order-{i}"],
                                    unique_key=f"L{i:08d}")
                elif kind < 17:
                    self.writer.put("Payments", i % 2, rng.randbytes(300), tags="delayed", keys=[f"pay-{i}"],
                                    delay_level=3)
                elif kind < 19:
                    self.writer.put(f"%RETRY%{GROUP}", 0, rng.randbytes(120), keys=[f"order-{i}"],
                                    reconsume_times=1 + i % 3,
                                    properties={"RETRY_TOPIC": HISTORY_TOPIC, "ORIGIN_MESSAGE_ID": f"L{i:08d}"})
                else:
                    self.writer.put(f"%DLQ%{GROUP}", 0, rng.randbytes(120), keys=[f"order-{i}"],
                                    reconsume_times=16,
                                    properties={"DLQ_ORIGIN_TOPIC": HISTORY_TOPIC,
                                                "DLQ_ORIGIN_MESSAGE_ID": f"L{i:08d}"})
                self.produced += 1
            self.stop_event.wait(max(0.0, 0.1 - (time.monotonic() - tick)))


PROGRESS = (Col(name="topic"), Col(name="queues", right=True), Col(name="local messages", right=True),
            Col(name="archived up to", right=True), Col(name="lag", right=True), Col(name="segments", right=True),
            Col(name="bytes", right=True))


def _progress(sidecar: Sidecar, producer: _Producer, left: float, width: int) -> Text:
    rows = queue_status(sidecar.cold, sidecar.local)
    by_topic: dict[str, list] = {}
    for r in rows:
        by_topic.setdefault(r.topic, []).append(r)
    cells = [(topic, len(rs), sum((r.local_max_offset or 0) - (r.local_min_offset or 0) for r in rs),
              sum(r.archived_next_offset or 0 for r in rs), sum(r.lag_messages or 0 for r in rs),
              sum(r.segments for r in rs), human_bytes(sum(r.nbytes for r in rs)))
             for topic, rs in sorted(by_topic.items())]
    lines = [f"tiered demo: producing for {left:.0f}s more; metrics on {sidecar.server.url}/metrics",
             *render_table(PROGRESS, cells, width=width), f"produced live: {producer.produced}"]
    return Text("\n".join(lines))


@app.command()
def demo(
    directory: Annotated[Optional[Path], typer.Option(
        "--dir", help="Where the store, archive and state go (default: demo/ under the state directory).")] = None,
    duration: Annotated[float, typer.Option(min=5, max=600, help="Seconds of live traffic.")] = 30,
    rate: Annotated[int, typer.Option(min=10, max=20000, help="Live messages per second.")] = 400,
    metrics_port: Annotated[int, typer.Option(help="Port of the metrics endpoint (0: any free port).")] = 0,
) -> None:
    """Run the sidecar end to end on a generated store and a local file:// archive."""
    console = Console()
    root = demo_root(directory)
    _prepare(root)
    say_where(console, "demo files:", root)
    setup_logging("text", "WARNING")
    settings = load_settings(
        None, store=root / "store", cold_url=f"file://{root / 'cold'}", state_dir=root / "state",
        broker="demo-broker", instance_id="tiered-demo",
        **{"dispatch.interval": 2, "dispatch.upload_bytes": 256 << 10, "dispatch.max_delay": 3,
           "dispatch.segment_bytes": 1 << 20, "cleaner.interval": 4, "cleaner.orphan_grace": 30,
           "cleaner.orphan_scan_interval": 3600, "cleaner.merge_min_bytes": 64 << 10,
           "cleaner.merge_target_bytes": 1 << 20, "metrics.host": "127.0.0.1", "metrics.port": metrics_port,
           "topics.include": ["*", "SCHEDULE_TOPIC_XXXX"], "shutdown_timeout": 10},
    )
    writer = StoreWriter(root / "store", commitlog_file_size=4 << 20, cq_entries_per_file=20_000)
    _history(writer, int(time.time() * 1000), 2000)
    console.print(f"store: 2000 messages of history, {HISTORY_TOPIC} kept {HISTORY_RETENTION_HOURS} h")
    sidecar = Sidecar(settings)
    sidecar.dispatch_round()  # the history goes into segments of its own, before live traffic
    sidecar.start()
    stop = threading.Event()
    producer = _Producer(writer, rate, stop)
    producer.start()
    ends = time.monotonic() + duration
    try:
        with Live(console=console, refresh_per_second=2, transient=False) as live:
            while time.monotonic() < ends:
                live.update(_progress(sidecar, producer, ends - time.monotonic(), console.width))
                time.sleep(0.5)
            stop.set()
            producer.join()
            catch_up = time.monotonic() + 20
            while time.monotonic() < catch_up:
                live.update(_progress(sidecar, producer, 0, console.width))
                if all((r.lag_messages or 0) == 0 for r in queue_status(sidecar.cold, sidecar.local)):
                    break
                time.sleep(0.5)
        metrics_url = f"{sidecar.server.url}/metrics"
        expired = sidecar.registry.get_sample_value("tiered_cleaner_deleted_segments_total",
                                                    {"topic": HISTORY_TOPIC}) or 0
        archived_total = sum(s.value for m in sidecar.registry.collect() for s in m.samples
                             if s.name == "tiered_archived_messages_total")
    finally:
        stop.set()
        sidecar.stop(settings.shutdown_timeout)
        writer.close()
    report = run_verify(cold_tier(settings, sidecar.store, writer=False), sidecar.local)
    archived = sum(m.messages for m in sidecar.cold.manifests().values())
    console.print()
    summary = [
        ("messages produced", f"{2000 + producer.produced} (2000 history + {producer.produced} live)"),
        ("messages archived", f"{int(archived_total)} ({archived} still in the archive after expiry)"),
        ("archive verified", f"{'OK' if report.ok else 'FAILED'}: {report.compared_locally} records "
                             f"byte-identical to the store, {len(report.problems)} problems"),
        ("segments expired by the cleaner", f"{int(expired)} ({HISTORY_TOPIC} history older than "
                                            f"{HISTORY_RETENTION_HOURS} h)"),
        ("metrics were served at", metrics_url),
        ("store", str(root / "store")),
        ("archive", f"file://{root / 'cold'}"),
        ("explore", f"tiered status --store {root / 'store'} --cold file://{root / 'cold'} --broker demo-broker"),
    ]
    console.print("tiered demo: summary")
    table((Col(name="what"), Col(name="value", wrap=True)), summary, header=False)
    for problem in report.problems[:10]:
        console.print(f"[red]{problem}[/red]")
    say_where(console, "the demo's store, archive and state stay in:", root)
    if not report.ok:
        raise typer.Exit(1)
