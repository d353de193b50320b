"""``tiered status``: per topic/queue local range, archived range, lag, sizes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from typing import Annotated, Any

import typer

from tiered.cli.app import app
from tiered.cli.common import (BrokerModeOpt, BrokerOpt, ClusterOpt, ColdOpt, ConfigOpt, OutputOpt, StoreOpt,
                               TopicsOpt, output_mode, settings_from, topic_matcher)
from tiered.cli.consumers import show_positions
from tiered.cli.output import Col, age, human_bytes, json_lines, paragraph, table
from tiered.cli.wiring import archive_store, cold_tier, topic_filter
from tiered.clock import Clock, SystemClock
from tiered.store.localstore import LocalStore
from tiered.ops.status import QueueStatus, TopicNote, queue_status, topic_notes
from tiered.store.survey import Finding, survey_store

COLUMNS = (Col(name="topic"), Col(name="queue", right=True), Col(name="lag"), Col(name="archived up to"),
           Col(name="local", wide=True), Col(name="segments", right=True, wide=True),
           Col(name="bytes", right=True, wide=True), Col(name="gaps", right=True, wide=True),
           Col(name="compression", wide=True), Col(name="problem", wrap=True))
# text fields of a row that are not what the problem column shows
_NOT_PROBLEMS = frozenset({"topic", "compression"})

def problem_text(row: Any) -> str | None:
    """Whatever a row says is wrong, or why it is as it is: its ``problem``
    first, then any other text field (a reason, a bound being waited for)."""
    texts = [getattr(row, "problem", None)] + [getattr(row, f.name) for f in fields(row)
                                               if f.name not in _NOT_PROBLEMS | {"problem"}]
    waiting = getattr(row, "waiting_confirm_offset", None)
    if waiting is not None:
        texts.append(f"waiting for the cluster to confirm past CommitLog offset {waiting}")
    return "; ".join(t for t in texts if isinstance(t, str) and t) or None


def _lag(r: QueueStatus, now_ms: int) -> str | None:
    if r.lag_messages is None or r.lag_messages == 0:
        return None if r.lag_messages is None else "0"
    return f"{r.lag_messages}" + ("" if r.pending_since_ms is None else f" ({age(now_ms, r.pending_since_ms)})")


def _archived(r: QueueStatus, now_ms: int) -> str | None:
    if r.archived_next_offset is None:
        return None
    when = "" if r.newest_archived_ms is None else f" ({age(now_ms, r.newest_archived_ms)} ago)"
    return f"{r.archived_next_offset}{when}"


def _compression(r: QueueStatus) -> str | None:
    if r.compression is None:
        return None
    return r.compression + ("" if r.compressed_ratio is None else f" {r.compressed_ratio:.2f}x")


def status_rows(rows: list[QueueStatus], now_ms: int) -> list[tuple[Any, ...]]:
    """The cells of :data:`COLUMNS`: ages from ``now_ms``, bytes in binary units."""
    return [(r.topic, r.queue_id, _lag(r, now_ms), _archived(r, now_ms),
             None if r.local_max_offset is None else f"{r.local_min_offset}..{r.local_max_offset}",
             r.segments, human_bytes(r.nbytes), r.gaps, _compression(r), problem_text(r)) for r in rows]


@app.command()
def status(
    config: ConfigOpt = None, store: StoreOpt = None, cold: ColdOpt = None,
    cluster: ClusterOpt = None, broker: BrokerOpt = None, topic: TopicsOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per queue (exact numbers).")] = False,
    wide: Annotated[bool, typer.Option("--wide", help="More columns: local range, segments, bytes, gaps, "
                                                        "compression.")] = False,
    output: OutputOpt = None,
    broker_mode: BrokerModeOpt = None,
) -> None:
    """Per topic/queue: the lag (messages, and the age of the oldest waiting), what is archived (up to which
    offset, how long ago), and the problem that stops a queue; --wide adds ranges and sizes.

    Below the table: why each broker topic (and each topic the config leaves
    out) is archived or not, what in the store tiered does not understand, and
    (controller mode) the confirm offset queues wait at.
    Exit 1 when a queue has a problem or the store holds something unknown."""
    as_json, wide = output_mode(output, as_json=as_json, wide=wide)
    settings = settings_from(config, store=store, cold_url=cold, cluster=cluster, broker=broker,
                             broker_mode=broker_mode)
    local = LocalStore(settings.store, broker_mode=settings.broker_mode) if settings.store else None
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
    mode = local.broker_mode() if local is not None else None
    bound = (f"broker mode {mode.describe()}: the cluster has confirmed CommitLog offset {mode.confirm_offset}"
             if mode is not None and mode.bound_applies else None)
    show(rows, as_json=as_json, wide=wide, clock=SystemClock(), notes=notes, findings=findings,
         lines=[bound] if bound else [])
    consumers_ok = local is None or show_positions(local, archive.manifests(), as_json=as_json, only=only)
    if any(r.problem for r in rows) or findings or not consumers_ok:
        raise typer.Exit(1)


def show(rows: list[QueueStatus], *, as_json: bool, wide: bool, clock: Clock, notes: Sequence[TopicNote] = (),
         findings: Sequence[Finding] = (), lines: Sequence[str] = ()) -> None:
    """The rows as a table (or JSON lines); then why each broker topic is
    archived or not, what in the store is not understood (``findings``) and
    report-level ``lines``, each fitting the terminal as the table does."""
    if as_json:
        json_lines(row.to_dict() for row in rows)
        json_lines(n.to_dict() for n in notes)
        json_lines(f.to_dict() for f in findings)
        return
    table(COLUMNS, status_rows(rows, clock.now_ms()), wide=wide)
    # one line each, wrapped to the terminal as a table's free text is
    said = [n.line() for n in notes] + [f.line() for f in findings] + list(lines)
    for line in said:
        paragraph(line)
