"""``tiered dispatch`` and ``tiered verify``."""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated

import typer

from tiered.dispatcher import Dispatcher
from tiered.cli.app import app, fail
from tiered.cli.common import (BrokerModeOpt, BrokerOpt, ClusterOpt, ColdOpt, ConfigOpt, OnceOpt, StoreOpt, TopicsOpt,
                               settings_from, topic_matcher)
from tiered.cli.failures import fail_with
from tiered.cli.output import note, print_json, progress
from tiered.cli.wiring import archive_store, cold_tier, make_dispatcher, setup_logging, topic_filter
from tiered.config import Settings
from tiered.errors import TieredError
from tiered.store.localstore import LocalStore
from tiered.clock import Clock, SystemClock
from tiered.ops.verify import PendingCheck
from tiered.ops.verify import verify as run_verify


# what "older than the max delay" is measured against; tests put a ManualClock here
CLOCK: Clock = SystemClock()


def _require_store(settings: Settings) -> LocalStore:
    if settings.store is None:
        fail("invalid configuration: store: required (--store DIR)", 2)
    if not (settings.store / "consumequeue").is_dir():
        fail(f"invalid configuration: store: {settings.store} is not a broker store (no consumequeue/)", 2)
    return LocalStore(settings.store, broker_mode=settings.broker_mode)


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
    cluster: ClusterOpt = None, broker: BrokerOpt = None, topic: TopicsOpt = None,
    once: OnceOpt = False, broker_mode: BrokerModeOpt = None,
    all_pending: Annotated[bool, typer.Option("--all", help="Upload everything pending, ignoring thresholds.")] = False,
) -> None:
    """One archive round over every eligible queue ('tiered serve' runs rounds on a schedule).

    With --topic only those topics (exact names, also system topics, or shell patterns)."""
    flags: dict[str, object] = {"store": store, "cold_url": cold, "cluster": cluster, "broker": broker,
                                "broker_mode": broker_mode}
    if all_pending:
        flags.update({"dispatch.upload_bytes": 1, "dispatch.max_delay": 0.001})
    if topic:
        flags["topics.include"] = list(topic)
    settings = settings_from(config, **flags)
    setup_logging(settings.log.format, settings.log.level)
    local = _require_store(settings)
    with progress("archiving", unit="bytes") as bar:
        dispatcher = make_dispatcher(settings, local, on_bytes=bar.advance)
        dispatcher.options = replace(dispatcher.options, round_budget_s=float("inf"))
        try:
            dispatcher.start()
            if bar.enabled:
                bar.set_total(_backlog_bytes(dispatcher))
            result = dispatcher.run_round()
        except TieredError as exc:
            fail_with(exc, 1)
        finally:
            if dispatcher.started and dispatcher.lease is not None:
                try:
                    dispatcher.lease.release()  # a one-shot run: a replacement need not wait
                except TieredError:
                    pass
    note(f"archived {result.messages} messages ({result.nbytes} bytes) in {result.segments} segments "
         f"over {result.queues} queues; gaps {result.gaps}; "
         + (f"still pending {result.lag_messages}" if result.lag_messages else "nothing pending"))
    mode = local.broker_mode()
    if result.lag_messages and mode.bound_applies:
        note(f"broker mode {mode.describe()}: records ending past the confirmed CommitLog offset "
             f"{mode.confirm_offset} wait for the cluster" + (f" ({mode.problem})" if mode.problem else ""))
    for where, error in result.errors.items():
        note(f"ERROR {where}: {error}")
    if result.fenced:
        fail(result.fenced, 1)
    if result.errors:
        raise typer.Exit(1)


@app.command()
def verify(
    config: ConfigOpt = None, store: StoreOpt = None, cold: ColdOpt = None,
    cluster: ClusterOpt = None, broker: BrokerOpt = None, topic: TopicsOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    broker_mode: BrokerModeOpt = None,
) -> None:
    """Check every archived record against the local store, byte for byte; exit 0 only if all hold."""
    settings = settings_from(config, store=store, cold_url=cold, cluster=cluster, broker=broker,
                             broker_mode=broker_mode)
    local = LocalStore(settings.store, broker_mode=settings.broker_mode) if settings.store else None
    ct = cold_tier(settings, archive_store(settings), writer=False)
    only = topic_matcher(topic)
    archived_topics = topic_filter(settings).accepts
    pending = PendingCheck(accepts=(lambda t: archived_topics(t) and only(t)) if only else archived_topics,
                           max_delay_ms=int(settings.dispatch.max_delay * 1000), now_ms=CLOCK.now_ms())
    with progress("verifying", unit="bytes") as bar:

        def advance(nbytes: int, total: int) -> None:
            bar.set_total(total)
            bar.advance(nbytes)

        try:
            report = run_verify(ct, local, pending=pending, topics=only, on_segment=advance)
        except TieredError as exc:
            fail_with(exc, 1, prefix="verify could not read the cold tier: ")
    if as_json:
        print_json({"ok": report.ok, "queues": report.queues, "segments": report.segments,
                    "records": report.records, "compared_locally": report.compared_locally,
                    "expired_locally": report.expired_locally, "gaps": report.gaps,
                    "problems": report.problems, "orphans": report.orphans,
                    "unarchived": report.unarchived, "pending": report.pending,
                    "waiting_confirm": report.waiting_confirm,
                    "missing_prefix": report.missing_prefix, "known_prefixes": report.known_prefixes})
    else:
        if report.missing_prefix is not None:
            known = ", ".join(report.known_prefixes) or "none"
            print(f"NO ARCHIVE: nothing under {report.missing_prefix} at {ct.store.url}; "
                  f"cluster/broker prefixes there: {known}")
        print(f"queues {report.queues}, segments {report.segments}, records {report.records}, "
              f"compared byte for byte {report.compared_locally}, local copy expired {report.expired_locally}, "
              f"recorded gaps {report.gaps}, orphans {len(report.orphans)}")
        for where, n in report.unarchived.items():
            if where in report.pending:
                continue
            if where in report.waiting_confirm:
                print(f"not yet archived, waiting for the cluster to confirm (confirmed CommitLog offset "
                      f"{report.waiting_confirm[where]}): {where}: {n} messages")
            elif where in report.within_delay:
                print(f"not yet archived (within the max delay): {where}: {n} messages")
            else:
                print(f"not yet archived: {where}: {n} messages")
        for where, what in report.pending.items():
            print(f"NOT ARCHIVED: {where}: {what}")
        for orphan in report.orphans:
            print(f"orphan (no manifest references it): {orphan}")
        for problem in report.problems:
            print(f"DIFFERS: {problem}")
        print("OK" if report.ok else "FAILED")
    if not report.ok:
        raise typer.Exit(1)
