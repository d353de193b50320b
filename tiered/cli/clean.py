"""``tiered clean``: one cleaner pass, or what it would do (``--dry-run``)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from tiered.cleaner import CleanReport
from tiered.cli.app import app, fail
from tiered.cli.common import (BrokerOpt, ClusterOpt, ColdOpt, ConfigOpt, OnceOpt, StoreOpt, TopicsOpt, settings_from,
                               topic_matcher)
from tiered.cli.output import print_json
from tiered.cli.wiring import cold_tier, lease, make_cleaner, object_store, setup_logging
from tiered.errors import TieredError
from tiered.store.localstore import LocalStore
from tiered.timeparse import format_time_ms


def _size(n: int) -> str:
    v = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if v < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1024
    return str(n)


def _pending(report: CleanReport) -> int:
    """Objects of merged-away segments whose deferred deletion was (would be) done."""
    plans = (report.plan.changes if report.plan else ()) if report.dry_run else [o.plan for o in report.committed]
    return sum(len(p.pending_keys()) for p in plans)


def _as_dict(report: CleanReport) -> dict[str, Any]:
    return {
        "dry_run": report.dry_run, "ok": report.ok, "now_ms": report.now_ms,
        "expired": [{"topic": p.topic, "queue_id": p.queue_id, "segments": len(p.expire),
                     "messages": p.expired_messages, "bytes": p.expired_bytes, "gaps": len(p.drop_gaps),
                     "start_offset": min([s.q_start for s in p.expire] + [g.q_start for g in p.drop_gaps]),
                     "end_offset": max([s.q_end for s in p.expire] + [g.q_end for g in p.drop_gaps]),
                     "retention_hours": p.retention.hours if p.retention else None,
                     "retention_source": p.retention.source if p.retention else None,
                     "keys": [k for s in p.expire for k in s.keys()]}
                    for p in report.expired()],
        "merged": [{"topic": p.topic, "queue_id": p.queue_id, "segments": len(r.segments),
                    "start_offset": r.q_start, "end_offset": r.q_end, "bytes": r.nbytes}
                   for p, r in report.merges()],
        "skewed": [{"topic": q.topic, "queue_id": q.queue_id, "start_offset": s.segment.q_start,
                    "end_offset": s.segment.q_end, "max_store_ms": s.segment.max_store_ms, "reason": s.verdict.value}
                   for q, s in (report.plan.skewed if report.plan else ())],
        "pending_deleted": _pending(report),
        "orphan_scan": report.orphan_scan, "orphans": report.orphans, "unmanaged": report.unmanaged,
        "unaccounted": report.unaccounted, "retention_unknown": report.retention_unknown,
        "leftovers": report.leftovers,
        "busy": [f"{t}/{q}" for t, q in report.busy], "conflicts": report.conflicts,
        "errors": report.errors, "fenced": report.fenced,
        "deleted_objects": report.deleted_objects, "delete_requests": report.delete_requests,
    }


def _print(report: CleanReport) -> None:
    would = "would " if report.dry_run else ""
    for p in report.expired():
        r = p.retention
        newest = max((s.max_store_ms for s in p.expire), default=None)
        lo = min([s.q_start for s in p.expire] + [g.q_start for g in p.drop_gaps])
        hi = max([s.q_end for s in p.expire] + [g.q_end for g in p.drop_gaps])
        print(f"{would}expire {p.topic}/{p.queue_id}: {len(p.expire)} segments, {p.expired_messages} messages, "
              f"{_size(p.expired_bytes)}, offsets [{lo},{hi}), newest {format_time_ms(newest)}"
              + (f", {len(p.drop_gaps)} gaps" if p.drop_gaps else "")
              + (f"; retention {r.hours:g} h ({r.source})" if r else ""))
    for p, run in report.merges():
        print(f"{would}merge {p.topic}/{p.queue_id}: {len(run.segments)} segments -> 1, offsets "
              f"[{run.q_start},{run.q_end}), {_size(run.nbytes)}")
    for q, s in (report.plan.skewed if report.plan else ()):
        why = "in the future" if s.verdict.value == "future" else "not real times"
        print(f"keep {q.topic}/{q.queue_id}: segment [{s.segment.q_start},{s.segment.q_end}) store times {why} "
              f"(newest {s.segment.max_store_ms}); never deleted")
    if report.orphan_scan:
        for key in report.orphans:
            print(f"{would}delete orphan {key}")
        for key in report.leftovers:
            print(f"{would}delete temporary file of an interrupted write {key}")
        for where, n in report.unmanaged.items():
            print(f"keep {where}: {n} data objects but no manifest (not collected; dispatch or "
                  f"`tiered repair` rebuilds it)")
        for where, keys in report.unaccounted.items():
            print(f"keep {where}: {len(keys)} unreferenced objects not of this manifest's history "
                  f"(not collected; see `tiered repair`), e.g. {keys[0]}")
    for topic, why in sorted(report.retention_unknown.items()):
        print(f"keep {topic}: retention unknown ({why}); nothing expired")
    for busy_topic, busy_queue in report.busy:
        print(f"busy {busy_topic}/{busy_queue}: skipped this pass")
    for c in report.conflicts:
        print(f"conflict: {c}")
    pending = _pending(report)
    print(f"{'dry run: ' if report.dry_run else ''}{would}expire {report.expired_segments} segments "
          f"({_size(report.expired_bytes)}), {would}merge {report.merged_segments} segments, "
          f"{would}delete {pending} replaced objects and "
          f"{len(report.orphans) if report.orphan_scan else 0} orphans")


@app.command()
def clean(
    config: ConfigOpt = None, store: StoreOpt = None, cold: ColdOpt = None,
    cluster: ClusterOpt = None, broker: BrokerOpt = None,
    topic: TopicsOpt = None,
    once: OnceOpt = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print what would be deleted and merged; change nothing.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """One cleaner pass: expire archived segments past retention, merge small segments, collect orphans.

    With --topic only those topics are expired and merged (orphans, which belong to no topic, are left)."""
    settings = settings_from(config, store=store, cold_url=cold, cluster=cluster, broker=broker)
    setup_logging(settings.log.format, settings.log.level)
    local = None
    if settings.store is not None:
        if not (settings.store / "config").is_dir() and not (settings.store / "consumequeue").is_dir():
            fail(f"invalid configuration: store: {settings.store} is not a broker store", 2)
        local = LocalStore(settings.store, broker_mode=settings.broker_mode)
    objects = object_store(settings)
    # A dry run writes nothing: no lease, no local manifest cache.
    ct = cold_tier(settings, objects, writer=not dry_run)
    lease_manager = None if dry_run else lease(settings, objects)
    cleaner = make_cleaner(settings, ct, local, lease_manager=lease_manager)
    try:
        report = cleaner.run_pass(dry_run=dry_run, orphans=True, topics=topic_matcher(topic), last=True)
    finally:
        if lease_manager is not None and lease_manager.lease is not None:
            try:
                lease_manager.release()  # a one-shot run: a replacement need not wait
            except TieredError:
                pass
    if as_json:
        print_json(_as_dict(report))
    else:
        _print(report)
        for where, error in report.errors.items():
            print(f"ERROR {where}: {error}")
    if report.fenced:
        fail(report.fenced, 1)
    if report.errors:
        raise typer.Exit(1)
