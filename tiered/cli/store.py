"""``tiered produce`` and ``tiered inspect``: write and read a local store."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from tiered.cli.app import app, fail
from tiered.cli.output import dumps, error, note, out, table
from tiered.format.codec import Host
from tiered.errors import CorruptRecordError, ExpiredLocallyError
from tiered.store.storewriter import (
    DEFAULT_COMMITLOG_FILE_SIZE,
    DEFAULT_CQ_ENTRIES,
    MessageDraws,
    StoreWriter,
    produce_messages,
)
from tiered.timeparse import format_time_ms, parse_time_ms

StoreOpt = Annotated[Path, typer.Option("--store", help="Broker store directory.")]


@app.command()
def produce(
    store: StoreOpt,
    topic: Annotated[str, typer.Option(help="Topic (%RETRY%group / %DLQ%group for retry / dead-letter).")],
    queues: Annotated[int, typer.Option(min=1, help="Queues to spread messages over, round robin.")] = 4,
    messages: Annotated[int, typer.Option(min=0, help="Messages to append.")] = 1000,
    body_size: Annotated[int, typer.Option(min=0, help="Body bytes per message.")] = 1024,
    keys: Annotated[bool, typer.Option("--keys", help="Give every message a KEYS entry.")] = False,
    tags: Annotated[Optional[str], typer.Option(help="TAGS of every message.")] = None,
    delay_level: Annotated[Optional[int], typer.Option(min=1, max=18, help="Delay level 1..18.")] = None,
    ipv6: Annotated[bool, typer.Option("--ipv6", help="IPv6 born and store hosts.")] = False,
    start_time: Annotated[Optional[str], typer.Option(help="Store time of the first message (ISO 8601).")] = None,
    interval_ms: Annotated[int, typer.Option(min=0, help="Store-time step between messages.")] = 0,
    commitlog_file_size: Annotated[int, typer.Option(help="CommitLog file size for a new store.")] = DEFAULT_COMMITLOG_FILE_SIZE,
    cq_entries: Annotated[int, typer.Option(help="Entries per ConsumeQueue file.")] = DEFAULT_CQ_ENTRIES,
    seed: Annotated[int, typer.Option(help="Seed for the bodies.")] = 0,
) -> None:
    """Append messages to a store in the broker's on-disk format (creating it if needed)."""
    try:
        start_ms = parse_time_ms(start_time) if start_time else None
    except ValueError as exc:
        fail(str(exc), 2)
    store_host = Host("::1", 10911) if ipv6 else Host("127.0.0.1", 10911)
    born_host = Host("::1", 50000) if ipv6 else Host("127.0.0.1", 50000)
    with StoreWriter(store, commitlog_file_size=commitlog_file_size, cq_entries_per_file=cq_entries,
                     store_host=store_host, buffer_bytes=8 << 20) as writer:
        if delay_level is None:
            produce_messages(writer, topic, queues=queues, messages=messages, body_size=body_size, keys=keys,
                             tags=tags, seed=seed, start_ms=start_ms, interval_ms=interval_ms, born_host=born_host)
        else:  # parked in SCHEDULE_TOPIC_XXXX with the delay properties: the general path
            for i, (uid, body) in enumerate(MessageDraws(seed, body_size).messages(messages)):
                ts = start_ms + i * interval_ms if start_ms is not None else None
                writer.put(
                    topic, i % queues, body,
                    tags=tags, keys=[f"key-{i}"] if keys else None, unique_key=uid,
                    store_timestamp=ts, born_timestamp=ts, born_host=born_host, delay_level=delay_level,
                )
    note(f"appended {messages} messages to {topic} in {store}")


@app.command()
def inspect(
    store: StoreOpt,
    topic: Annotated[Optional[str], typer.Option(help="Only this topic.")] = None,
    queue: Annotated[Optional[int], typer.Option(help="Only this queue id.")] = None,
    from_offset: Annotated[Optional[int], typer.Option("--offset", "--from", min=0, help="First queue offset.")] = None,
    limit: Annotated[Optional[int], typer.Option(min=0, help="At most this many records per queue.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per record.")] = False,
) -> None:
    """Print the records of a store, through its ConsumeQueues."""
    # here, not at the top: `tiered produce` imports this module alone and needs no reader
    from tiered.store.batchcq import batch_record_dict
    from tiered.store.localstore import LocalStore

    if not (store / "consumequeue").is_dir() and not (store / "batchconsumequeue").is_dir():
        fail(f"{store}: not a broker store (no consumequeue/ directory)", 2)
    rows: list[tuple[object, ...]] = []
    problems = 0
    with LocalStore(store) as local:
        for t, q in local.queues():
            if (topic is not None and t != topic) or (queue is not None and q != queue):
                continue
            batch = local.is_batch(t)
            rng = local.queue_range(t, q)
            start = rng.min_offset
            if from_offset is not None:  # a queue offset; a BatchCQ queue's records hold several
                start = max(local.batch_entry_of(t, q, from_offset) if batch else from_offset, start)
            try:
                for item in local.iter_queue(t, q, start, max_count=limit):
                    rec = item.record
                    if batch:
                        d = batch_record_dict(rec, local.batch_entry(t, q, item.queue_offset))
                        if as_json:
                            out(dumps(d))
                        rows.extend((t, q, m["queue_offset"], d["commitlog_offset"], d["size"],
                                     format_time_ms(d["store_timestamp"]), m["tags"] or "", " ".join(m["keys"]),
                                     m["body_length"]) for m in d["inner_messages"])
                    elif as_json:
                        out(dumps(rec.to_dict()))
                    else:
                        d = rec.to_dict()
                        rows.append((t, q, item.queue_offset, d["commitlog_offset"], d["size"],
                                     format_time_ms(d["store_timestamp"]), d["tags"] or "", " ".join(d["keys"]),
                                     d["body_length"]))
            except (CorruptRecordError, ExpiredLocallyError) as exc:
                problems += 1
                error(f"{t}/{q}: {exc}")
    if not as_json:
        table(("topic", "queue", "offset", "commitlog", "size", "store time", "tags", "keys", "body"), rows,
              right=("queue", "offset", "commitlog", "size", "body"))
    if problems:
        raise typer.Exit(1)
