"""Consumer positions: the broker's ``config/consumerOffset.json``, and where
each committed offset stands against the local store and the archive.

The broker persists ``{"offsetTable": {"topic@group": {0: 122, 1: 116}}}``
through ``X.tmp`` -> ``X`` with the previous ``X`` kept as ``X.bak``. Its
JSON writer (fastjson) leaves the integer map keys unquoted, which strict
JSON rejects; both forms are read here. As the broker's ``ConfigManager``
does, a main file that is missing, empty or corrupt is replaced by the
``.bak`` (with a warning naming both files).

A committed offset is the next offset the group will consume. Against a
queue it is:

- ``local``: at or above the local store's minimum: the broker serves it;
- ``archive_only``: below the local minimum but archived: only the archive
  can serve the group (``tiered cat --group`` does);
- ``lost``: below both the local minimum and the archive's first offset;
- ``unknown``: the queue is not on local disk and the archive holds nothing
  from the offset on.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tiered.errors import CorruptRecordError

if TYPE_CHECKING:
    from tiered.store.localstore import LocalStore
    from tiered.archive.manifest import Manifest

log = logging.getLogger(__name__)

CONSUMER_OFFSET_FILE = "consumerOffset.json"
TOPIC_GROUP_SEPARATOR = "@"

# A JSON string (copied as it is), or an unquoted integer object key (quoted).
_TOKEN = re.compile(r'("(?:[^"\\]|\\.)*")|([{,]\s*)(-?\d+)(\s*:)', re.S)


def _quote_keys(text: str) -> str:
    return _TOKEN.sub(lambda m: m.group(1) or f'{m.group(2)}"{m.group(3)}"{m.group(4)}', text)


@dataclass(frozen=True, kw_only=True, slots=True)
class GroupOffset:
    group: str
    topic: str
    queue_id: int
    offset: int


@dataclass(frozen=True, kw_only=True, slots=True)
class ConsumerOffsets:
    source: Path | None  # the file read (the main one or its .bak); None: neither exists
    offsets: tuple[GroupOffset, ...]
    from_backup: bool = False

    def of_group(self, group: str, topic: str | None = None) -> dict[tuple[str, int], int]:
        return {(o.topic, o.queue_id): o.offset for o in self.offsets
                if o.group == group and (topic is None or o.topic == topic)}


def parse_offset_table(data: bytes, source: str) -> tuple[GroupOffset, ...]:
    """The offsetTable of a consumerOffset.json (quoted or unquoted integer
    keys). Raises CorruptRecordError naming ``source`` when it is not one."""
    try:
        text = data.decode("utf-8")
        if not text.strip():
            raise ValueError("empty")
        doc = json.loads(_quote_keys(text))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise CorruptRecordError(source, 0, f"not a consumer offset file ({type(exc).__name__}: {exc})") from None
    table = doc.get("offsetTable") if isinstance(doc, dict) else None
    if not isinstance(table, dict):
        raise CorruptRecordError(source, 0, "no offsetTable object")
    out: list[GroupOffset] = []
    for key, queues in table.items():
        parts = key.split(TOPIC_GROUP_SEPARATOR)
        if len(parts) != 2 or not isinstance(queues, dict):
            log.warning("%s: entry %r is not topic@group -> {queue: offset}; left out", source, key)
            continue
        topic, group = parts
        for qid, offset in queues.items():
            try:
                out.append(GroupOffset(group=group, topic=topic, queue_id=int(qid), offset=int(offset)))
            except (TypeError, ValueError):
                log.warning("%s: %s queue %r offset %r is not an integer; left out", source, key, qid, offset)
    return tuple(sorted(out, key=lambda o: (o.group, o.topic, o.queue_id)))


def read_consumer_offsets(config_dir: Path) -> ConsumerOffsets:
    """``config_dir/consumerOffset.json``, else its ``.bak`` (warning naming
    both files). Raises CorruptRecordError when a file exists but neither parses."""
    main = config_dir / CONSUMER_OFFSET_FILE
    bak = config_dir / (CONSUMER_OFFSET_FILE + ".bak")
    why: str | None = None
    try:
        return ConsumerOffsets(source=main, offsets=parse_offset_table(main.read_bytes(), str(main)))
    except FileNotFoundError:
        why = "missing"
    except (CorruptRecordError, OSError) as exc:
        why = str(exc)
    try:
        offsets = parse_offset_table(bak.read_bytes(), str(bak))
    except FileNotFoundError:
        if why == "missing":
            return ConsumerOffsets(source=None, offsets=())
        raise CorruptRecordError(str(main), 0, f"unusable ({why}) and no {bak.name} to fall back on") from None
    except (CorruptRecordError, OSError) as exc:
        raise CorruptRecordError(str(main), 0, f"unusable ({why}); the backup {bak} too: {exc}") from None
    log.warning("consumer offsets: %s is %s; read the backup %s instead", main, why, bak,
                extra={"file": str(main), "backup": str(bak)})
    return ConsumerOffsets(source=bak, offsets=offsets, from_backup=True)


class PositionState(str, Enum):
    LOCAL = "local"
    ARCHIVE_ONLY = "archive_only"
    LOST = "lost"
    UNKNOWN = "unknown"


@dataclass(frozen=True, kw_only=True, slots=True)
class ConsumerPosition:
    group: str
    topic: str
    queue_id: int
    committed_offset: int
    local_min_offset: int | None
    local_max_offset: int | None
    archived_first_offset: int | None
    archived_next_offset: int | None
    state: PositionState

    @property
    def archive_only(self) -> bool:
        return self.state is PositionState.ARCHIVE_ONLY

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["state"] = self.state.value
        return d


def classify(committed: int, local: tuple[int, int] | None, archived: tuple[int, int] | None) -> PositionState:
    """Where ``committed`` stands; ``local`` and ``archived`` are [first, next)
    ranges, None when the queue is not there."""
    if local is not None and committed >= local[0]:
        return PositionState.LOCAL
    if archived is not None and archived[0] <= committed < archived[1]:
        return PositionState.ARCHIVE_ONLY
    if local is None and (archived is None or committed >= archived[1]):
        return PositionState.UNKNOWN  # nothing on disk, nothing archived after it
    return PositionState.LOST


def positions(offsets: Iterable[GroupOffset], local: Mapping[tuple[str, int], tuple[int, int]],
              archived: Mapping[tuple[str, int], tuple[int, int]]) -> list[ConsumerPosition]:
    """One row per committed (group, topic, queue) (a pure function: the caller
    reads the local ranges and the manifests)."""
    out = []
    for o in offsets:
        key = (o.topic, o.queue_id)
        lr, ar = local.get(key), archived.get(key)
        out.append(ConsumerPosition(
            group=o.group, topic=o.topic, queue_id=o.queue_id, committed_offset=o.offset,
            local_min_offset=lr[0] if lr else None, local_max_offset=lr[1] if lr else None,
            archived_first_offset=ar[0] if ar else None, archived_next_offset=ar[1] if ar else None,
            state=classify(o.offset, lr, ar)))
    return out


def store_positions(local: LocalStore, archived: Mapping[tuple[str, int], tuple[int, int]]) -> list[ConsumerPosition]:
    """``positions`` for every committed offset of the store at ``local``,
    with the local ranges read now. ``archived``: (topic, queue) -> the
    archive's [first offset, next offset) (from cached manifests)."""
    committed = local.consumer_offsets().offsets
    present = set(local.queues())
    ranges: dict[tuple[str, int], tuple[int, int]] = {}
    for o in committed:
        key = (o.topic, o.queue_id)
        if key in present and key not in ranges:
            # consumers commit message offsets: a BatchCQ queue's are its entries' base offsets
            rng = local.batch_offset_range(*key) if local.is_batch(key[0]) else local.queue_range(*key)
            ranges[key] = (rng.min_offset, rng.max_offset)
    return positions(committed, ranges, archived)


def archived_ranges(manifests: Mapping[tuple[str, int], Manifest]) -> dict[tuple[str, int], tuple[int, int]]:
    """(topic, queue) -> [first archived record's offset, next offset) of queues with data."""
    out = {}
    for k, m in manifests.items():
        if m.segments and m.segments[0].batch:  # a BatchCQ queue: its segments' message offsets
            out[k] = (int(m.segments[0].msg_start or 0), int(m.segments[-1].msg_end or 0))
        elif m.segments:
            out[k] = (m.segments[0].q_start, m.next_offset)
    return out
