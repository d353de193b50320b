"""``restore`` of BatchCQ queues: ``batchconsumequeue/{topic}/{qid}/`` files.

RocketMQ's BatchConsumeQueue has no filler entries (``recover`` stops at
the first entry that is not written, and truncates everything after it), so
a restored queue's entries start at the beginning of its first file, named
by its start byte as the archive's first restored entry lies in it (the
original name whenever the archive starts at a file boundary, as it does
unless the broker deleted part of a file's records first). Each entry is
what ``putBatchMessagePositionInfo`` writes for the restored record (see
``tiered.store.batchcq``). A recorded gap cannot be filled: its entries are
left out and the gap reported, the base offsets keeping their values.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from tiered.format.codec import Record
from tiered.format.innerbatch import base_offset, batch_size
from tiered.store.batchcq import BATCH_DIR, BCQ_ENTRY_SIZE, BatchEntry

if TYPE_CHECKING:
    from tiered.ops.restore import _Files
    from tiered.store.localstore import LocalStore


class BatchQueueWriter:
    """One restored BatchConsumeQueue, written in entry order."""

    def __init__(self, files: _Files, root: Path, topic: str, queue_id: int, first: int) -> None:
        self.dir = root / BATCH_DIR / topic / str(queue_id)
        self.files = files
        size = files.file_size
        self.start = first * BCQ_ENTRY_SIZE // size * size  # the first file's name
        self.next = first  # the archive's entry the next one written stands for
        self._written = 0  # entries written
        self._file_end = -1

    def add_record(self, rec: Record, phys: int, tags: int, entry: int) -> None:
        """The entry of ``rec`` (archive entry ``entry``), restored at CommitLog ``phys``."""
        at = self.start + self._written * BCQ_ENTRY_SIZE
        if at >= self._file_end:
            self.files.open(self.dir / f"{at:020d}", 0)
            self._file_end = at + self.files.file_size
        self.files.write(BatchEntry(commitlog_offset=phys, size=rec.size, tags_code=tags,
                                    store_timestamp=rec.store_timestamp, base_offset=base_offset(rec),
                                    batch_size=batch_size(rec)).pack())
        self._written += 1
        self.next = entry + 1


def check_batch(local: LocalStore, archived: Iterator[tuple[int, Record, int]], topic: str, queue_id: int) -> int:
    """A restored BatchCQ queue read back through ``LocalStore`` against the
    archive, entry after entry (restored entries may sit at other positions
    than the archive's, never in another order): the record bytes but the
    physical offset, the tags code, and base offset and batch size as the
    broker derives them. Returns entries compared."""
    from tiered.ops.restore import _PHYS, _PHYS_AT, RestoreCheckError

    name = f"{topic}/{queue_id}"
    rng = local.queue_range(topic, queue_id)
    mine = iter(local.iter_queue(topic, queue_id, rng.min_offset))
    compared = 0
    for offset, rec, tags in archived:
        item = next(mine, None)
        if item is None:
            raise RestoreCheckError(f"{name}: entry {offset} missing from the restored store")
        raw = bytearray(item.record.raw)
        _PHYS.pack_into(raw, _PHYS_AT, rec.physical_offset)
        entry = local.batch_entry(topic, queue_id, item.queue_offset)
        if raw != rec.raw or item.tags_code != tags or entry is None \
                or (entry.base_offset, entry.batch_size) != (base_offset(rec), batch_size(rec)):
            raise RestoreCheckError(f"{name}: entry {offset}: restored record differs from the archive")
        compared += 1
    extra = next(mine, None)
    if extra is not None:
        raise RestoreCheckError(f"{name}: restored entry {extra.queue_offset} is not in the archive")
    return compared
