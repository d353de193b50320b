"""Where each queue without a manifest starts, kept across restarts.

A queue's first archive starts where the dispatcher first saw it (the
broker's first offset, its last, or a time: ``start_position``). Data the
broker deletes from there before the first commit is a gap, like any later
one; for that the start must outlive a sidecar restart, or a restart before
the first commit would silently start again from the broker's first offset.

One small JSON file per broker prefix under the state directory, written
with tmp/bak/rename (tiered.format.jsonfile) and only when it changed. Like the
manifest cache it is a cache: a missing or unreadable file means "not known"
(today's behaviour: the start is fixed again now), never a failed round. A
queue's entry is dropped once the queue has a manifest, which says from then
on where it continues, and once the dispatcher no longer watches the queue.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from tiered.errors import CorruptRecordError
from tiered.format.jsonfile import read_json, write_json

log = logging.getLogger(__name__)

QueueKey = tuple[str, int]
VERSION = 1


def starts_path(state_dir: Path, cluster: str, broker: str) -> Path:
    """Next to the manifest cache (``manifests/{cluster}/{broker}``), not in
    it: a cache rebuild empties that directory."""
    return state_dir / "first-starts" / cluster / f"{broker}.json"


class FirstStarts:
    """The fixed first starts of queues without a manifest; persisted to
    ``path`` when one is given (a writer), else held in memory only."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._starts: dict[QueueKey, int] = {}
        # what the file holds; None: unknown or unreadable, so the next save
        # writes it whatever the starts are
        self._saved: dict[QueueKey, int] | None = None
        self._write_failed = False
        if path is not None:
            loaded = self._load(path)
            if loaded is not None:
                self._starts, self._saved = loaded, dict(loaded)

    @staticmethod
    def _load(path: Path) -> dict[QueueKey, int] | None:
        """The recorded starts; {} when there is no file; None when it cannot be read."""
        try:
            doc = read_json(path)
            if doc is None:
                log.info("no first-seen starts recorded at %s; queues not yet archived start from what the "
                         "store holds now", path)
                return {}
            starts = _parse(doc)
        except (CorruptRecordError, OSError, ValueError, TypeError, KeyError) as exc:
            log.warning("first-seen starts at %s unusable (%s); queues not yet archived start again from what "
                        "the store holds now", path, exc, extra={"file": str(path)})
            return None
        log.info("first-seen starts of %d queues not yet archived read from %s", len(starts), path)
        return starts

    def get(self, key: QueueKey) -> int | None:
        return self._starts.get(key)

    def set(self, key: QueueKey, start: int) -> None:
        with self._lock:
            self._starts[key] = start

    def save(self, keep: Callable[[QueueKey], bool]) -> None:
        """Drop the starts ``keep`` rejects (a manifest now says where the
        queue continues, or the queue is no longer watched), then write the
        file if it changed. A failed write is logged (once until it works
        again) and retried at the next save: the starts stay in memory."""
        with self._lock:
            for key in [k for k in self._starts if not keep(k)]:
                del self._starts[key]
            if self.path is None or self._starts == self._saved:
                return
            snapshot = dict(self._starts)
        doc = {"version": VERSION, "starts": [{"topic": t, "queue": q, "offset": o}
                                              for (t, q), o in sorted(snapshot.items())]}
        try:
            write_json(self.path, doc)
        except OSError as exc:
            if not self._write_failed:
                log.error("cannot record the first-seen starts at %s (%s); a restart before a queue's first "
                          "commit would start it again from what the store holds then", self.path, exc,
                          extra={"file": str(self.path)})
            self._write_failed = True
            return
        if self._write_failed:
            log.info("first-seen starts recorded again at %s", self.path)
        self._write_failed = False
        self._saved = snapshot


def _parse(doc: object) -> dict[QueueKey, int]:
    if not isinstance(doc, dict) or doc.get("version") != VERSION:
        raise ValueError(f"not a version {VERSION} document")
    starts: dict[QueueKey, int] = {}
    for item in doc["starts"]:
        topic, queue, offset = item["topic"], item["queue"], item["offset"]
        # bool is an int in Python: refuse it like any other wrong type
        if (not isinstance(topic, str) or not topic or type(queue) is not int or type(offset) is not int
                or queue < 0 or offset < 0):
            raise ValueError(f"bad entry {item!r}")
        starts[(topic, queue)] = offset
    return starts
