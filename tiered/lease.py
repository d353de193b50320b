"""Single-writer fencing for a ``{cluster}/{broker}`` prefix.

The lease is one object written only with conditional requests: created
with ``IfNoneMatch: *``, renewed and taken over with ``IfMatch: <etag>``. So
two sidecars can never both believe they hold it after a write: the loser
of any race gets a precondition failure and stops writing.

- Same identity (a restart after a crash): takes over at once.
- Another identity: refused until the lease expires, unless forced.
- ``epoch`` counts ownership changes; manifests and the local cache record
  it, so a cache written under an older owner is rebuilt from the bucket.

Manifest commits are conditional too (see ``coldtier``), so even a writer
paused past its lease cannot overwrite a newer manifest.
"""

from __future__ import annotations

import json
import logging
import threading
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

    def to_bytes(self) -> bytes:
        return json.dumps({"owner": self.owner, "epoch": self.epoch, "expires_ms": self.expires_ms,
                           "format_version": "1.0"}, sort_keys=True).encode()


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
        self.lease: Lease | None = None
        self._lock = threading.Lock()

    def _read(self) -> Lease | None:
        try:
            data, etag = self.store.get_with_etag(self.key)
        except ObjectNotFoundError:
            return None
        try:
            d = json.loads(data)
            return Lease(str(d["owner"]), int(d["epoch"]), int(d["expires_ms"]), etag)
        except (ValueError, KeyError, TypeError):
            raise CorruptRecordError(self.key, 0, "unreadable lease object") from None

    def acquire(self) -> Lease:
        """Take the lease, or raise FencedError naming the current holder."""
        with self._lock:
            return self._acquire()

    def _acquire(self) -> Lease:
        now = self.clock.now_ms()
        current = self._read()
        if current is None:
            new = Lease(self.identity, 1, now + self.ttl_ms, "")
            try:
                etag = self.store.put_if_absent(self.key, new.to_bytes())
            except PreconditionFailedError:
                raise FencedError(f"{self.key}: another sidecar created the lease at the same time") from None
        else:
            mine = current.owner == self.identity
            if not mine and current.expires_ms > now and not self.force:
                raise FencedError(
                    f"the cold-tier prefix is held by writer {current.owner!r} until "
                    f"{format_time_ms(current.expires_ms)}; refusing to write. Stop the other sidecar, "
                    f"wait for the lease to expire, or set force_takeover after making sure it is gone"
                )
            epoch = current.epoch if mine else current.epoch + 1
            new = Lease(self.identity, epoch, now + self.ttl_ms, "")
            try:
                etag = self.store.put_if_match(self.key, new.to_bytes(), current.etag)
            except PreconditionFailedError:
                raise FencedError(f"{self.key}: lost a race for the lease to another sidecar") from None
            if not mine:
                log.warning("took over the write lease from %s (epoch %d)", current.owner, epoch)
        self.lease = Lease(new.owner, new.epoch, new.expires_ms, etag)
        return self.lease

    def ensure(self) -> Lease:
        """Before writing: hold a lease with at least half its TTL left,
        renewing only then, so an idle round makes no request."""
        with self._lock:
            lease = self.lease
            now = self.clock.now_ms()
            if lease is not None and lease.expires_ms - now > self.ttl_ms // 2:
                return lease
            if lease is None:
                return self._acquire()
            new = Lease(self.identity, lease.epoch, now + self.ttl_ms, "")
            try:
                etag = self.store.put_if_match(self.key, new.to_bytes(), lease.etag)
            except (PreconditionFailedError, ObjectNotFoundError):
                self.lease = None
                current = self._read()
                holder = current.owner if current else "nobody"
                raise FencedError(f"lost the write lease (now held by {holder!r}); stopped writing") from None
            self.lease = Lease(new.owner, new.epoch, new.expires_ms, etag)
            return self.lease

    def release(self) -> None:
        """Expire our lease now so a replacement need not wait (clean shutdown)."""
        with self._lock:
            lease = self.lease
            if lease is None:
                return
            ended = Lease(self.identity, lease.epoch, 0, "")
            try:
                self.store.put_if_match(self.key, ended.to_bytes(), lease.etag)
            except (PreconditionFailedError, ObjectNotFoundError):
                pass
            self.lease = None
