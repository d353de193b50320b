"""``tiered status``: per topic/queue local range, archived range, lag, sizes."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from tiered.cli.app import app
from tiered.cli.common import BrokerOpt, ClusterOpt, ColdOpt, ConfigOpt, StoreOpt, settings_from
from tiered.cli.wiring import cold_tier, object_store
from tiered.localstore import LocalStore
from tiered.status import queue_status
from tiered.timeparse import format_time_ms


def _r(lo: int | None, hi: int | None) -> str:
    return "-" if lo is None or hi is None else f"{lo}..{hi}"


@app.command()
def status(
    config: ConfigOpt = None, store: StoreOpt = None, cold: ColdOpt = None,
    cluster: ClusterOpt = None, broker: BrokerOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per queue.")] = False,
) -> None:
    """Print per topic/queue: local and archived offset ranges, lag, archived times, segments, bytes."""
    settings = settings_from(config, store=store, cold_url=cold, cluster=cluster, broker=broker)
    local = LocalStore(settings.store) if settings.store else None
    rows = queue_status(cold_tier(settings, object_store(settings), writer=False), local)
    if as_json:
        for row in rows:
            print(json.dumps(row.to_dict()))
        if any(r.problem for r in rows):
            raise typer.Exit(1)
        return
    table = Table("topic", "queue", "local", "archived", "lag", "oldest archived", "newest archived",
                  "segments", "bytes", "gaps", "ratio")
    for r in rows:
        table.add_row(r.topic, str(r.queue_id), _r(r.local_min_offset, r.local_max_offset),
                      _r(r.archived_first_offset, r.archived_next_offset),
                      "-" if r.lag_messages is None else str(r.lag_messages),
                      format_time_ms(r.oldest_archived_ms), format_time_ms(r.newest_archived_ms),
                      str(r.segments), str(r.nbytes), str(r.gaps),
                      "-" if r.compression_ratio is None else f"{r.compression_ratio:.2f}x")
    Console(width=180).print(table)
    problems = [r for r in rows if r.problem]
    for r in problems:
        print(f"PROBLEM {r.topic}/{r.queue_id}: {r.problem}")
    if problems:
        raise typer.Exit(1)
