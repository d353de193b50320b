"""``tiered dispatch`` and ``tiered verify``."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from typing import Annotated

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

from dispatcher import Dispatcher
from tiered.cli.app import app, err_console, fail
from tiered.cli.common import BrokerOpt, ClusterOpt, ColdOpt, ConfigOpt, StoreOpt, settings_from
from tiered.cli.wiring import cold_tier, make_dispatcher, object_store, setup_logging, topic_filter
from tiered.config import Settings
from tiered.errors import TieredError
from tiered.localstore import LocalStore
from tiered.clock import SystemClock
from tiered.verify import PendingCheck
from tiered.verify import verify as run_verify


def _require_store(settings: Settings) -> LocalStore:
    if settings.store is None:
        fail("invalid configuration: store: required (--store DIR)", 2)
    if not (settings.store / "consumequeue").is_dir():
        fail(f"invalid configuration: store: {settings.store} is not a broker store (no consumequeue/)", 2)
    return LocalStore(settings.store)


def _backlog_bytes(dispatcher: Dispatcher) -> int:
    """Bytes waiting in the eligible queues, from the ConsumeQueues alone (for the progress bar)."""
    total = 0
    for topic, qid in dispatcher.eligible_queues():
        m = dispatcher.cold.cached(topic, qid)
        start = m.next_offset if m is not None else dispatcher.local.queue_range(topic, qid).min_offset
        total += dispatcher.local.pending(topic, qid, start)[1]
    return total


@app.command()
def dispatch(
    config: ConfigOpt = None, store: StoreOpt = None, cold: ColdOpt = None,
    cluster: ClusterOpt = None, broker: BrokerOpt = None,
    once: Annotated[bool, typer.Option("--once", help="Run one round and exit.")] = False,
    all_pending: Annotated[bool, typer.Option("--all", help="Upload everything pending, ignoring thresholds.")] = False,
) -> None:
    """Archive every eligible queue (one round with --once)."""
    flags = {"store": store, "cold_url": cold, "cluster": cluster, "broker": broker}
    if all_pending:
        flags.update({"dispatch.upload_bytes": 1, "dispatch.max_delay": 0.001})
    settings = settings_from(config, **flags)
    setup_logging(settings.log.format, settings.log.level)
    if not once:
        fail("use --once for a single round, or 'tiered serve' to run on a schedule", 2)
    local = _require_store(settings)
    with Progress(TextColumn("archiving"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  console=err_console, transient=True, disable=not sys.stderr.isatty()) as progress:
        task = progress.add_task("archive", total=None)
        dispatcher = make_dispatcher(settings, local, on_bytes=lambda n: progress.advance(task, n))
        dispatcher.options = replace(dispatcher.options, round_budget_s=float("inf"))
        try:
            dispatcher.start()
            progress.update(task, total=_backlog_bytes(dispatcher) or None)
            result = dispatcher.run_round()
        except TieredError as exc:
            fail(str(exc), 1)
        finally:
            if dispatcher.started and dispatcher.lease is not None:
                try:
                    dispatcher.lease.release()  # a one-shot run: a replacement need not wait
                except TieredError:
                    pass
    err_console.print(f"archived {result.messages} messages ({result.nbytes} bytes) in {result.segments} segments "
                      f"over {result.queues} queues; gaps {result.gaps}; "
                      + (f"still pending {result.lag_messages}" if result.lag_messages else "nothing pending"))
    for where, error in result.errors.items():
        err_console.print(f"[red]{where}: {error}[/red]")
    if result.fenced:
        fail(result.fenced, 1)
    if result.errors:
        raise typer.Exit(1)


@app.command()
def verify(
    config: ConfigOpt = None, store: StoreOpt = None, cold: ColdOpt = None,
    cluster: ClusterOpt = None, broker: BrokerOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Check every archived record against the local store, byte for byte; exit 0 only if all hold."""
    settings = settings_from(config, store=store, cold_url=cold, cluster=cluster, broker=broker)
    local = LocalStore(settings.store) if settings.store else None
    ct = cold_tier(settings, object_store(settings), writer=False)
    pending = PendingCheck(accepts=topic_filter(settings).accepts, max_delay_ms=int(settings.dispatch.max_delay * 1000),
                           now_ms=SystemClock().now_ms())
    try:
        report = run_verify(ct, local, pending=pending)
    except TieredError as exc:
        fail(f"verify could not read the cold tier: {exc}", 1)
    if as_json:
        print(json.dumps({"ok": report.ok, "queues": report.queues, "segments": report.segments,
                          "records": report.records, "compared_locally": report.compared_locally,
                          "expired_locally": report.expired_locally, "gaps": report.gaps,
                          "problems": report.problems, "orphans": report.orphans,
                          "unarchived": report.unarchived, "pending": report.pending,
                          "missing_prefix": report.missing_prefix, "known_prefixes": report.known_prefixes},
                         indent=2))
    else:
        if report.missing_prefix is not None:
            known = ", ".join(report.known_prefixes) or "none"
            print(f"NO ARCHIVE: nothing under {report.missing_prefix} at {ct.store.url}; "
                  f"cluster/broker prefixes there: {known}")
        print(f"queues {report.queues}, segments {report.segments}, records {report.records}, "
              f"compared byte for byte {report.compared_locally}, local copy expired {report.expired_locally}, "
              f"recorded gaps {report.gaps}, orphans {len(report.orphans)}")
        for where, n in report.unarchived.items():
            if where not in report.pending:
                print(f"not yet archived (within the max delay): {where}: {n} messages")
        for where, what in report.pending.items():
            print(f"NOT ARCHIVED: {where}: {what}")
        for orphan in report.orphans:
            print(f"orphan (no manifest references it): {orphan}")
        for problem in report.problems:
            print(f"DIFFERS: {problem}")
        print("OK" if report.ok else "FAILED")
    if not report.ok:
        raise typer.Exit(1)
