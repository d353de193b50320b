"""``tiered status``: per topic/queue local range, archived range, lag, sizes."""

from __future__ import annotations

from typing import Annotated

import typer

from tiered.cli.app import app
from tiered.cli.common import (BrokerOpt, ClusterOpt, ColdOpt, ConfigOpt, StoreOpt, TopicsOpt, settings_from,
                               topic_matcher)
from tiered.cli.consumers import show_positions
from tiered.cli.output import json_lines, out, table
from tiered.cli.wiring import archive_store, cold_tier, topic_filter
from tiered.store.localstore import LocalStore
from tiered.ops.status import queue_status, topic_notes
from tiered.store.survey import survey_store
from tiered.timeparse import format_time_ms

COLUMNS = ("topic", "queue", "local", "archived", "lag", "oldest archived", "newest archived", "segments", "bytes",
           "gaps", "ratio")


def _r(lo: int | None, hi: int | None) -> str:
    return "-" if lo is None or hi is None else f"{lo}..{hi}"


@app.command()
def status(
    config: ConfigOpt = None, store: StoreOpt = None, cold: ColdOpt = None,
    cluster: ClusterOpt = None, broker: BrokerOpt = None, topic: TopicsOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per queue.")] = False,
) -> None:
    """Print per topic/queue: local and archived offset ranges, lag, archived times, segments, bytes.

    Below the table: why each broker topic (and each topic the config leaves
    out) is archived or not, and what in the store tiered does not understand.
    Exit 1 when a queue has a problem or the store holds something unknown."""
    settings = settings_from(config, store=store, cold_url=cold, cluster=cluster, broker=broker)
    local = LocalStore(settings.store) if settings.store else None
    only = topic_matcher(topic)
    archive = cold_tier(settings, archive_store(settings), writer=False)
    survey = survey_store(local.root) if local is not None else None
    topics = topic_filter(settings)
    unreadable = survey.unreadable_topics if survey is not None else frozenset()
    rows = [r for r in queue_status(archive, local, accepts=lambda t: topics.accepts(t) and t not in unreadable)
            if only is None or only(r.topic)]
    seen = {r.topic for r in rows} | set(local.topics() if local is not None else ())
    notes = topic_notes((t for t in seen if only is None or only(t)), topics.verdict)
    findings = survey.findings if survey is not None else ()
    if as_json:
        json_lines(row.to_dict() for row in rows)
        json_lines(n.to_dict() for n in notes)
        json_lines(f.to_dict() for f in findings)
    else:
        table(COLUMNS, ((r.topic, r.queue_id, _r(r.local_min_offset, r.local_max_offset),
                         _r(r.archived_first_offset, r.archived_next_offset), r.lag_messages,
                         format_time_ms(r.oldest_archived_ms), format_time_ms(r.newest_archived_ms),
                         r.segments, r.nbytes, r.gaps,
                         "-" if r.compression_ratio is None else f"{r.compression_ratio:.2f}x") for r in rows),
              right=("queue", "lag", "segments", "bytes", "gaps"))
        for r in rows:
            if r.problem:
                out(f"PROBLEM {r.topic}/{r.queue_id}: {r.problem}")
        for line in [n.line() for n in notes] + [f.line() for f in findings]:
            out(line)
    consumers_ok = local is None or show_positions(local, archive.manifests(), as_json=as_json, only=only)
    if any(r.problem for r in rows) or findings or not consumers_ok:
        raise typer.Exit(1)
