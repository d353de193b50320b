"""Single-writer fencing for a ``{cluster}/{broker}`` prefix.

The lease is one object written only with conditional requests: created
with ``IfNoneMatch: *``, renewed and taken over with ``IfMatch: <etag>``. So
two sidecars can never both believe they hold it after a write: the loser
of any race gets a precondition failure and stops writing.

- Same identity, held by a process that provably no longer runs (a restart
  after a crash: same host and boot, that pid gone or reused): taken over at
  once. A live process of the same identity (``tiered serve`` next to a
  hand-run ``tiered clean``), or one that cannot be checked from here, is
  another writer.
- Another writer: refused, naming it and its expiry, until the lease
  expires, unless ``force_takeover`` is set. An unreadable lease object is
  replaced only with ``force_takeover``.
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
import os
import socket
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

from tiered.clock import Clock, SystemClock
from tiered.errors import FencedError, ObjectNotFoundError, PreconditionFailedError
from tiered.archive.manifest import LEASE
from tiered.archive.storage import ObjectStore
from tiered.timeparse import format_time_ms

log = logging.getLogger(__name__)


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _start_ticks(pid: int) -> int | None:
    """A process's start time (clock ticks since boot), None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    try:
        return int(stat.rsplit(")", 1)[1].split()[19])  # field 22; the name may hold spaces
    except (IndexError, ValueError):
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class Process:
    """One process, told apart from a later one with the same pid."""

    host: str
    pid: int
    boot: str
    start: int | None

    @classmethod
    def this(cls) -> Process:
        return cls(host=socket.gethostname(), pid=os.getpid(), boot=_boot_id(), start=_start_ticks(os.getpid()))

    def alive(self) -> bool | None:
        """Whether this process still runs; None when that cannot be told from
        here (another host, no /proc)."""
        here = Process.this()
        if self.host != here.host or not self.boot or self.boot != here.boot or self.start is None:
            return None
        return _start_ticks(self.pid) == self.start

    def __str__(self) -> str:
        return f"{self.host} pid {self.pid}"


@dataclass(frozen=True)
class Lease:
    owner: str
    epoch: int
    expires_ms: int
    etag: str
    session: str = ""
    process: Process | None = None
    unreadable: bool = False  # the object is there but cannot be parsed

    def to_bytes(self) -> bytes:
        proc = None if self.process is None else {"host": self.process.host, "pid": self.process.pid,
                                                  "boot": self.process.boot, "start": self.process.start}
        return json.dumps({"owner": self.owner, "epoch": self.epoch, "expires_ms": self.expires_ms,
                           "session": self.session, "process": proc, "format_version": "1.0"},
                          sort_keys=True).encode()

    def holder(self) -> str:
        return f"{self.owner!r}" + (f" ({self.process})" if self.process else "")

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
        self.process = Process.this()
        self.lease: Lease | None = None
        # Set once another writer replaced our lease: from then on a live lease
        # of our own identity but another session is someone else's (no
        # ping-pong between two processes configured with one identity).
        self.lost = False
        self._lock = threading.Lock()

    def current(self) -> Lease | None:
        """The lease object as it is in the bucket (None when there is none): for ``tiered lease show``."""
        return self._read()

    def _read(self) -> Lease | None:
        try:
            data, etag = self.store.get_with_etag(self.key)
        except ObjectNotFoundError:
            return None
        try:
            d = json.loads(data)
            p = d.get("process")
            proc = None if not p else Process(host=str(p["host"]), pid=int(p["pid"]), boot=str(p["boot"]),
                                              start=None if p["start"] is None else int(p["start"]))
            return Lease(str(d["owner"]), int(d["epoch"]), int(d["expires_ms"]), etag, str(d.get("session", "")),
                         proc)
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            # held by nobody we know: only force_takeover replaces it (conditionally, on this etag)
            log.error("the lease object %s is unreadable", self.key)
            return Lease("<unreadable lease object>", 0, 2**62, etag, unreadable=True)

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
            new = Lease(self.identity, 1, now + self.ttl_ms, "", self.session, self.process)
            etag = self._write(new, None)
            if etag is None:
                raise FencedError(f"{self.key}: another sidecar created the lease at the same time")
        else:
            mine = current.owner == self.identity
            if current.session != self.session and current.expires_ms > now and not self.force \
                    and not self._crashed_self(current):
                until = "for good (unreadable)" if current.unreadable else f"until {format_time_ms(current.expires_ms)}"
                raise FencedError(
                    f"the cold-tier prefix is held by {current.holder()} {until}; refusing to write. "
                    f"Stop the other writer, wait for the lease to expire, or set force_takeover after "
                    f"making sure it is gone"
                )
            epoch = current.epoch if mine else current.epoch + 1
            new = Lease(self.identity, epoch, now + self.ttl_ms, "", self.session, self.process)
            etag = self._write(new, current.etag)
            if etag is None:
                raise FencedError(f"{self.key}: lost a race for the lease to another sidecar")
            self.lost = False
            if not mine:
                log.warning("took over the write lease from %s (epoch %d)", current.owner, epoch)
        self.lease = Lease(new.owner, new.epoch, new.expires_ms, etag, new.session, self.process)
        return self.lease

    def _crashed_self(self, current: Lease) -> bool:
        """Our own identity, held by a process that provably no longer runs (a
        restart after a crash): taken over at once. A live process with our
        identity (``tiered serve`` next to a hand-run ``tiered dispatch``), or
        one we cannot check, is another writer."""
        if current.owner != self.identity or self.lost or current.process is None:
            return False
        # this very process restarting its writer (one LeaseManager replacing another)
        return current.process == self.process or current.process.alive() is False

    def _fenced(self) -> FencedError:
        self.lease = None
        self.lost = True
        try:
            current = self._read()
        except Exception:  # noqa: BLE001 - only for the message
            current = None
        holder = current.holder() if current else "nobody"
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
            new = Lease(self.identity, lease.epoch, now + self.ttl_ms, "", self.session, self.process)
            etag = self._write(new, lease.etag)
            if etag is None:
                raise self._fenced()
            self.lease = Lease(new.owner, new.epoch, new.expires_ms, etag, new.session, self.process)
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
            ended = Lease(self.identity, lease.epoch, 0, "", self.session, self.process)
            try:
                self.store.put_if_match(self.key, ended.to_bytes(), lease.etag)
            except (PreconditionFailedError, ObjectNotFoundError):
                pass
            self.lease = None
