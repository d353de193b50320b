"""``tiered restore``: write a broker store directory from the archive."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from tiered.cli.app import app, fail
from tiered.cli.common import BrokerOpt, ClusterOpt, ColdOpt, ConfigOpt, settings_from
from tiered.cli.output import out, print_json, progress
from tiered.cli.wiring import object_store
from tiered.errors import TieredError
from tiered.query.reader import ColdReader
from tiered.store.indexfile import DEFAULT_ENTRIES, DEFAULT_HASH_SLOTS
from tiered.ops.restore import (
    DEFAULT_COMMITLOG_FILE_SIZE,
    DEFAULT_CQ_ENTRIES,
    RestoreCheckError,
    RestoreOptions,
    TargetNotEmptyError,
    check_target,
    restore as run_restore,
)
from tiered.timeparse import parse_time_ms


@app.command()
def restore(
    to: Annotated[Path, typer.Option("--to", help="Target store directory: must be empty or absent.")],
    topic: Annotated[Optional[list[str]], typer.Option("--topic", help="Only this topic (repeatable).")] = None,
    since: Annotated[Optional[str], typer.Option("--since", help="Records stored at or after (ISO 8601 or epoch ms).")] = None,
    until: Annotated[Optional[str], typer.Option("--until", help="Records stored at or before (ISO 8601 or epoch ms).")] = None,
    commitlog_file_size: Annotated[int, typer.Option(min=4096, help="CommitLog file size: the broker's mappedFileSizeCommitLog.")] = DEFAULT_COMMITLOG_FILE_SIZE,
    cq_entries: Annotated[int, typer.Option(min=1, help="Entries per ConsumeQueue file: the broker's mappedFileSizeConsumeQueue / 20.")] = DEFAULT_CQ_ENTRIES,
    bcq_entries: Annotated[int, typer.Option(min=1, help="Entries per BatchConsumeQueue file: the broker's mapperFileSizeBatchConsumeQueue / 46.")] = DEFAULT_CQ_ENTRIES,
    no_index: Annotated[bool, typer.Option("--no-index", help="Write no index/ (a broker with messageIndexEnable=false).")] = False,
    index_hash_slots: Annotated[int, typer.Option(min=1, help="Hash slots per index file: the broker's maxHashSlotNum.")] = DEFAULT_HASH_SLOTS,
    index_entries: Annotated[int, typer.Option(min=2, help="Entries per index file: the broker's maxIndexNum.")] = DEFAULT_ENTRIES,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as one JSON object.")] = False,
    config: ConfigOpt = None, cold: ColdOpt = None, cluster: ClusterOpt = None, broker: BrokerOpt = None,
) -> None:
    """Write a broker store (commitlog/, consumequeue/, batchconsumequeue/, index/, config/topics.json) from the archive,
    then check it record by record against the archive. Exit 1 on any problem."""
    try:
        check_target(to)  # before anything else: a non-empty target is never touched
    except TargetNotEmptyError as exc:
        fail(str(exc), 1)
    settings = settings_from(config, cold_url=cold, cluster=cluster, broker=broker)
    given = settings.model_fields_set
    try:
        options = RestoreOptions(
            commitlog_file_size=commitlog_file_size, cq_entries_per_file=cq_entries, bcq_entries_per_file=bcq_entries,
            topics=frozenset(topic) if topic else None, index=not no_index,
            index_hash_slots=index_hash_slots, index_entries=index_entries,
            since_ms=parse_time_ms(since) if since else None, until_ms=parse_time_ms(until) if until else None)
    except ValueError as exc:
        fail(str(exc), 2)
    reader = ColdReader(object_store(settings), cluster=settings.cluster if "cluster" in given else None,
                        broker=settings.broker if "broker" in given else None)
    with progress("restoring", unit="messages") as bar:
        try:
            result, checked = run_restore(reader, to, options, progress=lambda n, _b: bar.set_completed(n),
                                          planned=lambda plan: bar.set_total(plan.messages))
        except RestoreCheckError as exc:
            fail(f"restored store differs from the archive, do not start a broker on {to}: {exc}", 1)
        except (TieredError, OSError) as exc:
            fail(f"restore into {to} failed (the directory is incomplete: empty it before retrying): {exc}", 1)
    plan = result.plan
    report = {
        "target": str(to), "cluster": plan.cluster, "broker": plan.broker, "queues": len(plan.queues),
        "topics": sorted(plan.read_queue_nums), "messages": result.messages, "bytes": result.nbytes,
        "checked": checked, "commitlog_start": plan.commitlog_start, "commitlog_end": result.commitlog_end,
        "gaps_as_fillers": [{"topic": t, "queue": q, "from": a, "to": b} for t, q, a, b in result.filler_gaps],
        "index": {"files": list(result.index_files), "keys": result.index_entries},
        "offsets": {f"{q.ref.topic}/{q.ref.queue_id}": [q.first, q.end] for q in plan.queues},
    }
    if as_json:
        print_json(report)
        return
    out(f"restored {result.messages} messages ({result.nbytes} bytes) of {len(plan.queues)} queues of "
          f"{plan.cluster}/{plan.broker} into {to}; all {checked} checked against the archive")
    if result.index_files:
        out(f"index: {result.index_entries} keys in {len(result.index_files)} file(s) under {to / 'index'}")
    out(f"CommitLog {plan.commitlog_start}..{result.commitlog_end}; queue offsets as archived:")
    for q in plan.queues:
        out(f"  {q.ref.topic}/{q.ref.queue_id}: {q.first}..{q.end}")
    for t, qid, a, b in result.filler_gaps:
        out(f"WARNING {t}/{qid}: offsets {a}..{b - 1} were a recorded gap in the archive, restored as filler entries")
