"""Consumer positions in ``tiered status`` and ``tiered cat --group``."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from tiered.cli.app import err_console, fail
from tiered.cli.output import Col, json_lines, out, table
from tiered.format.codec import Record, entry_offset
from tiered.config import Settings
from tiered.store.consumeroffsets import ConsumerPosition, PositionState, archived_ranges, store_positions
from tiered.errors import ExpiredLocallyError, TieredError
from tiered.store.localstore import LocalStore
from tiered.archive.manifest import Manifest
from tiered.format.innerbatch import inner_records
from tiered.query import batchread
from tiered.query.reader import ColdReader, QueueRef


def show_positions(local: LocalStore, manifests: Mapping[tuple[str, int], Manifest], as_json: bool,
                   only: Callable[[str], bool] | None = None) -> bool:
    """Print where each group's committed offset stands; False when the
    consumer offsets cannot be read (printed as a PROBLEM)."""
    try:
        rows = [p for p in store_positions(local, archived_ranges(manifests)) if only is None or only(p.topic)]
    except TieredError as exc:
        out(f"PROBLEM consumer offsets: {exc}")
        return False
    if as_json:
        json_lines({"kind": "consumer", **p.to_dict()} for p in rows)
        return True
    if rows:
        out("consumer positions:")
        table((Col(name="group"), Col(name="topic", keep=True), "queue", "committed", "local", "archived",
               Col(name="state", wrap=True)),
              ((p.group, p.topic, p.queue_id, p.committed_offset, _r(p.local_min_offset, p.local_max_offset),
                _r(p.archived_first_offset, p.archived_next_offset), _state(p)) for p in rows),
              right=("queue", "committed"))
    return True


def _state(p: ConsumerPosition) -> str:
    if p.state is PositionState.ARCHIVE_ONLY and p.local_min_offset is not None:
        return f"{p.state.value} ({p.local_min_offset - p.committed_offset} behind local)"
    return p.state.value


def _r(lo: int | None, hi: int | None) -> str:
    return "-" if lo is None or hi is None else f"{lo}..{hi}"


def group_records(reader: ColdReader, local: LocalStore | None, position: ConsumerPosition,
                  ref: QueueRef | None, on_note: Callable[[str], None] | None = None) -> Iterator[tuple[str, Record]]:
    """("archive" | "local", record) of one queue from the committed offset on:
    the archive for what is no longer on local disk, then the local store.
    Each offset comes once, in order."""
    offset = position.committed_offset
    local_min = position.local_min_offset
    if ref is not None and (local_min is None or offset < local_min):
        m = reader.archive.manifest(ref)
        batch = batchread.is_batch(m)  # a BatchCQ queue: offsets count the messages in its records
        first = batchread.message_bounds(m)[0] if batch and m is not None else m.first_offset if m else 0
        if m is not None and offset < first and on_note is not None:
            on_note(f"{position.topic}/{position.queue_id}: offsets {offset}..{first - 1} are no longer "
                    f"archived; starting at {first}")
        stop = local_min  # None: the whole archive
        archived = (batchread.iter_messages(reader, ref, m, offset) if batch and m is not None else
                    reader.iter_queue(ref, offset, None if stop is None else max(0, stop - offset)))
        for rec in archived:
            at = entry_offset(rec, ref.topic)  # an LMQ queue's records carry their parent's offsets
            if stop is not None and at >= stop:
                break
            yield "archive", rec
            offset = at + 1
        if stop is not None:
            offset = max(offset, stop)
    if local is None or local_min is None:
        return
    offset = max(offset, local_min)
    try:
        if local.is_batch(position.topic):
            entry = local.batch_entry_of(position.topic, position.queue_id, offset)
            for item in local.iter_queue(position.topic, position.queue_id, entry):
                yield from (("local", msg) for msg in inner_records(item.record) if msg.queue_offset >= offset)
            return
        for item in local.iter_queue(position.topic, position.queue_id, offset):
            yield "local", item.record
    except ExpiredLocallyError as exc:
        # the broker deleted it while we read: say so, the archive has it (read again)
        raise TieredError(f"{position.topic}/{position.queue_id}: {exc}; run again to read it from the archive") \
            from None


def err(message: str) -> None:
    err_console.print(f"[yellow]{message}[/yellow]")


def cat_group(reader: ColdReader, local: LocalStore, *, group: str, topic: str, queue: int | None,
              count: int | None, emit: Callable[[QueueRef, Record, str], None], default_ref: Callable[[int], QueueRef],
              ) -> int:
    """Emit ``group``'s records of ``topic`` from its committed offsets on,
    queue by queue; returns how many. Raises TieredError when the group has
    no committed offset for the topic."""
    committed = local.consumer_offsets()
    mine = [o for o in committed.offsets if o.group == group and o.topic == topic
            and (queue is None or o.queue_id == queue)]
    if not mine:
        where = committed.source or local.root / "config" / "consumerOffset.json"
        raise TieredError(f"group {group!r} has no committed offset for {topic}"
                          f"{'' if queue is None else f' queue {queue}'} in {where}")
    refs = {o.queue_id: reader.queue(topic, o.queue_id) for o in mine}
    archived = archived_ranges({(topic, q): m for q, ref in refs.items()
                                if ref is not None and (m := reader.archive.manifest(ref)) is not None})
    rows = [p for p in store_positions(local, archived) if p.group == group and p.topic == topic
            and (queue is None or p.queue_id == queue)]
    n = 0
    for p in rows:
        ref = refs.get(p.queue_id)
        for source, rec in group_records(reader, local, p, ref, on_note=err):
            if count is not None and n >= count:
                return n
            emit(ref or default_ref(p.queue_id), rec, source)
            n += 1
    return n


def cat_group_command(settings: Settings, make_reader: Callable[..., ColdReader], *, group: str, topic: str,
                      queue: int | None, count: int | None, skip_corrupt: bool,
                      emit: Callable[[QueueRef, Record, str], None]) -> None:
    """``tiered cat --group``: the store comes from --store, TIERED_STORE or the config file."""
    if settings.store is None:
        fail("--group reads the committed offsets from the broker store: give --store", 2)
    reader = make_reader(settings, skip_corrupt=skip_corrupt)
    with LocalStore(settings.store, broker_mode=settings.broker_mode) as local:
        try:
            cat_group(reader, local, group=group, topic=topic, queue=queue, count=count, emit=emit,
                      default_ref=lambda q: QueueRef(settings.cluster, settings.broker, topic, q))
        except TieredError as exc:
            fail(str(exc), 1)
    if reader.skipped:
        err(f"skipped {reader.skipped} corrupt or missing archived records")
