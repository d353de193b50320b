"""``tiered ls``, ``tiered config show``, ``tiered lease show`` / ``tiered lease release``."""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Any, Optional

import typer

from tiered.cli.app import app, fail
from tiered.cli.common import (BrokerOpt, ClusterOpt, ColdOpt, ConfigOpt, OutputOpt, StoreOpt, TopicsOpt, WideOpt,
                               output_mode, settings_from, topic_matcher)
from tiered.cli.output import Col, human_bytes, note, print_json, table
from tiered.cli.wiring import archive_store, lease, object_store
from tiered.clock import SystemClock
from tiered.config import Settings
from tiered.configsources import explain
from tiered.errors import PreconditionFailedError
from tiered.archive.lease import Lease
from tiered.query.batchread import is_batch, message_bounds
from tiered.query.reader import Archive
from tiered.timeparse import format_time_ms

JsonOpt = Annotated[bool, typer.Option("--json", help="JSON instead of a table.")]

config_app = typer.Typer(help="The effective configuration.", no_args_is_help=True)
lease_app = typer.Typer(help="The write lease of a cluster/broker prefix.", no_args_is_help=True)
app.add_typer(config_app, name="config")
app.add_typer(lease_app, name="lease")


@app.command("ls")
def ls(
    config: ConfigOpt = None, cold: ColdOpt = None, cluster: ClusterOpt = None, broker: BrokerOpt = None,
    topic: TopicsOpt = None, as_json: JsonOpt = False, wide: WideOpt = False, output: OutputOpt = None,
) -> None:
    """The archive's queues: offset range, last store time, bytes (one row per queue); --wide adds the first
    store time, segments and gaps.

    Without --cluster/--broker every cluster and broker under the cold-tier root is listed."""
    as_json, wide = output_mode(output, as_json=as_json, wide=wide)
    settings = settings_from(config, cold_url=cold, cluster=cluster, broker=broker)
    given = settings.model_fields_set
    archive = Archive(archive_store(settings), cluster=settings.cluster if "cluster" in given else None,
                      broker=settings.broker if "broker" in given else None)
    refs = archive.queues(topic_matcher(topic))
    manifests = archive.manifests(refs)
    rows: list[dict[str, Any]] = []
    for ref in refs:
        m = manifests.get(ref)
        if m is None:
            continue
        segs = m.segments
        rows.append({
            "cluster": ref.cluster, "broker": ref.broker, "topic": ref.topic, "queue_id": ref.queue_id,
            # a BatchCQ queue: its messages' queue offsets, as RocketMQ counts them
            **dict(zip(("first_offset", "next_offset"),
                       message_bounds(m) if is_batch(m) else (m.first_offset, m.next_offset))),
            "first_stored": format_time_ms(min((s.min_store_ms for s in segs), default=None)),
            "last_stored": format_time_ms(max((s.max_store_ms for s in segs), default=None)),
            "segments": len(segs), "bytes": sum(s.nbytes for s in segs), "gaps": len(m.gaps)})
    if as_json:
        for row in rows:
            print_json(row)
        return
    many = len({(r["cluster"], r["broker"]) for r in rows}) > 1
    cols = [*([Col(name="broker")] if many else []), Col(name="topic", keep=True), Col(name="queue", right=True),
            Col(name="offsets"), Col(name="first stored", wide=True), Col(name="last stored"),
            Col(name="segments", right=True, wide=True), Col(name="bytes", right=True),
            Col(name="gaps", right=True, wide=True)]
    table(cols, ([*([f"{r['cluster']}/{r['broker']}"] if many else []), r["topic"], r["queue_id"],
                  f"{r['first_offset']}..{r['next_offset']}", r["first_stored"], r["last_stored"], r["segments"],
                  human_bytes(r["bytes"]), r["gaps"]] for r in rows), wide=wide)
    if not rows:
        note(f"no archived queue at {settings.cold_url}")


@config_app.command("reference")
def config_reference() -> None:
    """Every setting: its default, what it accepts, its TIERED_* variable and what it does (Markdown; the
    text of docs/configuration.md)."""
    from tiered.configref import reference

    print(reference(), end="")


