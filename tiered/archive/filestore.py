"""``file://`` objects: the embedded default cold tier (see
tiered/archive/objectstore.py for the contract it serves)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from pathlib import Path
from typing import Any

from tiered.archive.dirsync import Directories
from tiered.archive.filewrite import FileWriter
from tiered.archive.objectstore import ObjectInfo, ObjectStore, md5_etag
from tiered.errors import PreconditionFailedError
from tiered.format.segbuffer import SegmentBuffer


class FileStore(ObjectStore):
    """``file://`` objects: written to a temp name, fsynced, renamed into place
    and the directory fsynced, so a reader never sees half an object, a crash
    leaves none, and an object a manifest names survives a power loss.

    A segment object's bytes are written around the page cache
    (tiered/archive/filewrite.py); ``direct=False``, or a file system
    refusing O_DIRECT, writes everything through the cache."""

    scheme = "file"

    def __init__(self, root: str, *, direct: bool = True, **kw: Any) -> None:
        super().__init__(os.path.abspath(root), **kw)
        self._writer = FileWriter(self.root, direct=direct)
        self._tls = threading.local()
        # directory fsyncs shared by the writer threads, and the directories
        # known to exist (tiered/archive/dirsync.py)
        self._dirs = Directories(Path(self.root))

    def _path(self, key: str) -> Path:
        if key.startswith("/") or ".." in key.split("/"):
            raise ValueError(f"bad object key {key!r}")
        return Path(self.root) / key

    def _raw_get(self, key: str, start: int | None, end: int | None) -> bytes:
        with open(self._path(key), "rb") as fh:
            if start is None:
                return fh.read()
            fh.seek(start)
            return fh.read(max(0, (end or 0) - start))

    def _raw_get_etag(self, key: str) -> tuple[bytes, str]:
        data = self._path(key).read_bytes()
        return data, md5_etag(data)

    @staticmethod
    def _tmp_name(path: Path) -> Path:
        return path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")

    def _write_tmp(self, path: Path, data: bytes | SegmentBuffer) -> Path:
        tmp = self._tmp_name(path)
        # a directory this process has not made durable yet (another
        # process made it, maybe dying before syncing it) is walked once
        made: list[Path] = [] if self._dirs.known(path.parent) else self._dirs.prepare(path.parent)
        try:
            try:
                self._writer.write(tmp, data)
            except FileNotFoundError:
                # the directory is created on the first write into it only: a
                # mkdir per object costs as much as the write itself (measured
                # at 1,000 queues: 5,000 mkdir calls for 2,000 objects)
                made = self._dirs.prepare(path.parent)
                self._writer.write(tmp, data)
        except BaseException:
            # the temp file of a failed write (half written, maybe) goes at
            # once; one a crash leaves is the orphan pass's (``leftovers``)
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        finally:
            # The new directories are made durable after the file, still before
            # its rename names it: the file's fsync has usually committed their
            # entries on a journaling file system already, so these are cheap.
            # Also when the write failed: a later write into them opens them
            # without making them again, and would never sync them.
            self._dirs.settle(made)
        return tmp

    @property
    def direct(self) -> bool:
        """Whether big page-aligned objects are written with O_DIRECT (no more
        once the file system refused it)."""
        return self._writer.direct

    def _raw_put(self, key: str, data: bytes | SegmentBuffer, crc: int | None = None) -> None:
        path = self._path(key)
        os.replace(self._write_tmp(path, data), path)
        # the object is durable once its name is: a manifest committed after
        # this call may name it, so the rename must survive a power loss
        self._dirs.sync(path.parent)

    def _raw_put_if(self, key: str, data: bytes, etag: str | None) -> str:
        path = self._path(key)
        tmp = self._write_tmp(path, data)
        try:
            if etag is None:
                os.link(tmp, path)  # atomic create-if-absent: FileExistsError if present
                self._dirs.sync(path.parent)
                return md5_etag(data)
            while True:
                fd = os.open(path, os.O_RDONLY)  # FileNotFoundError: no such object
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX)
                    held = os.fstat(fd)
                    # the file may have been replaced while we waited for the lock
                    if held.st_ino != os.stat(path).st_ino:
                        continue
                    current = md5_etag(os.pread(fd, held.st_size, 0))
                    if current != etag:
                        raise PreconditionFailedError("put_if_match", key)
                    os.replace(tmp, path)
                    self._dirs.sync(path.parent)
                    return md5_etag(data)
                finally:
                    os.close(fd)
        finally:
            # linked (its name stays), refused, or already renamed into place
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()

    def _raw_head(self, key: str) -> ObjectInfo:
        st = self._path(key).stat()
        return ObjectInfo(key, st.st_size, st.st_mtime_ns // 1_000_000)

    def _raw_list(self, prefix: str) -> list[ObjectInfo]:
        base = Path(self.root)
        top = base / prefix if prefix else base
        if prefix.endswith("/") and not top.is_dir():
            # keys under "x/" are files under directory x: none without it (a
            # queue archived for the first time must not walk its 999 siblings)
            return []
        start = top if top.is_dir() else top.parent
        out: list[ObjectInfo] = []
        for dirpath, dirs, files in os.walk(start):
            # only directories that can hold keys with the prefix: listing one
            # queue must not walk its 999 siblings
            rel = os.path.relpath(dirpath, base)
            rel = "" if rel == "." else rel.replace(os.sep, "/") + "/"
            dirs[:] = [d for d in dirs if (rel + d + "/").startswith(prefix) or prefix.startswith(rel + d + "/")
                       or (rel + d).startswith(prefix)]
            for name in files:
                if name.startswith("."):
                    continue  # temp files of writes in flight
                full = Path(dirpath) / name
                key = full.relative_to(base).as_posix()
                if not key.startswith(prefix):
                    continue
                try:
                    st = full.stat()
                except FileNotFoundError:
                    continue
                out.append(ObjectInfo(key, st.st_size, st.st_mtime_ns // 1_000_000))
        out.sort(key=lambda o: o.key)
        return out

    def leftovers(self, prefix: str = "") -> list[ObjectInfo]:
        """Temporary files of writes a crash interrupted (``_write_tmp``): a
        walk of the local directory tree, not a request, so it is not counted."""
        base = Path(self.root)
        top = base / prefix if prefix else base
        out: list[ObjectInfo] = []
        for dirpath, _dirs, files in os.walk(top if top.is_dir() else top.parent):
            for name in files:
                if name.startswith(".") and name.endswith(".tmp"):
                    full = Path(dirpath) / name
                    try:
                        st = full.stat()
                    except FileNotFoundError:
                        continue
                    out.append(ObjectInfo(full.relative_to(base).as_posix(), st.st_size,
                                          st.st_mtime_ns // 1_000_000))
        return out

    def _raw_list_dirs(self, prefix: str) -> list[str]:
        base = Path(self.root) / prefix if prefix else Path(self.root)
        try:
            return sorted(e.name for e in os.scandir(base) if e.is_dir() and not e.name.startswith("."))
        except FileNotFoundError:
            return []

    def _raw_delete(self, keys: list[str]) -> None:
        for key in keys:
            try:
                self._path(key).unlink()
            except FileNotFoundError:
                pass

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._tls = threading.local()
        self._dirs = Directories(Path(self.root))

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.pop("_tls", None)
        state.pop("_dirs", None)
        return state
