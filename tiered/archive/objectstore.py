"""The cold tier's storage contract: a small object-store interface.

Every object-store call goes through ``ObjectStore.request``: one place that
times it, reports it to the recorder (op, outcome), translates errors into
``StorageError`` (``retriable`` set from the cause) and retries retriable
ones with capped, jittered backoff. Client libraries' own retry loops are
turned off so every retry is seen and counted here.

The stores: ``file://`` in tiered/archive/filestore.py, ``s3://`` in
tiered/archive/s3store.py; ``tiered.archive.storage.open_store`` picks one
for a URL. Keys are relative to the store's root URL and use ``/``.
"""

from __future__ import annotations

import builtins  # ObjectStore.list shadows the builtin inside the class
import errno
import hashlib
import logging
import os
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from tiered.errors import ObjectNotFoundError, PreconditionFailedError, StorageError
from tiered.format.segbuffer import SegmentBuffer
from tiered.recorder import NullRecorder, Recorder

log = logging.getLogger(__name__)

T = TypeVar("T")
DELETE_BATCH = 1000


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 6
    base_delay: float = 0.2
    max_delay: float = 20.0

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Full jitter: uniform in [0, min(max, base * 2**attempt)]."""
        return rng.uniform(0, min(self.max_delay, self.base_delay * (2 ** attempt)))


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    mtime_ms: int
    etag: str | None = None


class ObjectStore:
    """A small object-store contract: get, ranged get, put, conditional put,
    head, list, batched delete. Subclasses implement the ``_raw_*`` methods;
    this class adds timing, metrics, error translation and retries."""

    scheme = "file"

    def __init__(self, root: str, *, retry: RetryPolicy | None = None, recorder: Recorder | None = None) -> None:
        self.root = root.rstrip("/")
        self.retry = retry or RetryPolicy()
        self.recorder: Recorder = recorder or NullRecorder()
        self._rng = random.Random()
        self._sleep: Callable[[float], None] = time.sleep

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.root}"

    # --- the one wrapper -----------------------------------------------------

    def request(self, op: str, key: str, fn: Callable[[], T]) -> T:
        """``fn()``, one store request named ``op`` on ``key``, through the one
        wrapper: timed, recorded, its errors translated and retried as the
        policy says. The contract's methods call it; so does a caller that
        speaks to a store's client itself (the S3 capability probe), so its
        requests are counted and retried like any other."""
        attempt = 0
        while True:
            started = time.perf_counter()
            try:
                result = fn()
            except Exception as exc:  # translated right here, once
                err = self._translate(op, key, exc)
                self.recorder.store_request(op, err.outcome, time.perf_counter() - started)
                if not err.retriable or attempt + 1 >= self.retry.attempts:
                    if err is exc:
                        raise
                    raise err from exc
                self.recorder.store_retry(op)
                delay = self.retry.delay(attempt, self._rng)
                log.warning("retrying %s %s in %.2fs after: %s", op, key, delay, err)
                self._sleep(delay)
                attempt += 1
                continue
            self.recorder.store_request(op, "ok", time.perf_counter() - started)
            return result

    def _translate(self, op: str, key: str, exc: Exception) -> StorageError:
        """``exc`` as a ``StorageError``, by type: the OS's errors here, a
        store client's own errors in that store's override (which falls back
        to this one). Anything else is a bug: raised as it is."""
        if isinstance(exc, StorageError):
            return exc
        if isinstance(exc, FileNotFoundError):
            return ObjectNotFoundError(op, key)
        if isinstance(exc, FileExistsError):
            return PreconditionFailedError(op, key, "object exists")
        if isinstance(exc, PermissionError):
            return StorageError(op, key, "access denied", retriable=False)
        if isinstance(exc, TimeoutError):  # socket.timeout and asyncio's too
            return StorageError(op, key, "timeout", retriable=True, outcome="timeout")
        if isinstance(exc, OSError):  # ConnectionError included
            code = exc.errno
            if code in (errno.ENOSPC, errno.EROFS, errno.EACCES):
                return StorageError(op, key, os.strerror(code), retriable=False)
            if code == errno.EBUSY:
                return StorageError(op, key, "throttled", retriable=True, outcome="throttled")
            return StorageError(op, key, type(exc).__name__, retriable=True)
        raise exc

    # --- the contract --------------------------------------------------------

    def get(self, key: str) -> bytes:
        return self.request("get", key, lambda: self._raw_get(key, None, None))

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of an object."""
        return self.request("get", key, lambda: self._raw_get(key, start, end))

    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        return self.request("get", key, lambda: self._raw_get_etag(key))

    def put(self, key: str, data: bytes | SegmentBuffer, *, crc: int | None = None) -> None:
        """Write ``key`` (whole, or not at all). No ETag: only the conditional
        writes need one, and a file store would have to hash the data for it.
        ``crc``: the data's CRC-32 when the caller has it already (a segment's,
        kept as its records were copied in): a store whose server checks the
        upload against a CRC-32 sends this one instead of reading the data
        again for it, and a server that checks refuses the upload when it is
        wrong (the data changed since it was computed); a file store has no
        use for it."""
        self._before_write()
        if crc is None:
            self.request("put", key, lambda: self._raw_put(key, data))
        else:
            self.request("put", key, lambda: self._raw_put(key, data, crc))

    def put_if_absent(self, key: str, data: bytes) -> str:
        """Create ``key``; PreconditionFailedError when it exists."""
        self._before_write()
        return self.request("put_if_absent", key, lambda: self._raw_put_if(key, data, None))

    def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        """Replace ``key`` only if its current ETag is ``etag``."""
        self._before_write()
        return self.request("put_if_match", key, lambda: self._raw_put_if(key, data, etag))

    def head(self, key: str) -> ObjectInfo | None:
        try:
            return self.request("head", key, lambda: self._raw_head(key))
        except ObjectNotFoundError:
            return None

    def list_keys(self, prefix: str = "") -> list[ObjectInfo]:
        """Every object under ``prefix`` (recursive), fresh (no listing cache)."""
        return self.request("list", prefix, lambda: self._raw_list(prefix))

    def list_dirs(self, prefix: str = "") -> list[str]:
        """Sorted names of the "directories" right under ``prefix`` (one
        delimiter listing where the store has one, never a recursive one)."""
        prefix = prefix.strip("/")
        return self.request("list", prefix or "/", lambda: self._raw_list_dirs(prefix))

    def _raw_list_dirs(self, prefix: str) -> list[str]:
        # any store: derived from a full listing (slow, but correct)
        plen = len(prefix) + 1 if prefix else 0
        return sorted({o.key[plen:].split("/", 1)[0] for o in self._raw_list(prefix + "/" if prefix else "")
                       if "/" in o.key[plen:]})

    def delete_many(self, keys: Iterable[str]) -> int:
        """Delete keys in batches of up to 1000; missing keys count as deleted.
        Returns the number of requests made."""
        keys = list(dict.fromkeys(keys))
        requests = 0
        for i in range(0, len(keys), DELETE_BATCH):
            batch = keys[i:i + DELETE_BATCH]
            self.request("delete", batch[0], lambda: self._raw_delete(batch))  # noqa: B023 - called at once
            requests += 1
        return requests

    def leftovers(self, prefix: str = "") -> builtins.list[ObjectInfo]:
        """Debris of writes that never finished (a crash mid-write) under
        ``prefix``, for the orphan pass to remove after its grace period;
        ``delete_many`` takes their keys. None on a store without any."""
        return []

    # --- implementation hooks --------------------------------------------------

    def _before_write(self) -> None:
        """Run before every write, outside the retry loop: the S3 store's
        capability probe. Nothing to check on a local directory."""

    def _raw_get(self, key: str, start: int | None, end: int | None) -> bytes:
        raise NotImplementedError

    def _raw_get_etag(self, key: str) -> tuple[bytes, str]:
        raise NotImplementedError

    def _raw_put(self, key: str, data: bytes | SegmentBuffer, crc: int | None = None) -> None:
        raise NotImplementedError

    def _raw_put_if(self, key: str, data: bytes, etag: str | None) -> str:
        raise NotImplementedError

    def _raw_head(self, key: str) -> ObjectInfo:
        raise NotImplementedError

    def _raw_list(self, prefix: str) -> builtins.list[ObjectInfo]:
        raise NotImplementedError

    def _raw_delete(self, keys: builtins.list[str]) -> None:
        raise NotImplementedError

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_rng", None)
        state.pop("_sleep", None)
        state["recorder"] = NullRecorder()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._rng = random.Random()
        self._sleep = time.sleep


def md5_etag(data: bytes) -> str:
    """The ETag S3 gives a single-PUT object: its MD5, in hex."""
    return hashlib.md5(data, usedforsecurity=False).hexdigest()