@config_app.command("show")
def config_show(
    config: ConfigOpt = None, store: StoreOpt = None, cold: ColdOpt = None,
    cluster: ClusterOpt = None, broker: BrokerOpt = None, as_json: JsonOpt = False,
) -> None:
    """Every effective setting, where it comes from (command line, env TIERED_*, file and line, default);
    secrets masked."""
    flags = {"store": store, "cold_url": cold, "cluster": cluster, "broker": broker}
    settings = settings_from(config, **flags)
    rows = explain(settings, flags=flags, config_file=config)
    if as_json:
        for r in rows:
            print_json({"key": r.key, "value": r.value, "source": r.source})
        return
    table((Col(name="key"), Col(name="value", wrap=True), Col(name="source")),
          ((r.key, "null" if r.value is None else r.value, r.source) for r in rows))


def _lease_row(settings: Settings, current: Lease | None, now_ms: int) -> dict[str, Any]:
    prefix = f"{settings.cluster}/{settings.broker}"
    if current is None:
        return {"prefix": prefix, "held": False, "owner": None}
    p = current.process
    return {"prefix": prefix, "held": current.expires_ms > now_ms and not current.unreadable,
            "owner": current.owner, "epoch": current.epoch, "expires": format_time_ms(current.expires_ms),
            "unreadable": current.unreadable,
            "process": None if p is None else {"host": p.host, "pid": p.pid}}


@lease_app.command("show")
def lease_show(
    config: ConfigOpt = None, store: StoreOpt = None, cold: ColdOpt = None, cluster: ClusterOpt = None,
    broker: BrokerOpt = None, as_json: JsonOpt = False,
) -> None:
    """Who holds the write lease of the cluster/broker prefix, and until when."""
    settings = settings_from(config, store=store, cold_url=cold, cluster=cluster, broker=broker)
    current = lease(settings, object_store(settings)).current()
    row = _lease_row(settings, current, SystemClock().now_ms())
    if as_json:
        print_json(row)
        return
    if current is None:
        print(f"{row['prefix']}: no lease (nobody has written here, or the lease object was deleted)")
        return
    state = "held" if row["held"] else ("unreadable" if current.unreadable else "expired")
    table(("prefix", "state", "owner", "process", "epoch", "expires"),
          [(row["prefix"], state, current.owner, str(current.process or "-"), current.epoch, row["expires"])])


@lease_app.command("release")
def lease_release(
    config: ConfigOpt = None, store: StoreOpt = None, cold: ColdOpt = None, cluster: ClusterOpt = None,
    broker: BrokerOpt = None,
    force: Annotated[bool, typer.Option("--force", help="Release a lease that is still live (its holder is fenced "
                                                        "at its next write).")] = False,
    owner: Annotated[Optional[str], typer.Option("--owner", help="Only if this owner holds it.")] = None,
) -> None:
    """End the write lease now, so that another sidecar can take over without waiting for its expiry.

    A live lease is released only with --force: its holder stops writing at its next check."""
    settings = settings_from(config, store=store, cold_url=cold, cluster=cluster, broker=broker)
    manager = lease(settings, object_store(settings))
    current = manager.current()
    prefix = f"{settings.cluster}/{settings.broker}"
    if current is None:
        note(f"{prefix}: no lease to release")
        return
    if owner is not None and current.owner != owner:
        fail(f"{prefix}: the lease is held by {current.owner!r}, not {owner!r}; nothing released", 1)
    now = SystemClock().now_ms()
    if current.expires_ms <= now and not current.unreadable:
        note(f"{prefix}: the lease of {current.owner!r} already expired at {format_time_ms(current.expires_ms)}")
        return
    if not force:
        fail(f"{prefix}: the lease is live, held by {current.holder()} until {format_time_ms(current.expires_ms)}; "
             f"stop that process, or pass --force", 1)
    ended = replace(current, expires_ms=0)
    if current.unreadable:
        manager.store.delete_many([manager.key])
    else:
        # conditional on what we read: a holder renewing at this instant wins, and we say so
        try:
            manager.store.put_if_match(manager.key, ended.to_bytes(), current.etag)
        except PreconditionFailedError:
            fail(f"{prefix}: the lease changed while releasing it (renewed or taken over); nothing released", 1)
    note(f"{prefix}: released the lease of {current.owner!r} (epoch {current.epoch})")
