"""Consumer groups' committed offsets, kept in the bucket beside the archive.

One object per group, ``<cluster>/<broker>/_replay.offsets/<group>.json``
(the ``.`` keeps it apart from every topic folder: RocketMQ names hold no
dot; the cleaner and ``verify`` touch only topic folders). Commits are kept
in memory and written in batches (``flush``, every few seconds as the
broker persists its ``consumerOffset.json``, and at shutdown), not once per
commit request.

A flush re-reads the object, lays this process's commits over it and
writes it back only if nobody wrote it meanwhile (``put_if_match``, or
``put_if_absent`` for a new group), retrying on a lost race: a restarted
replay, or several behind one Service, never lose each other's queues.

Replicas read each other's commits when a client asks for a committed
offset (``refresh``: a rebalance handing a queue to a consumer connected to
another replica asks then), at most once a second per group: a queue
committed through another replica is seen once that replica has flushed,
as a broker's slave sees the master's offsets once they are synced.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Callable

from tiered.archive.storage import ObjectStore
from tiered.errors import BadRequestError, CorruptRecordError, ObjectNotFoundError, PreconditionFailedError
from tiered.replay.protocol import INVALID_PARAMETER

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
FOLDER = "_replay.offsets"
# TopicValidator's rule for topic and group names: also keeps keys inside the folder
_NAME = re.compile(r"^[%|a-zA-Z0-9_-]{1,255}$")
_ATTEMPTS = 8
# a rebalance asks for all of a group's queues at once: one read answers them
FRESH_MS = 1000

Queue = tuple[str, int]


def check_name(kind: str, name: str) -> str:
    if not _NAME.match(name):
        raise BadRequestError(f"the {kind} name {name[:80]!r} contains illegal characters", code=INVALID_PARAMETER)
    return name


def encode(group: str, offsets: dict[Queue, int], now_ms: int) -> bytes:
    rows = [{"topic": t, "queue_id": q, "offset": o} for (t, q), o in sorted(offsets.items())]
    doc = {"format_version": FORMAT_VERSION, "group": group, "updated_ms": now_ms, "offsets": rows}
    return json.dumps(doc, indent=1).encode()


def decode(data: bytes, key: str) -> dict[Queue, int]:
    """The offsets of a group's object; CorruptRecordError when it is not one."""
    try:
        doc = json.loads(data)
        version = doc.get("format_version")
        if version == FORMAT_VERSION:
            return {(str(r["topic"]), int(r["queue_id"])): int(r["offset"]) for r in doc["offsets"]}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CorruptRecordError(key, 0, f"not a replay offsets document ({type(exc).__name__})") from None
    raise CorruptRecordError(key, 0, f"format_version {version!r}; this replay reads {FORMAT_VERSION}")


class GroupOffsets:
    """Committed offsets by group. ``refresh`` and ``flush`` reach the bucket
    (call them off the event loop); ``get`` and ``commit`` only memory."""

    def __init__(self, store: ObjectStore, cluster: str, broker: str, *, now_ms: Callable[[], int]) -> None:
        self.store = store
        self.prefix = f"{cluster}/{broker}/{FOLDER}"
        self.now_ms = now_ms
        self._lock = threading.Lock()
        self._known: dict[str, dict[Queue, int]] = {}
        self._read_ms: dict[str, int] = {}  # when each group's object was last read
        self._dirty: dict[str, dict[Queue, int]] = {}  # commits not yet given to a flush
        self._writing: dict[str, dict[Queue, int]] = {}  # commits a flush is writing
        self._reads = threading.Lock()  # one read at a time: a burst of queries waits for the first
        self._during: dict[Queue, int] | None = None  # commits of the group being read, made during the read
        self._reading = ""

    def key(self, group: str) -> str:
        return f"{self.prefix}/{check_name('group', group)}.json"

    def fresh(self, group: str) -> bool:
        """Whether the group's object was read within the last ``FRESH_MS``."""
        with self._lock:
            read = self._read_ms.get(group)
        return read is not None and self.now_ms() - read < FRESH_MS

    def refresh(self, group: str) -> None:
        """Read the group's object, unless read within ``FRESH_MS``: other
        replicas' flushed commits replace what this process knew, except the
        queues it committed itself since (not flushed yet, being written, or
        committed while this read was under way), which are newer."""
        with self._reads:
            if self.fresh(group):
                return
            key = self.key(group)
            with self._lock:
                self._reading, self._during = group, {}
            try:
                stored = decode(self.store.get(key), key)
            except ObjectNotFoundError:
                stored = {}
            finally:
                with self._lock:
                    during, self._reading, self._during = self._during or {}, "", None
            with self._lock:
                mine = {**self._writing.get(group, {}), **self._dirty.get(group, {}), **during}
                self._known[group] = {**stored, **mine}
                self._read_ms[group] = self.now_ms()

    def get(self, group: str, topic: str, queue_id: int) -> int | None:
        with self._lock:
            return self._known.get(group, {}).get((topic, queue_id))

    def committed(self) -> dict[str, dict[Queue, int]]:
        """A copy of every offset this process knows, by group."""
        with self._lock:
            return {group: dict(queues) for group, queues in self._known.items()}

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        self.key(group)  # a name that cannot be a key is refused before it is kept
        with self._lock:
            self._known.setdefault(group, {})[(topic, queue_id)] = offset
            self._dirty.setdefault(group, {})[(topic, queue_id)] = offset
            if self._during is not None and group == self._reading:
                self._during[(topic, queue_id)] = offset

    def flush(self) -> int:
        """Write every group with new commits; returns how many were written.
        A group whose write fails keeps its commits for the next flush."""
        with self._lock:
            batch, self._dirty = self._dirty, {}
            self._writing = batch
        written = 0
        failed: Exception | None = None
        for group, commits in batch.items():
            try:
                self._write(group, commits)
                written += 1
            except Exception as exc:  # kept for the next flush, then raised
                with self._lock:  # newer commits made meanwhile win over these
                    self._dirty[group] = {**commits, **self._dirty.get(group, {})}
                failed = failed or exc
        with self._lock:
            self._writing = {}
        if failed is not None:
            raise failed
        return written

    def _write(self, group: str, commits: dict[Queue, int]) -> None:
        key = self.key(group)
        for _ in range(_ATTEMPTS):
            try:
                data, etag = self.store.get_with_etag(key)
                stored: dict[Queue, int] | None = decode(data, key)
            except ObjectNotFoundError:
                stored, etag = None, ""
            merged = {**(stored or {}), **commits}
            body = encode(group, merged, self.now_ms())
            try:
                if stored is None:
                    self.store.put_if_absent(key, body)
                else:
                    self.store.put_if_match(key, body, etag)
                return
            except PreconditionFailedError:
                log.info("offsets of group %s written by another replay meanwhile: merging again", group)
        raise PreconditionFailedError("put_if_match", key, f"lost the race {_ATTEMPTS} times")
