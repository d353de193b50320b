"""When ``{cluster}/{broker}/_catalog.json`` is written.

The catalog is a hint (docs/design.md section 3): readers find the archived
queues with one GET of it (``tiered.query.reader.Archive.queues``), a scan
prunes queues by its ranges (``tiered.query.scan._kept_segments``), a
cleaner without the store reads the retention the dispatcher recorded in it,
and a cold start names the queues to load from it. The manifests stay the
truth for everything else. So a catalog may lag the manifests in what a
reader cannot get wrong from it, and must not in the rest:

- *written at once* (the next ``refresh_catalog`` call, the end of the round
  that committed): when it would be wrong, not just old: a queue it does not
  list (a new queue, in the round that first commits it; or one found in
  the bucket), a retention table that changed, a queue whose first offset
  or oldest store time went *down* (a scan prunes a queue whose catalog
  first offset lies past the query's end, or whose oldest time lies past
  its end; both only grow with appends and expiry, but a broker clock
  stepped back stores older times later), what the bucket's catalog says
  being unknown (a cache rebuilt by a LIST, an older state directory), or
  the last write having failed (retried at the next call, and the round
  that failed reports it);
- *refreshed at most every ``refresh_s``*: its ranges (next offset,
  segments, bytes, newest time, generation), which only grow and which no
  reader prunes by, once a commit changed them.

So in steady state a segment costs no catalog write (bench/dispatch.py,
tests/archive/test_catalog_refresh.py). A writer keeps a copy of what it
last wrote beside its manifest cache, so a restart knows what the bucket's
catalog says without asking (a queue committed just before a crash, whose
catalog write never happened, is then written at the first call).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

from tiered.archive.manifest import Catalog, CatalogEntry, Manifest
from tiered.errors import CorruptRecordError, FormatVersionError

log = logging.getLogger(__name__)

QueueKey = tuple[str, int]

#: How long the catalog's ranges may lag the manifests by default (dispatch.catalog_refresh).
DEFAULT_REFRESH_S = 300.0


class CatalogKeeper:
    """What the bucket's catalog says (as last written or read) and which
    queues changed since; decides whether a catalog write is due. Thread-safe:
    commits of many threads mark queues."""

    def __init__(self, refresh_s: float = DEFAULT_REFRESH_S, copy: Path | None = None) -> None:
        self.refresh_s = refresh_s
        self.copy = copy  # a writer's local copy of the catalog it last wrote
        self._lock = threading.Lock()
        self._said: dict[QueueKey, CatalogEntry] | None = None  # None: unknown
        self._said_retention: dict[str, tuple[float, str]] = {}
        self._said_ms = 0
        self._changed: set[QueueKey] = set()
        self._retry = False

    def reset(self, catalog: Catalog | None, *, keep_copy: bool = False) -> None:
        """What the bucket's catalog says now (None: unknown, so the next
        call writes it as soon as there is a manifest); the local copy says
        the same from now on (``keep_copy``: it is where ``catalog`` came from)."""
        with self._lock:
            self._changed.clear()
            self._retry = False
            if catalog is None:
                self._said = None
                self._said_retention = {}
                self._said_ms = 0
            else:
                self._take(catalog)
        if self.copy is not None and not keep_copy:
            if catalog is None:
                self.copy.unlink(missing_ok=True)
            else:
                self._save(catalog.to_bytes())

    def load_copy(self, known: Mapping[QueueKey, Manifest]) -> None:
        """At a start from the local cache: what this writer last wrote, and
        the cached queues it did not list (a crash before the write)."""
        catalog = None
        if self.copy is not None:
            try:
                catalog = Catalog.from_bytes(self.copy.read_bytes(), str(self.copy))
            except (OSError, CorruptRecordError, FormatVersionError):
                catalog = None  # none (an older state directory) or torn: unknown, written at the next call
        self.reset(catalog, keep_copy=True)
        if catalog is not None:
            self.changed(*(k for k in known if k not in (self._said or {})))

    def changed(self, *keys: QueueKey) -> None:
        """These queues' manifests changed (a commit, a fetch that found one)."""
        with self._lock:
            self._changed.update(keys)

    def due(self, cached: Callable[[QueueKey], Manifest | None], any_queue: Callable[[], bool],
            retention: dict[str, tuple[float, str]] | None, now_ms: int, *, last: bool = False) -> str | None:
        """Why the catalog must be written now, None when it need not.
        ``cached`` is a queue's manifest as the writer knows it; nothing here
        walks every queue (a round calls this whatever it committed).
        ``last``: no later call will come (a one-shot ``tiered clean``), so
        ranges that changed are written now, not when due: what changed is
        known to this process only."""
        with self._lock:
            if self._retry:
                return "the last catalog write failed"
            if self._said is None:
                return "what the bucket's catalog says is unknown" if any_queue() else None
            if retention is not None and retention != self._said_retention:
                return "the retention table changed"
            for key in self._changed:
                m = cached(key)
                said = self._said.get(key)
                if m is None:
                    continue
                if said is None:
                    return f"queue {key[0]}/{key[1]} is not listed"
                if m.first_offset < said.first_offset:
                    return f"queue {key[0]}/{key[1]}'s first offset went down"
                if m.min_store_ms is not None and said.min_store_ms is not None and m.min_store_ms < said.min_store_ms:
                    return f"queue {key[0]}/{key[1]}'s oldest store time went down"
            if self._changed and last:
                return "its ranges changed, and no later pass will refresh them"
            if self._changed and now_ms - self._said_ms >= self.refresh_s * 1000:
                return "its ranges are due for a refresh"
            return None

    def taking(self) -> set[QueueKey]:
        """The changed queues a write now covers (given back by ``failed``)."""
        with self._lock:
            taken, self._changed = self._changed, set()
            return taken

    def written(self, catalog: Catalog, data: bytes) -> None:
        with self._lock:
            self._retry = False
            self._take(catalog)
        if self.copy is not None:
            self._save(data)

    def _save(self, data: bytes) -> None:
        assert self.copy is not None
        # no fsync: a copy lost or torn by a power cut reads as unknown (the
        # next call writes the catalog), never as wrong
        self.copy.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.copy.with_name(self.copy.name + ".tmp")
        tmp.write_bytes(data)
        tmp.replace(self.copy)

    def failed(self, taken: set[QueueKey]) -> None:
        with self._lock:
            self._retry = True
            self._changed |= taken

    def _take(self, catalog: Catalog) -> None:
        self._said = {(q.topic, q.queue_id): q for q in catalog.queues}
        self._said_retention = dict(catalog.retention)
        self._said_ms = catalog.updated_ms
