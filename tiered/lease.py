"""Single-writer fencing for a ``{cluster}/{broker}`` prefix.

The lease is one object written only with conditional requests: created
with ``IfNoneMatch: *``, renewed and taken over with ``IfMatch: <etag>``. So
two sidecars can never both believe they hold it after a write: the loser
of any race gets a precondition failure and stops writing.

- Same identity (a restart after a crash): takes over at once.
- Another identity: refused until the lease expires, unless forced.
- ``epoch`` counts ownership changes; manifests and the local cache record
  it, so a cache written under an older owner is rebuilt from the bucket.
- ``session`` is random per ``LeaseManager``: a conditional write whose
  response was lost and whose retry then failed its precondition is
  recognised as our own (the object holds our session and expiry) instead of
  being mistaken for a takeover. It also tells two processes with the same
  identity apart: the one replaced by a restart is fenced.

Between renewals a writer learns of a takeover through ``check`` (one GET,
which the dispatcher makes before the first commit of a round and then at
most every ``lease_check_s``, never on an idle round). A takeover that lands
between ``check`` and a manifest write is still harmless: manifest commits
are conditional (see ``coldtier``) and data objects are named by their
content's range, so two writers can only ever write the same bytes under the
same key, and at most one manifest update per base wins.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from dataclasses import dataclass

from tiered.clock import Clock, SystemClock
from tiered.errors import CorruptRecordError, FencedError, ObjectNotFoundError, PreconditionFailedError
from tiered.manifest import LEASE
from tiered.storage import ObjectStore
from tiered.timeparse import format_time_ms

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Lease:
    owner: str
    epoch: int
    expires_ms: int
    etag: str
    session: str = ""

    def to_bytes(self) -> bytes:
        return json.dumps({"owner": self.owner, "epoch": self.epoch, "expires_ms": self.expires_ms,
                           "session": self.session, "format_version": "1.0"}, sort_keys=True).encode()

    def same_write(self, other: Lease) -> bool:
        """``other`` (read back) is the very lease we tried to write."""
        return (self.owner, self.epoch, self.expires_ms, self.session) == (
            other.owner, other.epoch, other.expires_ms, other.session)


class LeaseManager:
    def __init__(
        self,
        store: ObjectStore,
        prefix: str,
        identity: str,
        *,
        ttl_s: float = 120.0,
        clock: Clock | None = None,
        force: bool = False,
    ) -> None:
        self.store = store
        self.key = f"{prefix}/{LEASE}"
        self.identity = identity
        self.ttl_ms = int(ttl_s * 1000)
        self.clock = clock or SystemClock()
        self.force = force
        self.session = uuid.uuid4().hex
        self.lease: Lease | None = None
        # Set once another writer replaced our lease: from then on a live lease
        # of our own identity but another session is someone else's (no
        # ping-pong between two processes configured with one identity).
        self.lost = False
        self._lock = threading.Lock()

    def _read(self) -> Lease | None:
        try:
            data, etag = self.store.get_with_etag(self.key)
        except ObjectNotFoundError:
            return None
        try:
            d = json.loads(data)
            return Lease(str(d["owner"]), int(d["epoch"]), int(d["expires_ms"]), etag, str(d.get("session", "")))
        except (ValueError, KeyError, TypeError):
            raise CorruptRecordError(self.key, 0, "unreadable lease object") from None

    def _write(self, new: Lease, etag: str | None) -> str | None:
        """Write ``new`` conditionally; its etag, or None when the condition
        failed and the object is not our write landed by an earlier attempt."""
        try:
            if etag is None:
                return self.store.put_if_absent(self.key, new.to_bytes())
            return self.store.put_if_match(self.key, new.to_bytes(), etag)
        except (PreconditionFailedError, ObjectNotFoundError):
            current = self._read()
            if current is not None and new.same_write(current):
                return current.etag  # our request landed; its response was lost
            return None

    def acquire(self) -> Lease:
        """Take the lease, or raise FencedError naming the current holder."""
        with self._lock:
            return self._acquire()

    def _acquire(self) -> Lease:
        now = self.clock.now_ms()
        current = self._read()
        if current is None:
            new = Lease(self.identity, 1, now + self.ttl_ms, "", self.session)
            etag = self._write(new, None)
            if etag is None:
                raise FencedError(f"{self.key}: another sidecar created the lease at the same time")
        else:
            mine = current.owner == self.identity
            foreign = not mine or (self.lost and current.session != self.session)
            if foreign and current.expires_ms > now and not self.force:
                raise FencedError(
                    f"the cold-tier prefix is held by writer {current.owner!r} until "
                    f"{format_time_ms(current.expires_ms)}; refusing to write. Stop the other sidecar, "
                    f"wait for the lease to expire, or set force_takeover after making sure it is gone"
                )
            epoch = current.epoch if mine else current.epoch + 1
            new = Lease(self.identity, epoch, now + self.ttl_ms, "", self.session)
            etag = self._write(new, current.etag)
            if etag is None:
                raise FencedError(f"{self.key}: lost a race for the lease to another sidecar")
            self.lost = False
            if not mine:
                log.warning("took over the write lease from %s (epoch %d)", current.owner, epoch)
        self.lease = Lease(new.owner, new.epoch, new.expires_ms, etag, new.session)
        return self.lease

    def _fenced(self) -> FencedError:
        self.lease = None
        self.lost = True
        try:
            current = self._read()
        except Exception:  # noqa: BLE001 - only for the message
            current = None
        holder = f"{current.owner!r}" if current else "nobody"
        return FencedError(f"lost the write lease (now held by {holder}); stopped writing")

    def ensure(self) -> Lease:
        """Before writing: hold a lease with at least half its TTL left,
        renewing only then, so an idle round makes no request.

        Raises FencedError once the lease was lost; the caller must then stop
        writing (``acquire`` again to try to win it back)."""
        with self._lock:
            lease = self.lease
            now = self.clock.now_ms()
            if lease is not None and lease.expires_ms - now > self.ttl_ms // 2:
                return lease
            if lease is None:
                return self._acquire()
            new = Lease(self.identity, lease.epoch, now + self.ttl_ms, "", self.session)
            etag = self._write(new, lease.etag)
            if etag is None:
                raise self._fenced()
            self.lease = Lease(new.owner, new.epoch, new.expires_ms, etag, new.session)
            return self.lease

    def check(self) -> Lease:
        """One GET proving nobody replaced the lease since we last wrote it
        (a forced takeover, or a restart of our identity elsewhere), then
        ``ensure``. Called before commits (see the module's text), so a writer
        that lost its lease stops soon rather than at its next renewal."""
        with self._lock:
            before = self.lease
        if before is None:
            return self.ensure()
        current = self._read()
        with self._lock:
            now = self.lease
            known = {lease.etag for lease in (before, now) if lease is not None}
            if current is None or (current.etag not in known and not (now and now.same_write(current))):
                self.lease = None
                self.lost = True
                holder = f"{current.owner!r}" if current else "nobody"
                raise FencedError(f"lost the write lease (now held by {holder}); stopped writing")
        return self.ensure()

    def release(self) -> None:
        """Expire our lease now so a replacement need not wait (clean shutdown)."""
        with self._lock:
            lease = self.lease
            if lease is None:
                return
            ended = Lease(self.identity, lease.epoch, 0, "", self.session)
            try:
                self.store.put_if_match(self.key, ended.to_bytes(), lease.etag)
            except (PreconditionFailedError, ObjectNotFoundError):
                pass
            self.lease = None
