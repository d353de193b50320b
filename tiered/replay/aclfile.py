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

``--acl`` may name a directory, as a broker reads every ``.yml`` and
``.yaml`` file under ``conf/acl`` (``PlainPermissionManager.getAllAclFiles``)
and merges them: the global white addresses of all, and each access key
from the first file that defines it (a repeat is logged and skipped, as the
broker does). Files are read in path order (the broker's order is the file
system's listing); names starting with a dot are skipped, which keeps a
Kubernetes Secret volume's ``..data`` copies from being read twice. A file
with no data is skipped, as by the broker.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

from tiered.errors import AclFileError
from tiered.replay.acl import NO_DATA, Account, Acl
from tiered.replay.frame import Command

log = logging.getLogger(__name__)

# AclFileWatchService.WATCH_INTERVAL
WATCH_S = 5.0
RELOADED = "reloaded"
REJECTED = "rejected"


class AclFile:
    """The rules of an ACL file or directory; ``check`` always uses the
    newest usable ones."""

    def __init__(self, path: Path) -> None:
        """Read ``path``; AclFileError when it cannot be used (start-up fails)."""
        self.path = path
        contents = self._read()
        self.acl = self._parse(contents, empty_ok=True)
        self._seen = _digest(contents)

    def check(self, req: Command, host: str) -> None:
        self.acl.check(req, host)

    def reload_if_changed(self) -> str | None:
        """Read the file again: None when its content is what was last seen,
        RELOADED when its new rules now apply, REJECTED when it changed but
        cannot be used (the rules before it stay)."""
        error: AclFileError | None = None
        try:
            contents = self._read()
            seen = _digest(contents)
        except AclFileError as exc:  # gone or unreadable: perhaps mid-replace; reported once
            contents, seen, error = [], f"unreadable: {exc.reason}", exc
        if seen == self._seen:
            return None
        self._seen = seen
        if error is None:
            try:
                self.acl = self._parse(contents, empty_ok=False)
            except AclFileError as exc:
                error = exc
        if error is not None:
            log.warning("ACL file not reloaded, the rules read before stay: %s", error)
            return REJECTED
        acl = self.acl
        log.info("ACL file %s reloaded: %d accounts, %d global white addresses", self.path, len(acl.accounts),
                 len(acl.global_white))
        return RELOADED

    def _read(self) -> list[tuple[Path, bytes]]:
        """Each file's path and bytes: the one file, or a directory's."""
        files = _acl_files(self.path) if self.path.is_dir() else [self.path]
        try:
            return [(f, f.read_bytes()) for f in files]
        except OSError as exc:
            raise AclFileError(str(exc.filename or self.path), type(exc).__name__) from None

    def _parse(self, contents: list[tuple[Path, bytes]], *, empty_ok: bool) -> Acl:
        """One file's rules; a directory's merged as the broker merges them.
        An empty file alone has no account (start-up) or is refused (a
        reload: the broker skips it, keeping what it had); in a directory it
        is skipped."""
        if not self.path.is_dir():
            (path, data), = contents
            return Acl.parse(data, path, empty_ok=empty_ok)
        accounts: dict[str, Account] = {}
        white = []
        for path, data in contents:
            try:
                one = Acl.parse(data, path, empty_ok=False)
            except AclFileError as exc:
                if exc.reason != NO_DATA:
                    raise
                log.warning("ACL file %s has no data: skipped", path)
                continue
            white.extend(one.global_white)
            for key, account in one.accounts.items():
                if key in accounts:
                    log.warning("access key %s is repeated in %s: the first file's account stays", key, path)
                    continue
                accounts[key] = account
        return Acl(accounts, white)


def _acl_files(directory: Path) -> list[Path]:
    """The ``.yml`` and ``.yaml`` files under ``directory``, in path order,
    names starting with a dot (and directories so named) left out."""
    found = []
    for root, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found += [Path(root, f) for f in files if f.endswith((".yml", ".yaml")) and not f.startswith(".")]
    return sorted(found)


def _digest(contents: list[tuple[Path, bytes]]) -> str:
    sha = hashlib.sha256()
    for path, data in contents:  # a file renamed or moved is a change too
        sha.update(str(path).encode() + b"\0" + len(data).to_bytes(8, "big") + data)
    return sha.hexdigest()


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
