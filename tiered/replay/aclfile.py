"""The ``--acl`` file, read again when it changes.

A RocketMQ broker watches ``plain_acl.yml`` (``AclFileWatchService``, every
5 s) and reloads it when its modification time changes
(``PlainPermissionManager.load``); an empty file it skips, keeping what it
had. Replay does the same on its own timer, but compares the file's content
(a SHA-256) rather than its time: a Kubernetes Secret is updated by swapping
a symbolic link, and a rewrite within the file system's time granularity
would be missed. A file that no longer parses keeps the rules read before,
and is reported once per change: a warning naming the file (and the entry,
never a value of it) and ``tiered_replay_acl_reloads_total{outcome}``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

from tiered.errors import AclFileError
from tiered.replay.acl import Acl
from tiered.replay.frame import Command

log = logging.getLogger(__name__)

# AclFileWatchService.WATCH_INTERVAL
WATCH_S = 5.0
RELOADED = "reloaded"
REJECTED = "rejected"


class AclFile:
    """The rules of an ACL file; ``check`` always uses the newest usable ones."""

    def __init__(self, path: Path) -> None:
        """Read ``path``; AclFileError when it cannot be used (start-up fails)."""
        self.path = path
        data = self._read()
        self.acl = Acl.parse(data, path)
        self._seen = _digest(data)

    def check(self, req: Command, host: str) -> None:
        self.acl.check(req, host)

    def reload_if_changed(self) -> str | None:
        """Read the file again: None when its content is what was last seen,
        RELOADED when its new rules now apply, REJECTED when it changed but
        cannot be used (the rules before it stay)."""
        error: AclFileError | None = None
        try:
            data = self._read()
            seen = _digest(data)
        except AclFileError as exc:  # gone or unreadable: perhaps mid-replace; reported once
            data, seen, error = b"", f"unreadable: {exc.reason}", exc
        if seen == self._seen:
            return None
        self._seen = seen
        if error is None:
            try:
                self.acl = Acl.parse(data, self.path, empty_ok=False)
            except AclFileError as exc:
                error = exc
        if error is not None:
            log.warning("ACL file not reloaded, the rules read before stay: %s", error)
            return REJECTED
        acl = self.acl
        log.info("ACL file %s reloaded: %d accounts, %d global white addresses", self.path, len(acl.accounts),
                 len(acl.global_white))
        return RELOADED

    def _read(self) -> bytes:
        try:
            return self.path.read_bytes()
        except OSError as exc:
            raise AclFileError(str(self.path), type(exc).__name__) from None


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def watch(acl: AclFile, run: Callable[[Callable[[], str | None]], Awaitable[str | None]],
                count: Callable[[str], None], *, every_s: float = WATCH_S,
                sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
    """Reload ``acl`` when it changes, every ``every_s``, until cancelled.
    ``run`` runs the file read off the event loop; ``count`` gets each
    reload's outcome. Nothing that happens here stops the server."""
    while True:
        await sleep(every_s)
        try:
            outcome = await run(acl.reload_if_changed)
        except Exception:  # a bug of ours: logged, the rules in force stay and watching goes on
            log.exception("ACL file %s not reloaded", acl.path)
            continue
        if outcome is not None:
            count(outcome)
