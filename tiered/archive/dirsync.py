"""The directories of ``file://`` writes: created once, made durable once per
change, shared by every writer thread.

A write makes its object durable by fsyncing the file, then the directory
holding its name (and every directory it had to create, in its parent):
a manifest committed afterwards must never name an object a power loss could
take back. Two things here make that cheaper without weakening it:

* Group commit. A directory fsync covers every change made in the directory
  before the fsync *started*. Writers that change the same directory at the
  same time (1,000 new queue directories under one topic directory, four
  upload threads) wait for one fsync started after their change instead of
  each running its own. An fsync already running when a writer arrives may
  have started before the writer's change, so it never counts for it.
* Known directories. A directory this process made durable (created, or
  found and synced in its parent once) is remembered, so creating the next
  one below it stops there instead of walking up with a stat per level. The
  memory is a hint, never trusted for correctness: a remembered directory
  that was removed since (by the cleaner, or by hand) makes ``mkdir`` fail,
  and the walk is made again on the disk.
* New directories are synced after the file written into them (``prepare``
  then ``settle``), still before the rename that names it: the file's fsync
  has usually committed their entries already on a journaling file system.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_KNOWN_MAX = 1 << 16  # directories remembered (2 per queue): a few MiB at most


class _State:
    __slots__ = ("started", "done", "running", "waiting")

    def __init__(self) -> None:
        self.started = 0  # fsyncs started, numbered from 1
        self.done = 0  # the number of the last fsync that succeeded
        self.running = False
        self.waiting = 0  # writers inside sync() for this directory


class Directories:
    """Group-committed directory fsyncs and the directories known to exist,
    for one store root. Thread-safe; one per ``FileStore`` (per process)."""

    def __init__(self, root: Path | None = None, fsync: Callable[[Path], None] | None = None) -> None:
        self._root = root  # the store's root: it and what is above, when they exist, are trusted
        # looked up at each call, not bound here: the durability tests wrap os.fsync
        self._fsync = fsync or (lambda d: fsync_dir(d))
        self._cond = threading.Condition()
        self._states: dict[str, _State] = {}
        self._known: set[str] = set()

    def sync(self, directory: Path) -> None:
        """Return once an fsync of ``directory`` that started after this call
        has succeeded: every change the caller made in it before calling is
        durable. Raises the OSError of the fsync this caller ran itself."""
        key = str(directory)
        with self._cond:
            st = self._states.setdefault(key, _State())
            st.waiting += 1
            target = st.started + 1  # the next fsync to start is the first that covers our change
            try:
                while st.done < target:
                    if not st.running:
                        st.running = True
                        st.started += 1
                        mine = st.started
                        break
                    self._cond.wait()
                else:
                    return  # another writer's fsync, started after our change, covered it
            finally:
                st.waiting -= 1
                if not st.waiting and not st.running:
                    self._states.pop(key, None)  # nobody inside: no state kept per directory
        ok = False
        try:
            self._fsync(directory)
            ok = True
        finally:
            with self._cond:
                st.running = False
                if ok:
                    st.done = mine  # one fsync at a time per directory: numbers complete in order
                if not st.waiting:
                    self._states.pop(key, None)
                # on failure a waiter starts the next fsync itself (its target is not done)
                self._cond.notify_all()

    def waiting(self, directory: Path) -> int:
        """Writers waiting in ``sync`` for ``directory`` (tests synchronise on it)."""
        with self._cond:
            st = self._states.get(str(directory))
            return st.waiting if st is not None else 0

    def known(self, directory: Path) -> bool:
        """Whether this process made ``directory`` durable (a hint: it may
        have been removed since, which the write then finds)."""
        return str(directory) in self._known

    def ensure(self, directory: Path) -> None:
        """Create ``directory`` and its missing parents, each made durable in
        its parent before returning: a rename into a directory whose own entry
        a power loss could undo would not be durable either."""
        self.settle(self.prepare(directory))

    def prepare(self, directory: Path) -> list[Path]:
        """Create ``directory`` and its missing parents without syncing them;
        return what ``settle`` must make durable before a name inside them
        counts. Split so a writer can fsync its file first: on a journaling
        file system that commit usually carries the new directories too, and
        their fsyncs then find nothing left to do."""
        self._known.discard(str(directory))  # called because it is missing: never trust the memory for it
        try:
            return self._create(directory, trust_known=True)
        except FileNotFoundError:
            # a directory remembered as existing is gone (the cleaner, a hand):
            # forget them all and look at the disk
            self._known.clear()
            return self._create(directory, trust_known=False)

    def settle(self, made: list[Path]) -> None:
        """Make each directory of ``prepare``'s list durable in its parent."""
        for d in made:
            self.sync(d.parent)
            if len(self._known) >= _KNOWN_MAX:
                self._known.clear()  # a hint, bounded: forgetting costs one fsync per level, once
            self._known.add(str(d))

    def _create(self, directory: Path, *, trust_known: bool) -> list[Path]:
        # Every directory between ``directory`` and the root not yet known to
        # be durable: missing ones are made; existing ones are synced in their
        # parent once per process too (another thread may have made one and
        # not synced it yet; an earlier process may have died in between).
        # The root and what is above it, when they exist, are the operator's.
        unsure: list[Path] = []
        d = directory
        while not (trust_known and str(d) in self._known):
            under_root = self._root is None or (d != self._root and self._root in d.parents)
            if not under_root and d.is_dir():
                break
            unsure.append(d)
            if d.parent == d:
                break
            d = d.parent
        for made in reversed(unsure):
            try:
                made.mkdir()
            except FileExistsError:
                pass  # there already (or made by another thread): its entry is synced all the same
        return unsure[::-1]

    def __getstate__(self) -> dict[str, object]:
        raise TypeError("Directories is per process; FileStore builds a new one after unpickling")
